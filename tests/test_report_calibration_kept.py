"""The report's calibration intervals and drift tests from what ``calibrate`` kept equal those from the events.

``calibrate`` keeps each bootstrap resample's figures (``calibration_resamples``) and AUROC's and the
acceptance's clustered SEs; the report draws its intervals and drift tests from them instead of reading
every step again.  Where they cannot serve (here: deleted, as in a store calibrated before they were
kept) it resamples the events with the same per-rid weights, so both ways give the same figures: one
run calibrated in chunks, its baseline in one pass.
"""

from __future__ import annotations

import math
import shutil

import pytest

from dspark_obs import sql
from dspark_obs.estimators import calibration as cal
from dspark_obs.estimators.ceiling import estimate_run
from dspark_obs.report.calibration import calibration_section
from dspark_obs.report.inputs import read_runs
from dspark_obs.report.thresholds import load_thresholds
from dspark_obs.store import Store

BOOT = 40
RUNS = ("bench", "base")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    from bench.gen_store import generate

    root = tmp_path_factory.mktemp("kept")
    generate(root, rows=6000, seed=5)
    for table in ("runs", "steps", "step_reqs", "requests", "tokens"):   # a second run: the baseline
        shutil.copytree(root / table / "run_id=bench", root / table / "run_id=base")
    store = Store(root)
    for run in RUNS:
        estimate_run(store, run, n_bootstrap=0)
    cal.calibrate_run(store, "bench", labels="reconstructed", n_bootstrap=BOOT, chunk_rows=700)   # chunks
    cal.calibrate_run(store, "base", labels="reconstructed", n_bootstrap=BOOT)                     # one pass
    return store


def _figures(store: Store) -> dict:
    con = sql.connect(store.root)
    runs = {r.run_id: r for r in read_runs(con, store.root)}
    th = load_thresholds(None).with_overrides(n_bootstrap=BOOT)
    section = calibration_section(con, [runs["bench"]], {"bench": [runs["base"]]}, th)
    return {f.key: f for f in section.figures}


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))


def test_kept_resamples_give_the_figures_the_events_give(store, monkeypatch):
    from dspark_obs.report import calibration as section

    def no_events(*args, **kwargs):
        raise AssertionError("the events were read although calibrate kept what the section needs")

    with monkeypatch.context() as m:
        m.setattr(section, "_events", no_events)
        kept = _figures(store)
    assert sql.connect(store.root).sql("SELECT count(*) FROM calibration_resamples").fetchall()[0][0] > 0
    for run in RUNS:
        store.drop_run("calibration_resamples", run)
    from_events = _figures(store)
    assert kept.keys() == from_events.keys() and len(kept) >= 5 * 6
    drifted = 0
    for key, a in kept.items():
        b = from_events[key]
        assert _same(a.value, b.value) and _same(a.ci_low, b.ci_low) and _same(a.ci_high, b.ci_high), key
        assert a.ci_low is not None and a.ci_low <= a.value <= a.ci_high, key
        for attr in ("baseline_value", "delta", "p_value"):
            assert _same(getattr(a.drift, attr), getattr(b.drift, attr)), (key, attr)
        assert _same(a.drift.baseline_ci and a.drift.baseline_ci[0], b.drift.baseline_ci and b.drift.baseline_ci[0])
        drifted += a.drift.p_value is not None
    assert drifted == len(kept)   # every figure was tested against the baseline
