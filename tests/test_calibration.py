"""Tests for dspark_obs.estimators.calibration: metrics, labels, the thin layer, the CLI."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss as sk_brier
from sklearn.metrics import log_loss as sk_log_loss
from sklearn.metrics import roc_auc_score

from dspark_obs import sql
from dspark_obs.estimators import stats as bootstrap
from dspark_obs.estimators import calibration as cal
from dspark_obs.estimators.calibration import events, metrics
from dspark_obs.estimators.run_requests import RunRequests
from dspark_obs.report.stats import Z95
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


# -- independent reference implementations -------------------------------------------


def loop_ece(y, p, n_bins=15, edges=None):
    """ECE as a plain loop: SGLang's binning (clamp 1e-8, floor(p * n)) or given edges."""
    count, psum, ysum = [0] * n_bins, [0.0] * n_bins, [0.0] * n_bins
    for yi, pi in zip(y, p):
        pi = min(max(float(pi), 1e-8), 1 - 1e-8)
        if edges is None:
            b = min(int(pi * n_bins), n_bins - 1)
        else:
            b = sum(1 for e in edges[1:-1] if e < pi)
        count[b] += 1
        psum[b] += pi
        ysum[b] += float(yi)
    return sum(abs(psum[b] - ysum[b]) for b in range(n_bins)) / len(y)


def random_case(seed, n=500, ties=False):
    rng = np.random.default_rng(seed)
    p = rng.beta(2, 2, size=n)
    if ties:
        p = np.round(p, 1)
    y = (rng.random(n) < p ** 1.3).astype(int)
    return y, p


# -- metrics against scikit-learn and loops ----------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_sklearn_on_random_inputs(seed):
    y, p = random_case(seed)
    assert cal.brier_score_loss(y, p) == pytest.approx(sk_brier(y, p), abs=1e-12)
    assert cal.log_loss(y, p) == pytest.approx(sk_log_loss(y, p), abs=1e-12)
    assert cal.auroc_score(y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)


