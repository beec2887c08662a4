"""Tests for calibration.chunks: calibrate_run over chunks of requests equals one pass."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dspark_obs import sql
from dspark_obs.estimators import calibration as cal
from dspark_obs.estimators import stats as bootstrap
from dspark_obs.estimators.calibration.chunks import COUNT_CHUNKS, plan_run
from dspark_obs.estimators.ceiling import estimate_run
from dspark_obs.store import Store

FLOATS = {"mean_predicted", "observed_rate", "ece", "ece_ci_lo", "ece_ci_hi", "debiased_ece", "mce", "brier",
          "log_loss", "auroc_se", "observed_rate_se"}


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Store:
    from bench.gen_store import generate

    root = tmp_path_factory.mktemp("cal-chunks")
    generate(root, rows=5000, seed=4)
    store = Store(root)
    estimate_run(store, "bench", n_bootstrap=0)
    return store


def _compare(one, many, *, exact: set[str]) -> None:
    assert one.num_rows == many.num_rows and one.column_names == many.column_names
    for name in one.column_names:
        x, y = one.column(name).to_pylist(), many.column(name).to_pylist()
        if name in exact or name not in FLOATS:
            assert x == y, name
        else:  # a CI is None without a bootstrap: compare where the missing values are, then the values
            assert [v is None for v in x] == [v is None for v in y], name
            xs, ys = [v for v in x if v is not None], [v for v in y if v is not None]
            assert xs == pytest.approx(ys, rel=1e-11, abs=1e-13, nan_ok=True), name


@pytest.mark.parametrize("labels, n_bootstrap", [("observed", 30), ("reconstructed", 30), ("observed", 0)])
def test_chunks_give_one_pass_figures(generated, labels, n_bootstrap):
    one = cal.calibrate_run(generated, "bench", labels=labels, n_bootstrap=n_bootstrap, write=False)
    seen = []
    many = cal.calibrate_run(generated, "bench", labels=labels, n_bootstrap=n_bootstrap, write=False,
                             chunk_rows=600, progress=lambda done, total: seen.append(done))
    assert len(seen) >= 8 and seen == sorted(seen)
    # counts, AUROC and bin edges exactly (the sample holds the whole run); sums up to addition order
    _compare(one.summary, many.summary, exact={"auroc", "n", "n_requests"})
    _compare(one.bins, many.bins, exact={"bin_lo", "bin_hi", "count"})
    # every resample's figures too (the report's intervals and drift tests come from them)
    cells = sum(n > 0 for n in one.summary.column("n").to_pylist())   # each binning of each cell with steps
    assert one.resamples.num_rows == cells * n_bootstrap
    _compare(one.resamples, many.resamples, exact={"resample"})
    assert one.notes == many.notes


def test_a_sample_smaller_than_the_run_only_moves_auroc_and_mass_edges(generated):
    one = cal.calibrate_run(generated, "bench", n_bootstrap=0, write=False)
    many = cal.calibrate_run(generated, "bench", n_bootstrap=0, write=False, chunk_rows=600, sample_rows=1500)
    width = [i for i, b in enumerate(one.summary.column("binning").to_pylist()) if b != "mass15"]
    _compare(one.summary.take(width).drop_columns(["auroc", "auroc_se"]),
             many.summary.take(width).drop_columns(["auroc", "auroc_se"]),
             exact={"n", "n_requests"})
    a, b = (np.array(t.column("auroc").to_pylist(), dtype=float) for t in (one.summary, many.summary))
    assert np.nanmax(np.abs(a - b)) < 0.1   # a 30% sample of requests: sampling noise only
    def mass_count(bins):
        return sum(c for c, b in zip(bins.column("count").to_pylist(), bins.column("binning").to_pylist())
                   if b == "mass15")
    assert mass_count(many.bins) == mass_count(one.bins)   # every step is still binned


def test_weights_of_a_chunk_are_the_one_pass_columns():
    units = [f"r{i:04d}" for i in range(300)]
    whole = bootstrap.poisson_weights(bootstrap.unit_keys(units), 150, 7)
    some = [3, 50, 299]
    np.testing.assert_array_equal(bootstrap.poisson_weights(bootstrap.unit_keys([units[i] for i in some]), 150, 7),
                                  whole[:, some])
    assert abs(whole.mean() - 1.0) < 0.02 and abs(whole.var() - 1.0) < 0.05   # Poisson(1)
    # many units: drawn in blocks of resamples inside; any block of rows is the same rows of one pass
    many = bootstrap.unit_keys([f"q{i:05d}" for i in range(5000)])
    one = bootstrap.poisson_weights(many, 120, 7)
    np.testing.assert_array_equal(np.vstack([bootstrap.poisson_weights(many, 40, 7, start=s) for s in (0, 40, 80)]),
                                  one)
    np.testing.assert_array_equal(bootstrap.poisson_weights(many[:300], 120, 7), one[:, :300])


def test_plan_counts_labelled_steps_per_request(generated):
    con = sql.connect(generated.root)
    plan = plan_run(con, "bench", labels="observed", companion=None, chunk_rows=800)
    assert len(plan.chunks) > 5 and plan.labelled == plan.total == int(plan.rid_rows.sum())
    assert plan.rids == sorted(plan.rids) and len(plan.rids) == len(plan.rid_rows) == len(set(plan.rids))
    # every step has a ceiling estimate here: the reconstructed labels are counted on the ceiling, per request
    rec = plan_run(con, "bench", labels="reconstructed", companion=None, chunk_rows=800)
    assert rec.rids == plan.rids and rec.rid_rows.tolist() == plan.rid_rows.tolist() and rec.source == "ceiling"
    with pytest.raises(cal.CalibrationDataError, match="no request-steps for run 'nope'"):
        cal.calibrate_run(con, "nope", chunk_rows=800)
    with pytest.raises(cal.CalibrationDataError, match="no companion step|no cap-accept companion"):
        plan_run(con, "bench", labels="companion", companion=None, chunk_rows=800)


@pytest.mark.parametrize("chunk_rows", [None, 700])
def test_kinds_read_together_give_each_kind_s_own_tables(generated, chunk_rows):
    """Observed and reconstructed labels from one read of each chunk equal each kind calibrated alone."""
    kw = dict(n_bootstrap=25, seed=3, write=False, chunk_rows=chunk_rows, sample_rows=2000)
    both = cal.calibrate_kinds(generated, "bench", ("observed", "reconstructed", "companion"), **kw)
    assert isinstance(both["companion"], cal.CalibrationDataError)   # no companion run: that kind alone fails
    for kind in ("observed", "reconstructed"):
        alone = cal.calibrate_run(generated, "bench", labels=kind, **kw)
        assert both[kind].summary.equals(alone.summary) and both[kind].bins.equals(alone.bins), kind
        assert both[kind].notes == alone.notes


def test_a_ceiling_missing_steps_or_holding_one_twice_still_gives_each_kind_its_own_tables(tmp_path, generated):
    """A ceiling that misses some steps (or holds one twice) still gives each kind its own tables."""
    root = tmp_path / "partial"
    shutil.copytree(generated.root, root)
    store = Store(root)
    ceiling = store.read("ceiling", "bench").drop_columns(["run_id"])
    keep = pc.not_equal(pc.bit_wise_and(ceiling.column("forward_ct"), 7), 3)   # an eighth of the steps lose it
    for table in (ceiling.filter(keep), pa.concat_tables([ceiling, ceiling.slice(0, 40)])):
        store.drop_run("ceiling", "bench")
        store.write("ceiling", "bench", table)
        kw = dict(n_bootstrap=20, seed=1, write=False, chunk_rows=900, sample_rows=1800)
        both = cal.calibrate_kinds(store, "bench", ("observed", "reconstructed"), **kw)
        for kind in ("observed", "reconstructed"):
            alone = cal.calibrate_run(store, "bench", labels=kind, **kw)
            assert both[kind].summary.equals(alone.summary) and both[kind].bins.equals(alone.bins), kind
            assert both[kind].notes == alone.notes



def _per_rid(ev) -> dict:
    """Labelled steps per rid of one pass's events."""
    rids, n = np.unique(np.asarray(ev.rid, dtype=str), return_counts=True)
    return dict(zip(rids.tolist(), n.tolist()))


