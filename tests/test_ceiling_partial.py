"""The validation's bins of a run split over processes: ranked on the driver from each piece's ``mid`` and run
order, summed where the pieces stayed, they give the rows of the whole run's steps in one place."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_obs.estimators.ceiling import validation
from dspark_obs.estimators.ceiling.partial import RunPartial


def _piece(rng, name, first: int, n: int) -> dict:
    lo = rng.random(n) * 3
    mid = np.round(lo + rng.random(n), 1)          # ties across pieces: the run order decides their bins
    truth = np.where(rng.random(n) < 0.2, np.nan, rng.integers(0, 6, n)).astype(np.float32)
    return {"lo": lo, "mid": mid, "hi": mid + rng.random(n), "truth": truth,
            "emu": (rng.random(n) * 6).astype(np.float32), "greedy": rng.random(n) < 0.5,
            "order": np.sort(first + rng.integers(0, 5, n)), "piece": name}


@pytest.mark.parametrize("seed", range(4))
def test_bins_summed_where_the_pieces_stayed_equal_the_bins_of_every_step_in_one_place(seed):
    rng = np.random.default_rng(seed)
    pieces = [_piece(rng, ("w", i), first, int(rng.integers(0, 400)))
              for i, first in enumerate(rng.permutation(6) * 10)]   # dealt: not in run order
    if seed == 3:   # one piece's steps out of request order: the whole run is put in order first
        pieces[0]["order"] = pieces[0]["order"][::-1].copy()
    every = np.ones(1, bool)
    all_steps = validation.stat_sums(np.ones(1), np.ones(1), np.ones(1), np.ones(1), np.ones(1), every, every)
    groups = {("overall", "*"): all_steps}
    whole = RunPartial(all_sums=all_steps, groups=groups, known=[dict(p) for p in pieces])
    want = whole.validation_rows()

    split = RunPartial(all_sums=all_steps, groups=groups,
                       known=[{k: p[k] for k in ("mid", "order", "piece")} for p in pieces])
    codes, n_bins = split.bin_codes()
    assert n_bins == 8 and sorted(codes) == sorted(p["piece"] for p in pieces if len(p["mid"]))
    shares = [validation.bin_sums(p["lo"], p["mid"], p["hi"], p["truth"], p["emu"], p["greedy"], codes[p["piece"]], n_bins)
              for p in pieces if p["piece"] in codes]
    split.bins = sum(shares[1:], shares[0])
    got = split.validation_rows()
    bins = [r for r in want if r["group_kind"] == "bin"]
    assert len(bins) == 8 and [r["n"] + r["emu_n"] for r in bins] == [r["n"] + r["emu_n"] for r in got[2:]]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key, value in w.items():
            assert g[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key
