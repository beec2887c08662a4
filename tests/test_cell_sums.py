"""Tests for calibration.cell_sums: a chunk's sums of every cell at once, equal to a cell at a time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.estimators.calibration import events, metrics
from dspark_obs.estimators.calibration.cell_sums import CellBins, add_events

SPECS = {name: metrics.parse_binning(name) for name in metrics.BINNINGS}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0, 0.5, 1e-8, 1 - 1e-8, 0.25])),
                min_size=1, max_size=300),
       st.integers(1, 4), st.integers(2, 40), st.integers(0, 2**31))
def test_cell_bins_are_each_cell_s_own_bin_ids(values, n_cells, n_bins, seed):
    """Looked up by table or searched near an edge, a value's bin is what bin_ids gives it with its cell's
    edges (edges on values, repeated edges, values of 0 and 1 included)."""
    rng = np.random.default_rng(seed)
    p = np.asarray(values)
    cell = rng.integers(0, n_cells, p.size)
    edges = [metrics.bin_edges(np.clip(p[cell == c] if (cell == c).any() else p, 1e-8, 1 - 1e-8), n_bins, "quantile")
             for c in range(n_cells)]
    got = CellBins(edges, "quantile")(p, cell)
    expected = [int(metrics.bin_ids(p[i:i + 1], edges[cell[i]], "quantile")[0]) for i in range(p.size)]
    assert got.tolist() == expected
    uniform = [metrics.bin_edges(p, n_bins, "uniform")] * n_cells
    assert CellBins(uniform, "uniform")(p, cell).tolist() == metrics.bin_ids(p, uniform[0], "uniform").tolist()


def _events(seed: int, *, n_requests: int = 40, gamma: int = 4) -> events.RunEvents:
    """Steps of a few requests in request order, each request in one workload; NaN labels and predictions
    here and there, as a compact run's censored tails and a step without confidences leave them."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(1, 12, n_requests)
    rid = np.repeat([f"r{i:03d}" for i in range(n_requests)], steps).astype(object)
    workload = np.repeat(rng.choice(["chat", "code", "math"], n_requests), steps).astype(object)
    n = rid.size
    survival = np.cumprod(rng.uniform(0.5, 1.0, (n, gamma)), axis=1)
    y = (rng.random((n, gamma)) < survival).astype(np.float64)
    y[rng.random((n, gamma)) < 0.2] = np.nan
    survival[rng.random(n) < 0.05] = np.nan
    return events.RunEvents("run", "observed", "compact", gamma, "observed", rid, workload, np.zeros(n, np.int64),
                            np.arange(n), survival, survival.copy(), y)


def _edges(ev: events.RunEvents):
    p = np.clip(ev.survival[~np.isnan(ev.survival)], 1e-8, 1 - 1e-8)
    return lambda w, k, name: metrics.bin_edges(p, *SPECS[name])


def _cells(ev: events.RunEvents, n_bootstrap: int) -> dict:
    cells: dict = {}
    add_events([(cells, ev, _edges(ev))], SPECS, n_bootstrap, 5)
    return cells


@pytest.mark.parametrize("n_bootstrap", [0, 20])
def test_steps_out_of_request_order_give_the_same_cells(n_bootstrap):
    """Rows of a request apart (the slow path that numbers requests by hashing) add to the cells what rows in
    request order add (up to the order of float additions)."""
    ev = _events(1)
    order = np.random.default_rng(2).permutation(len(ev.rid))
    shuffled = events.RunEvents(*(getattr(ev, f) for f in ("run_id", "labels", "mode", "gamma", "label_source")),
                                *(getattr(ev, f)[order] for f in ("rid", "workload", "dp_rank", "forward_ct",
                                                                  "survival", "confidence", "y")))
    a, b = _cells(ev, n_bootstrap), _cells(shuffled, n_bootstrap)
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        assert (x.n, x.n_requests) == (y.n, y.n_requests), key
        np.testing.assert_allclose([x.p_sum, x.y_sum, x.sq_sum, x.log_sum, *x.clustered],
                                   [y.p_sum, y.y_sum, y.sq_sum, y.log_sum, *y.clustered], rtol=1e-12)
        for name in x.bins:
            np.testing.assert_allclose(x.bins[name], y.bins[name], rtol=1e-12)
        assert x.boot.keys() == y.boot.keys()
        for name in x.boot:
            np.testing.assert_allclose(x.boot[name], y.boot[name], rtol=1e-12)