def test_auroc_handles_ties_like_sklearn():
    y, p = random_case(5, ties=True)
    assert len(np.unique(p)) < 15
    assert cal.auroc_score(y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert cal.auroc_score([0, 1], [0.5, 0.5]) == 0.5
    assert cal.auroc_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
@pytest.mark.parametrize("n_bins", [5, 15, 20])
def test_reliability_curve_matches_sklearn_calibration_curve(strategy, n_bins):
    y, p = random_case(n_bins)
    curve = cal.reliability_curve(y, p, n_bins=n_bins, strategy=strategy)
    prob_true, prob_pred = calibration_curve(y, p, n_bins=n_bins, strategy=strategy)
    np.testing.assert_allclose(curve.observed_rate, prob_true, atol=1e-9)
    np.testing.assert_allclose(curve.mean_predicted, prob_pred, atol=1e-7)
    assert curve.count.sum() == len(y)
    np.testing.assert_allclose(curve.bin_center, (curve.bin_lo + curve.bin_hi) / 2)


@pytest.mark.parametrize("n_bins", [1, 15, 20])
@pytest.mark.parametrize("seed", [0, 7])
def test_ece_equals_plain_loop(n_bins, seed):
    y, p = random_case(seed, n=300)
    assert cal.expected_calibration_error(y, p, n_bins=n_bins) == pytest.approx(loop_ece(y, p, n_bins), abs=1e-12)
    edges = np.percentile(np.clip(p, 1e-8, 1 - 1e-8), np.linspace(0, 100, n_bins + 1))
    got = cal.expected_calibration_error(y, p, n_bins=n_bins, strategy="quantile")
    assert got == pytest.approx(loop_ece(y, p, n_bins, edges), abs=1e-12)


def test_hand_computed_values():
    y, p = [0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3]
    # each sample alone in its 15-bin: (0.1 + 0.1 + 0.2 + 0.3) / 4
    assert cal.expected_calibration_error(y, p) == pytest.approx(0.175)
    assert cal.maximum_calibration_error(y, p) == pytest.approx(0.3)
    # two bins: [0.1, 0.3] -> |0.2 - 0| ; [0.8, 0.9] -> |0.85 - 1|
    assert cal.expected_calibration_error(y, p, n_bins=2) == pytest.approx((2 * 0.2 + 2 * 0.15) / 4)
    assert cal.brier_score_loss([0, 1], [0.2, 0.6]) == pytest.approx(0.1)
    # an edge goes to the bin above (SGLang's floor(p * n)): 0.5 with 2 bins is in bin 1
    assert cal.reliability_curve([1], [0.5], n_bins=2).bin.tolist() == [1]


def test_soft_labels_are_accepted_and_consistent():
    p = np.array([0.2, 0.7, 0.9])
    y = np.array([0.0, 0.5, 1.0])
    assert cal.brier_score_loss(y, p) == pytest.approx(np.mean((p - y) ** 2))
    # an AUROC with soft labels splits a sample into weighted positive and negative halves
    assert 0.0 <= cal.auroc_score(y, p) <= 1.0
    assert cal.auroc_score([0.0, 1.0], [0.1, 0.9]) == 1.0


# -- edge cases ------------------------------------------------------------------------


def test_all_same_labels_give_nan_auroc_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # documented NaN, not a warning: every step survived is a valid state
        assert math.isnan(cal.auroc_score([1, 1, 1], [0.2, 0.5, 0.9]))
        assert math.isnan(cal.auroc_score([0, 0], [0.2, 0.5]))
    assert cal.expected_calibration_error([1, 1, 1], [1.0, 1.0, 1.0]) == pytest.approx(1e-8)


def test_empty_bins_are_skipped():
    y, p = [1, 0, 1], [0.95, 0.05, 0.96]
    curve = cal.reliability_curve(y, p, n_bins=20)
    assert curve.bin.tolist() == [1, 19]
    assert curve.count.tolist() == [1, 2]
    assert cal.expected_calibration_error(y, p, n_bins=20) == pytest.approx((0.05 + 0.09) / 3)
    assert cal.maximum_calibration_error(y, p, n_bins=20) == pytest.approx(0.05)
    # equal-mass bins on heavily tied predictions: duplicate edges leave bins empty
    assert cal.expected_calibration_error([0, 1, 1, 1], [0.5] * 4, strategy="quantile") == pytest.approx(0.25)


def test_probabilities_at_zero_and_one_stay_finite():
    y, p = [1, 0, 1, 0], [1.0, 0.0, 0.0, 1.0]
    assert cal.brier_score_loss(y, p) == pytest.approx(0.5)
    assert cal.log_loss(y, p) == pytest.approx(-0.5 * math.log(1e-8), rel=1e-6)
    assert cal.expected_calibration_error(y, p) == pytest.approx(0.5, abs=1e-7)
    assert cal.log_loss([1, 0], [1.0, 0.0]) == pytest.approx(0.0, abs=1e-7)


def test_empty_input_gives_nan():
    for fn in (cal.expected_calibration_error, cal.maximum_calibration_error, cal.debiased_calibration_error,
               cal.brier_score_loss, cal.log_loss, cal.auroc_score):
        assert math.isnan(fn([], []))
    assert all(math.isnan(x) for x in cal.bootstrap_calibration_error([], [], []))


@pytest.mark.parametrize("call, match", [
    (lambda: cal.expected_calibration_error([0, 1], [0.5, 1.5]), r"y_prob has values outside \[0, 1\]: min 0.5, max 1.5"),
    (lambda: cal.brier_score_loss([0, 2], [0.5, 0.5]), r"y_true has values outside \[0, 1\]"),
    (lambda: cal.log_loss([0, 1, 1], [0.5, 0.5]), r"different lengths: 3 != 2"),
    (lambda: cal.auroc_score([0, 1], [0.5, float("nan")]), r"y_prob has non-finite values \(nan at index 1\)"),
    (lambda: cal.expected_calibration_error([[0, 1]], [[0.5, 0.5]]), r"y_true must be 1-D, got shape \(1, 2\)"),
    (lambda: cal.expected_calibration_error(["a"], [0.5]), r"y_true must be numeric"),
    (lambda: cal.expected_calibration_error([0], [0.5], n_bins=0), r"n_bins must be an integer >= 1, got 0"),
    (lambda: cal.maximum_calibration_error([0], [0.5], strategy="width"), r"strategy must be 'uniform' or 'quantile', got 'width'"),
    (lambda: cal.bootstrap_calibration_error([0, 1], [0.2, 0.3], ["a"]), r"groups must have the length of y_true: 1 != 2"),
    (lambda: cal.bootstrap_calibration_error([0], [0.2], ["a"], n_resamples=0), r"n_resamples must be an integer >= 1"),
    (lambda: cal.bootstrap_calibration_error([0], [0.2], ["a"], confidence_level=95), r"confidence_level must be in \(0, 1\), got 95"),
    (lambda: cal.parse_binning("width0"), r"binning 'width0' is not widthN or massN"),
])
def test_bad_inputs_raise_with_the_bad_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- debiased ECE and the bootstrap ----------------------------------------------------


def test_debiased_ece_equals_kumar_resampling_in_expectation():
    """Closed form == 2 * ECE - mean of Kumar et al.'s Gaussian-resampled ECE (Monte Carlo)."""
    y, p = random_case(3, n=400)
    n_bins = 10
    ids = np.minimum((np.clip(p, 1e-8, 1 - 1e-8) * n_bins).astype(int), n_bins - 1)
    sizes = np.array([np.sum(ids == b) for b in range(n_bins) if np.any(ids == b)])
    rate = np.array([y[ids == b].mean() for b in range(n_bins) if np.any(ids == b)])
    pred = np.array([p[ids == b].mean() for b in range(n_bins) if np.any(ids == b)])
    rng = np.random.default_rng(0)
    draws = rng.normal(rate, np.sqrt(rate * (1 - rate) / sizes), size=(200_000, len(sizes)))
    resampled = (np.abs(draws - pred) @ (sizes / sizes.sum())).mean()
    plugin = cal.expected_calibration_error(y, p, n_bins=n_bins)
    assert cal.debiased_calibration_error(y, p, n_bins=n_bins) == pytest.approx(2 * plugin - resampled, abs=2e-4)


def test_debiased_ece_is_closer_to_zero_on_calibrated_data():
    plugin, debiased = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        p = rng.random(300)
        y = (rng.random(300) < p).astype(float)
        plugin.append(cal.expected_calibration_error(y, p))
        debiased.append(cal.debiased_calibration_error(y, p))
    assert all(d <= pl for d, pl in zip(debiased, plugin))  # E|N(gap, sd)| >= |gap|: never above the plug-in
    assert abs(np.mean(debiased)) < 0.7 * np.mean(plugin)  # measured: 0.034 vs 0.063 (20 samples per bin)


def test_bootstrap_resamples_whole_requests():
    y, p = random_case(4, n=200)
    groups = np.repeat(np.arange(20), 10)
    b = metrics.binned(y, p, 15, "uniform")
    weights = bootstrap.poisson_weights(bootstrap.unit_keys(range(20)), 5, seed=3)
    got = metrics.resampled_ece(weights, groups, b, p, y)
    for row, value in zip(weights, got):  # the same ECE as the explicitly resampled data set
        take = np.concatenate([np.flatnonzero(groups == g).repeat(int(c)) for g, c in enumerate(row)])
        assert value == pytest.approx(loop_ece(y[take], p[take]), abs=1e-12)


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    y, p = random_case(6, n=600)
    groups = np.repeat(np.arange(60), 10)
    a = cal.bootstrap_calibration_error(y, p, groups, seed=1)
    assert a == cal.bootstrap_calibration_error(y, p, groups, seed=1)
    assert a != cal.bootstrap_calibration_error(y, p, groups, seed=2)
    lo, hi = a
    assert lo < cal.expected_calibration_error(y, p) < hi


def test_the_ece_interval_holds_the_estimate_of_a_calibrated_head():
    # Labels drawn from the confidences: the ECE is all sampling noise, and its
    # resamples sit above it -- a percentile interval would miss the estimate.
    rng = np.random.default_rng(1)
    p = rng.random(300)
    y = (rng.random(300) < p).astype(float)
    groups = np.repeat(np.arange(100), 3)
    ece = cal.expected_calibration_error(y, p)
    lo, hi = cal.bootstrap_calibration_error(y, p, groups, n_resamples=400, seed=0)
    b = metrics.binned(y, p, 15, "uniform")
    reps = metrics.resampled_ece(bootstrap.poisson_weights(bootstrap.unit_keys(range(100)), 400, seed=0),
                                  groups, b, p, y)
    assert np.quantile(reps, 0.025) > ece  # the percentile interval's lower end is above the estimate
    half = Z95 * reps.std(ddof=1)
    assert (lo, hi) == pytest.approx((max(0.0, ece - half), ece + half))
    assert lo < ece < hi


# -- labels ------------------------------------------------------------------------------


def test_block_and_observed_events():
    np.testing.assert_array_equal(cal.block_events([0, 2, 3], gamma=3),
                                  [[0, 0, 0], [1, 1, 0], [1, 1, 1]])
    np.testing.assert_allclose(cal.block_events([1.25], gamma=3), [[1, 0.25, 0]])
    y = cal.observed_events([1, 1, 0, 2, 3], [3, 1, 2, 2, 3], gamma=3)
    expected = [[1, 0, 0],           # broke at 2 inside window 3
                [1, np.nan, np.nan],  # censored: window 1 fully accepted
                [0, 0, 0],           # broke at 1: every event false
                [1, 1, np.nan],       # censored at window 2
                [1, 1, 1]]           # full window = gamma: nothing censored
    np.testing.assert_array_equal(y, expected)


# -- the thin layer on a hand-made store -------------------------------------------------

GAMMA = 3


def _req(fct, rid, prefix, window, correct, conf, *, cap_trim=0, drafts=None, survival=True):
    surv = np.cumprod(conf).tolist() if survival else None
    return {"dp_rank": 0, "forward_ct": fct, "segment": 0, "rid": rid, "req_pool_index": 0,
            "prefix_len": prefix, "verify_len": window + 1, "acc_len": correct + 1, "correct_drafts": correct,
            "cap_trim": cap_trim, "bonus_token": 1, "draft_tokens": drafts or [prefix] * GAMMA,
            "confidence": conf, "survival": surv}


# (fct, rid, prefix, window, correct, conf, full-block acceptance or None without a companion step)
STEPS = [
    (1, "a", 10, 3, 1, [0.9, 0.5, 0.5], 1),
    (2, "a", 12, 1, 1, [0.8, 0.8, 0.8], 3),
    (1, "b", 20, 2, 0, [0.6, 0.5, 0.5], 0),
    (2, "b", 21, 2, 2, [0.7, 0.9, 0.6], 2),
    (3, "b", 24, 2, 2, [0.9, 0.9, 0.9], None),
]


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path)
    s.upsert_run("cmp", started_at=T0, source="emulator", mode="compact", gamma=GAMMA, server_info="{}")
    s.upsert_run("cap", started_at=T0, source="emulator", mode="cap-accept", gamma=GAMMA, companion_of="cmp")
    s.upsert_run("stat", started_at=T0, source="emulator", mode="static", gamma=GAMMA)
    for run in ("cmp", "cap"):
        s.write("requests", run, [{"rid": "a", "workload": "math"}, {"rid": "b", "workload": "poetry"}])
    s.write("step_reqs", "cmp", [_req(f, r, pre, w, c, conf, survival=(f != 3))
                                 for f, r, pre, w, c, conf, _ in STEPS])
    s.write("step_reqs", "cap", [_req(f + 10, r, pre, w, min(w, a), conf, cap_trim=a - min(w, a))
                                 for f, r, pre, w, c, conf, a in STEPS if a is not None])
    s.write("step_reqs", "stat", [{**_req(1, "a", 10, 3, 2, [0.5] * 3), "confidence": None, "survival": None}])
    return s