def test_reconstructed_labels_per_request_are_counted_from_the_estimates(tmp_path, generated):
    """Reconstructed labels per request, taken from the estimates' rids without joining them to the steps,
    are the labelled steps one pass finds, whatever the chunks (a ceiling missing an eighth of the steps)."""
    root = tmp_path / "partial"
    shutil.copytree(generated.root, root)
    store = Store(root)
    ceiling = store.read("ceiling", "bench").drop_columns(["run_id"])
    store.drop_run("ceiling", "bench")
    store.write("ceiling", "bench", ceiling.filter(pc.not_equal(pc.bit_wise_and(ceiling.column("forward_ct"), 7), 3)))
    con = sql.connect(root)
    expected = _per_rid(cal.load_events(con, "bench", labels="reconstructed"))
    for chunk_rows in (60, 3000):
        plan = plan_run(con, "bench", labels="reconstructed", companion=None, chunk_rows=chunk_rows)
        assert dict(zip(plan.rids, plan.rid_rows.tolist())) == expected
        assert plan.labelled == sum(expected.values()) < plan.total


def test_companion_labels_are_counted_per_request_over_ranges_of_chunks(tmp_path, generated):
    """The count of companion labels per request, made over ranges of several chunks, is the labelled steps
    one pass finds, whatever the ranges (a companion that lacks an eighth of the steps)."""
    root = tmp_path / "paired"
    shutil.copytree(generated.root, root)
    store = Store(root)
    steps = store.read("step_reqs", "bench").drop_columns(["run_id"])
    started = store.read("runs", "bench").column("started_at")[0].as_py()
    store.upsert_run("cap", started_at=started, mode="cap-accept", source="emulator",
                     gamma=len(steps.column("draft_tokens")[0]), companion_of="bench")
    store.write("requests", "cap", store.read("requests", "bench").drop_columns(["run_id"]))
    store.write("step_reqs", "cap", steps.filter(pc.not_equal(pc.bit_wise_and(steps.column("forward_ct"), 7), 3)))
    con = sql.connect(root)
    expected = _per_rid(cal.load_events(con, "bench", labels="companion"))
    many = plan_run(con, "bench", labels="companion", companion=None, chunk_rows=60)
    few = plan_run(con, "bench", labels="companion", companion=None, chunk_rows=3000)
    assert len(many.chunks) > 2 * COUNT_CHUNKS and len(few.chunks) == 2 and many.source == "cap"
    for plan in (many, few):
        assert dict(zip(plan.rids, plan.rid_rows.tolist())) == expected
        assert plan.labelled == sum(expected.values()) < plan.total