@pytest.mark.parametrize("shuffle", [False, True])
def test_integer_codes_of_rids_and_workloads_give_the_cells_strings_give(shuffle):
    """Events that carry codes of their rids and workloads (as the reader numbers them: any numbers, equal for
    equal values) add exactly what the strings alone add, in request order and with rows apart."""
    import dataclasses

    ev = _events(4)
    if shuffle:
        order = np.random.default_rng(9).permutation(len(ev.rid))
        ev = dataclasses.replace(ev, **{f: getattr(ev, f)[order] for f in ("rid", "workload", "dp_rank", "forward_ct",
                                                                            "survival", "confidence", "y")})
    names = {r: i for i, r in enumerate(sorted(set(ev.rid), reverse=True))}
    coded = dataclasses.replace(ev, rid_code=np.array([7 * names[r] + 3 for r in ev.rid]),
                                workload_code=np.array([{"chat": 5, "code": 0, "math": 2}[w] for w in ev.workload]))
    a, b = _cells(ev, 20), _cells(coded, 20)
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        assert (x.n, x.n_requests, x.p_sum, x.y_sum, x.sq_sum, x.log_sum) == \
            (y.n, y.n_requests, y.p_sum, y.y_sum, y.sq_sum, y.log_sum), key
        for name in x.bins:
            np.testing.assert_array_equal(x.bins[name], y.bins[name])
        for name in x.boot:
            np.testing.assert_array_equal(x.boot[name], y.boot[name])


def test_a_cell_holds_its_steps_sums_and_the_all_workloads_cell_adds_its_workloads():
    """Against a cell at a time: each workload's counts, sums and bins are those of its own steps; the
    all-workloads cell's are the run's, and its equal-mass bins are counted with its own edges."""
    ev = _events(3)
    cells = _cells(ev, 0)
    edges = _edges(ev)
    for w in ("*", "chat", "code", "math"):
        rows = np.ones(len(ev.rid), bool) if w == "*" else ev.workload == w
        for k in range(ev.gamma):
            y, p = ev.y[rows, k], ev.survival[rows, k]
            ok = ~np.isnan(y) & ~np.isnan(p)
            y, p = y[ok], np.clip(p[ok], 0, 1)
            cell = cells[(w, k)]
            assert cell.n == y.size and cell.n_requests == len(set(ev.rid[rows][ok]))
            assert cell.y_sum == pytest.approx(y.sum()) and cell.p_sum == pytest.approx(p.sum())
            for name, (n_bins, strategy) in SPECS.items():
                b = metrics.binned(y, p, n_bins, strategy, edges=edges(w, k, name))
                np.testing.assert_array_equal(cell.bins[name][0], b.count)
                np.testing.assert_allclose(cell.bins[name][1], b.pred_sum, rtol=1e-12)
                np.testing.assert_allclose(cell.bins[name][2], b.true_sum, rtol=1e-12)


def test_resampled_counts_in_float32_equal_float64_and_each_cell_is_its_requests_reweighted(monkeypatch):
    """The bootstrap's counts multiplied in float32 (exact below 2^24) equal the float64 product bit for bit;
    every resampled sum of a workload's cell is ``weights @ RequestSums.columns`` of its steps."""
    from dspark_obs.estimators import stats as bootstrap
    from dspark_obs.estimators.calibration import cell_sums
    from dspark_obs.estimators.calibration.resampling import RequestSums

    ev = _events(7)
    fast = _cells(ev, 40)
    monkeypatch.setattr(cell_sums, "EXACT_FLOAT32", 0)   # every product in float64
    slow = _cells(ev, 40)
    edges = _edges(ev)
    for key, cell in fast.items():
        for name in cell.boot:
            np.testing.assert_array_equal(cell.boot[name], slow[key].boot[name])
    w, k = "code", 2
    rows = ev.workload == w
    y, p, rid = ev.y[rows, k], ev.survival[rows, k], ev.rid[rows]
    ok = ~np.isnan(y) & ~np.isnan(p)
    names, g = np.unique(rid[ok], return_inverse=True)
    weights = bootstrap.poisson_weights(bootstrap.run_unit_keys("run", list(names)), 40, 5)
    for name in SPECS:
        sums = RequestSums(y[ok], np.clip(p[ok], 0, 1), g, n_groups=names.size, binning=name,
                           edges=edges(w, k, name))
        np.testing.assert_allclose(fast[(w, k)].boot[name], weights @ sums.columns(), rtol=1e-12, atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0, 0.5, 1e-8, 1 - 1e-8, 0.25])),
                min_size=0, max_size=300),
       st.integers(1, 4), st.integers(2, 40), st.integers(1, 6), st.sampled_from(["quantile", "uniform"]),
       st.integers(0, 2**31))