def test_load_events_observed_and_companion(store):
    con = sql.connect(store.root)
    obs = cal.load_events(con, "cmp", labels="observed")
    assert obs.gamma == GAMMA and obs.mode == "compact"
    nan = np.nan
    # in request order: a's two steps, then b's three
    np.testing.assert_array_equal(obs.y, [[1, 0, 0], [1, nan, nan], [0, 0, 0], [1, 1, nan], [1, 1, nan]])
    np.testing.assert_allclose(obs.survival[:, 2], [0.225, 0.512, 0.15, 0.378, 0.729])  # last row: cumprod
    assert obs.rid.tolist() == ["a", "a", "b", "b", "b"] and obs.forward_ct.tolist() == [1, 2, 1, 2, 3]
    assert "3 of 5 steps are censored" in obs.notes[0]
    comp = cal.load_events(con, "cmp", labels="companion")
    assert comp.label_source == "cap"
    np.testing.assert_array_equal(comp.y, [[1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0]])
    assert "1 of 5 steps have no companion" in comp.notes[0]
    cap = cal.load_events(con, "cap", labels="observed")  # a cap-accept run knows every position
    np.testing.assert_array_equal(np.sort(cap.y.sum(axis=1)), [0, 1, 2, 3])


def test_calibrate_run_writes_and_replaces_per_labels(store):
    result = cal.calibrate_run(store, "cmp", labels="observed", n_bootstrap=50)
    rows = {(r["workload"], r["position"], r["binning"]): r for r in result.summary.to_pylist()}
    assert len(rows) == 3 * GAMMA * len(cal.BINNINGS)  # '*', math, poetry
    r = rows[("*", 2, "width15")]
    assert (r["n"], r["n_requests"], r["observed_rate"]) == (4, 2, 0.5)
    assert r["mode"] == "compact" and r["label_source"] == "cmp" and r["bootstrap"] == 50
    y = [0, 0, 1, 1]
    p = [0.45, 0.3, 0.63, 0.81]
    assert r["ece"] == pytest.approx(cal.expected_calibration_error(y, p))
    assert r["brier"] == pytest.approx(cal.brier_score_loss(y, p))
    assert r["auroc"] == pytest.approx(1.0)
    assert r["ece_ci_lo"] <= r["ece_ci_hi"]

    cal.calibrate_run(store, "cmp", labels="companion", n_bootstrap=0)
    cal.calibrate_run(store, "cmp", labels="observed", n_bootstrap=0)  # replaces only the observed rows
    con = sql.connect(store.root)
    counts = dict(con.sql("SELECT labels, count(*) FROM calibration WHERE run_id = 'cmp' GROUP BY 1").fetchall())
    assert counts == {"observed": 27, "companion": 27}
    ci = con.sql("SELECT count(ece_ci_lo) FROM calibration WHERE labels = 'observed'").fetchall()[0][0]
    assert ci == 0
    bins = con.sql("SELECT sum(count) FROM calibration_bins WHERE labels = 'companion' AND workload = '*' "
                   "AND binning = 'width15' AND position = 1").fetchall()[0][0]
    assert bins == 4