@pytest.mark.parametrize("chunk_rows", [600, 1_000_000])
def test_a_run_without_confidences_is_refused_with_the_fix(tmp_path, generated, chunk_rows):
    """Whatever the chunk size asked, a run whose steps carry no confidence or survival says so and names
    the fix (it has no steps to chunk: the plan falls to one pass, which finds it)."""
    root = tmp_path / "no-head"
    shutil.copytree(generated.root, root)
    store = Store(root)
    reqs = store.read("step_reqs", "bench").drop_columns(["run_id"])
    for name in ("confidence", "survival"):
        reqs = reqs.set_column(reqs.schema.get_field_index(name), name, pa.nulls(reqs.num_rows, reqs.schema.field(name).type))
    store.drop_run("step_reqs", "bench")
    store.write("step_reqs", "bench", reqs)
    with pytest.raises(cal.CalibrationDataError, match="recorded no confidence or survival"):
        cal.calibrate_run(store, "bench", labels="observed", n_bootstrap=0, write=False, chunk_rows=chunk_rows)


def test_estimates_are_matched_to_steps_on_rid_step_and_anchor_as_the_inner_join_matches_them():
    from dspark_obs.estimators.calibration.events import with_estimates

    steps = pa.table({"rid": ["a", "a", "b", None, "c"], "forward_ct": [1, 2, 1, 1, 7],
                      "prefix_len": [10, 12, 20, 5, 30], "verify_len": [2, 2, 2, 2, 2]})
    estimates = pa.table({"rid": ["b", "a", "a", "z", "c"], "forward_ct": [1, 2, 1, 1, 7],
                          "prefix_len": [20, 12, 10, 5, 31],           # c's anchor differs: no match
                          "mid": [0.5, 2.0, 1.0, 3.0, 1.5],
                          "survival_mid": pa.array([[0.5], [1.0], [1.0], [1.0], [0.7]], pa.list_(pa.float32()))})
    got = with_estimates(steps, estimates)
    assert got.column("has_estimate").to_pylist() == [True, True, True, False, False]
    assert got.column("mid").to_pylist() == [1.0, 2.0, 0.5, None, None]
    assert got.column("survival_mid").to_pylist() == [[1.0], [1.0], [0.5], None, None]
    assert got.select(steps.column_names).equals(steps)                 # the steps as they came
    twice = pa.concat_tables([estimates, estimates.slice(0, 1)])
    assert with_estimates(steps, twice) is None                          # a step with two estimates