def test_cell_bins_sums_are_the_counts_of_their_bins_bit_for_bit(values, n_cells, n_bins, groups, strategy, seed):
    """The compiled pass gives request_bins of the bins CellBins finds: counts and sums in the order of the
    values (so the same float sums as np.bincount's), for keys and cells in any order."""
    rng = np.random.default_rng(seed)
    p = np.asarray(values, dtype=np.float64)
    cell, key, y = rng.integers(0, n_cells, p.size), rng.integers(0, groups, p.size), rng.random(p.size)
    edges = [metrics.bin_edges(np.clip(p[cell == c] if (cell == c).any() else np.array([0.3, 0.6]), 1e-8, 1 - 1e-8),
                               n_bins, strategy) for c in range(n_cells)]
    binner = CellBins(edges, strategy)
    want = np.stack(metrics.request_bins(key, binner(p, cell), p, y, groups, n_bins))
    got = binner.sums(p, cell, key, y, groups)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()
    rows = np.flatnonzero(rng.random(p.size) < 0.6)   # some rows only: as if the arrays were taken at them
    taken = binner.sums(p[rows], cell[rows], key[rows], y[rows], groups)
    assert binner.sums(p, cell, key, y, groups, at=rows).tobytes() == taken.tobytes()


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 400), st.integers(1, 8), st.integers(1, 12), st.integers(0, 2**31))
def test_a_kinds_step_sums_are_numpy_s_counts_bit_for_bit(n, cells, units, seed):
    """The compiled pass of a kind's per-cell and per-unit sums adds what ``np.bincount`` adds, in its order."""
    from dspark_obs.estimators.calibration.cell_sums import _step_sums
    from dspark_obs.estimators.compiled import jit

    rng = np.random.default_rng(seed)
    p = rng.random(n)
    y = rng.choice([0.0, 1.0, np.nan, 0.37], n, p=[0.4, 0.4, 0.1, 0.1] if seed % 2 else [0.5, 0.4, 0.1, 0.0])
    pc = np.clip(p, metrics.EPS_PROB, 1 - metrics.EPS_PROB)
    cell, unit = rng.integers(0, cells, n), rng.integers(0, units, n)
    at = np.flatnonzero(~np.isnan(y) & (rng.random(n) < 0.9))
    per_cell, per_unit, whole = jit(_step_sums)(at, p, y, np.log(pc), np.log1p(-pc), cell, unit, cells, units)
    yt, pt = y[at], p[at]
    want_cell = [np.bincount(cell[at], weights=pt, minlength=cells),
                 np.bincount(cell[at], weights=yt * np.log(pc)[at] + (1.0 - yt) * np.log1p(-pc)[at], minlength=cells)]
    want_unit = [np.bincount(unit[at], minlength=units).astype(np.float64),
                 np.bincount(unit[at], weights=(pt - yt) ** 2, minlength=units),
                 np.bincount(unit[at], weights=yt, minlength=units)]
    assert per_cell.tobytes() == np.stack(want_cell).tobytes() and per_unit.tobytes() == np.stack(want_unit).tobytes()
    assert whole == bool(np.all((yt == 0.0) | (yt == 1.0)))


def test_cell_bins_sums_refuse_a_key_outside_the_groups():
    binner = CellBins([np.linspace(0, 1, 5)], "uniform")
    with pytest.raises(ValueError, match="indices"):
        binner.sums(np.array([0.5]), np.array([0]), np.array([3]), np.array([1.0]), 3)


@pytest.mark.parametrize("cell, key, at", [([0, 2], [0, 0], None), ([0, -1], [0, 0], None), ([0, 1], [0, 1], None),
                                           ([0, 1], [0, 0], [0, 2]), ([0, 1], [0, 0], [-1])])
def test_the_compiled_passes_refuse_an_index_outside_its_range(cell, key, at):
    """A cell, key or row out of range is an error, never a read or write beside the arrays."""
    from dspark_obs.estimators.calibration.cell_sums import _step_sums
    from dspark_obs.estimators.compiled import jit

    binner = CellBins([np.array([0, .3, .6, 1.0]), np.array([0, .2, .5, 1.0])], "quantile")
    p, y = np.array([0.1, 0.5]), np.array([1.0, 0.0])
    rows = None if at is None else np.array(at)
    with pytest.raises(ValueError, match="indices"):
        binner.sums(p, np.array(cell), np.array(key), y, 1, at=rows)
    with pytest.raises(ValueError, match="indices"):
        jit(_step_sums)(np.arange(2) if rows is None else rows, p, y, p, p, np.array(cell), np.array(key), 2, 1)