def test_reconstructed_labels_read_the_ceiling(store):
    con = sql.connect(store.root)
    with pytest.raises(cal.CalibrationDataError, match="dspark-obs estimate"):
        cal.load_events(con, "cmp", labels="reconstructed")
    mids = [1, 2.5, 0, 2, 3]
    store.write("ceiling", "cmp", [  # the ceiling estimator's columns (dspark_obs.estimators.ceiling)
        {"dp_rank": 0, "forward_ct": f, "segment": 0, "rid": r, "prefix_len": pre, "window": w,
         "correct_drafts": c, "censored": c == w < GAMMA, "category": "test", "walked": 0,
         "lo": m, "mid": m, "hi": m, "method": "default"}
        for (f, r, pre, w, c, _, _), m in zip(STEPS, mids)])
    ev = cal.load_events(sql.connect(store.root), "cmp", labels="reconstructed")
    assert ev.label_source == "ceiling"
    assert "1 of 5 steps have a fractional estimate" in ev.notes[0]
    np.testing.assert_allclose(ev.y, [[1, 0, 0], [1, 1, 0.5], [0, 0, 0], [1, 1, 0], [1, 1, 1]])


def test_events_come_in_request_order_whatever_order_the_files_hold(store):
    """The events of a scan and of the same rows scanned in reverse are the same: their order is the rows'
    (request, rank, step), not the layout's."""
    con = sql.connect(store.root)
    scanned = cal.load_events(con, "cmp", labels="observed")
    query, params, mode, gamma, source = events.events_query(con, "cmp", labels="observed")
    table = events.fetch(con, events.events_sql(query), params)
    reversed_scan = table.take(np.arange(table.num_rows)[::-1])
    again, _ = events.events_of(reversed_scan, "cmp", "observed", mode, gamma, source, RunRequests.read(con, "cmp"))
    for name in ("rid", "workload", "dp_rank", "forward_ct", "survival", "confidence", "y"):
        np.testing.assert_array_equal(getattr(again, name), getattr(scanned, name), err_msg=name)


def test_errors_name_the_fix(store):
    con = sql.connect(store.root)
    with pytest.raises(cal.CalibrationDataError, match=r"cap-accept run.*use labels 'observed'"):
        cal.load_events(con, "cap", labels="companion")
    with pytest.raises(cal.CalibrationDataError, match="static mode builds no confidence head"):
        cal.load_events(con, "stat", labels="observed")
    with pytest.raises(cal.CalibrationDataError, match=r"no request-steps for run 'nope'; runs with steps: cap, cmp, stat"):
        cal.load_events(con, "nope")
    with pytest.raises(ValueError, match=r"labels must be one of observed, reconstructed, companion, got 'truth'"):
        cal.load_events(con, "cmp", labels="truth")
    store.write("step_reqs", "solo", [_req(1, "a", 10, 3, 1, [0.9, 0.5, 0.5])])
    with pytest.raises(cal.CalibrationDataError, match=r"no cap-accept companion recorded for run 'solo'.*--companion RUN"):
        cal.load_events(sql.connect(store.root), "solo", labels="companion")
    with pytest.raises(ValueError, match="n_bootstrap must be an integer >= 0"):
        cal.calibrate_run(store, "cmp", n_bootstrap=-1)


# -- the emulator: what trimming does to observed labels ------------------------------


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """A compact run and its cap-accept companion on the emulator (default head, 60 requests).

    Lockstep batching: the engine waits for the closed-loop client to refill its batch, so both
    runs meet the same batches (and the same trimming) however loaded the machine is.
    """
    from collectors.sglang.driver import DriveSpec
    from collectors.sglang.session import CollectOptions, collect
    from dspark_obs.emulator.engine import EngineConfig
    from dspark_obs.emulator.server import BackgroundServer

    store = Store(tmp_path_factory.mktemp("emu"))
    spec = DriveSpec(["gsm8k", "arena-hard", "poetry"], 60, concurrency=24, temperature=0.7,
                     max_new_tokens=200, seed=1)
    for mode, run in (("compact", "emu-c"), ("cap-accept", "emu-ca")):
        with BackgroundServer(EngineConfig(mode=mode, seed=1, lockstep_concurrency=24, lockstep_wait_s=2.0)) as server:
            collect(store, CollectOptions(url=server.url, run_id=run, poll_interval=0.2, flush_interval=1.0,
                                          drive=spec, companion_of="emu-c" if mode == "cap-accept" else None))
    return store


def test_observed_labels_show_the_survivorship_bias_of_trimming(emulated):
    con = sql.connect(emulated.root)
    obs = cal.load_events(con, "emu-c", labels="observed")
    comp = cal.load_events(con, "emu-c", labels="companion")
    # Where the compact record decides an event, it agrees with the full-block truth.
    index = {key: i for i, key in enumerate(zip(obs.dp_rank, obs.forward_ct, obs.rid))}
    rows = np.array([index[key] for key in zip(comp.dp_rank, comp.forward_ct, comp.rid)])
    known = ~np.isnan(obs.y[rows])
    assert known.sum() > 5000 and np.array_equal(obs.y[rows][known], comp.y[known])
    np.testing.assert_allclose(obs.survival[rows], comp.survival)
    for k in (3, 4, 5):  # positions 4..6
        m = ~np.isnan(obs.y[:, k])
        # (1) deep positions are labelled mostly on steps the scheduler trusted: the labelled
        #     share of surviving steps is far higher than the truth (measured: +0.08).
        assert obs.y[m, k].mean() > comp.y[:, k].mean() + 0.04
        # (2) at a given prediction the censored, likely-positive tails are missing, so the head
        #     looks more over-confident under observed labels (measured: +0.02..0.03).
        over_obs = np.mean(obs.survival[m, k] - obs.y[m, k])
        over_true = np.mean(comp.survival[:, k] - comp.y[:, k])
        assert over_obs > over_true + 0.01


def test_cli_calibrate_prints_ece_per_position_and_labels(emulated):
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", "--data", str(emulated.root), "--run", "emu-c", "--bootstrap", "100"],
                        env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    assert "observed" in res.output and "companion" in res.output and "ECE" in res.output
    assert "skipped reconstructed labels" in res.output and "dspark-obs estimate" in res.output
    con = sql.connect(emulated.root)
    got = con.sql("SELECT labels, count(*) FROM calibration WHERE run_id = 'emu-c' AND workload = '*' "
                  "AND binning = 'width15' GROUP BY 1 ORDER BY 1").fetchall()
    assert got == [("companion", 6), ("observed", 6)]

    for args, match in (
        (["--data", str(emulated.root / "missing"), "--run", "emu-c"], "is not a directory"),
        (["--data", str(emulated.root), "--run", "emu-c", "--labels", "truth"], "is not one of"),
        (["--data", str(emulated.root), "--run", "emu-c", "--labels", "reconstructed"], "dspark-obs estimate"),
        (["--data", str(emulated.root), "--run", "nope"], "no request-steps for run 'nope'"),
    ):
        res = runner.invoke(app, ["calibrate", *args], env={"COLUMNS": "200"})
        assert res.exit_code == 2, res.output
        assert match in res.output.replace("\n", " ")
