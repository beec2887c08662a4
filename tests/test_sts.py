"""Tests for dspark_obs.estimators.calibration.sts: SGLang's Sequential Temperature Scaling and its file."""

from __future__ import annotations

import datetime as dt
import json
import math

import numpy as np
import pytest

from dspark_obs.estimators.calibration import sts
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


def sglang_fit(logits, prefix_mask, grid, num_bins=15):
    """A line-by-line numpy transcription of sglang/benchmark/dspark_sts_fit.py (0.5.23)."""
    def ece(probs, targets):
        probs = np.clip(probs.astype(np.float64), 1e-8, 1 - 1e-8)
        idx = np.clip((probs * num_bins).astype(np.int64), 0, num_bins - 1)
        count = np.bincount(idx, minlength=num_bins).astype(float)
        pred = np.bincount(idx, weights=probs, minlength=num_bins)
        tgt = np.bincount(idx, weights=targets, minlength=num_bins)
        denom = np.maximum(count, 1.0)
        return float((np.abs(pred / denom - tgt / denom) * count).sum() / probs.size)

    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    n, gamma = logits.shape
    temps, before, after = [], [], []
    surv_one, surv_fit = np.ones(n), np.ones(n)
    for k in range(gamma):
        surv_one = surv_one * sig(logits[:, k])
        before.append(ece(surv_one, prefix_mask[:, k]))
        best_t = grid[0]
        best_s = surv_fit * sig(logits[:, k] / best_t)
        best = ece(best_s, prefix_mask[:, k])
        for t in grid[1:]:
            cand = surv_fit * sig(logits[:, k] / t)
            e = ece(cand, prefix_mask[:, k])
            if e < best:
                best, best_t, best_s = e, t, cand
        temps.append(float(best_t))
        after.append(best)
        surv_fit = best_s
    return temps, before, after


def synthetic(seed, n=4000, true_t=(2.0, 1.5, 0.8)):
    """Raw logits whose calibrated conditional acceptance is sigmoid(z_k / T_k); y = prefix mask."""
    rng = np.random.default_rng(seed)
    z = rng.normal(1.0, 2.0, size=(n, len(true_t)))
    accept = rng.random(z.shape) < 1 / (1 + np.exp(-z / np.asarray(true_t)))
    return z, np.cumprod(accept, axis=1).astype(float)


def gmean(values) -> float:
    return float(np.exp(np.mean(np.log(values))))


# -- the pure fit ----------------------------------------------------------------------


def test_grid_fit_is_sglangs_fit():
    z, y = synthetic(0)
    fit = sts.fit_sts(z, y, refine=False)
    temps, before, after = sglang_fit(z, y, sts.SGLANG_GRID)
    assert fit.temperatures == temps and fit.grid_temperatures == temps
    np.testing.assert_allclose(fit.ece_before, before, atol=1e-12)
    np.testing.assert_allclose(fit.ece_after, after, atol=1e-12)
    assert len(sts.SGLANG_GRID) == 41 and sts.SGLANG_GRID[0] == pytest.approx(0.1)
    assert sts.SGLANG_GRID[-1] == pytest.approx(10.0)


def test_fit_recovers_the_temperatures_and_refinement_never_hurts():
    z, y = synthetic(1, n=20_000)
    fit = sts.fit_sts(z, y)
    np.testing.assert_allclose(fit.temperatures, [2.0, 1.5, 0.8], rtol=0.15)
    assert all(a <= b + 1e-15 for a, b in zip(fit.ece_after, sts.fit_sts(z, y, refine=False).ece_after))
    assert all(a < b for a, b in zip(fit.ece_after, fit.ece_before))
    assert fit.num_samples == 20_000 and fit.n_labelled == [20_000] * 3


def test_unknown_labels_are_left_out_per_position():
    z, y = synthetic(2)
    y_masked = y.copy()
    y_masked[:1000, 2] = np.nan  # the censored tail of 1000 steps
    fit = sts.fit_sts(z, y_masked, refine=False)
    assert fit.n_labelled == [4000, 4000, 3000]
    ref = sts.fit_sts(z[1000:], y[1000:], refine=False)
    assert fit.temperatures[:2] != ref.temperatures[:2] or fit.ece_after[:2] != ref.ece_after[:2]
    assert math.isfinite(fit.ece_after[2])


def test_raw_logits_invert_the_servers_temperatures():
    raw = np.array([[-3.0, 0.0, 2.5], [1.0, 4.0, -0.5]])
    temps = np.array([1.3, 0.7, 2.0])
    reported = 1 / (1 + np.exp(-raw / temps))
    np.testing.assert_allclose(sts.raw_logits(reported, temperatures=temps), raw, atol=1e-9)
    np.testing.assert_allclose(sts.raw_logits(reported), raw / temps, atol=1e-9)
    assert np.all(np.isfinite(sts.raw_logits([[0.0, 1.0]])))
    assert np.isnan(sts.raw_logits([[np.nan, 0.5]])[0, 0])


@pytest.mark.parametrize("call, match", [
    (lambda: sts.raw_logits([0.5, 0.5]), r"confidence must be 2-D \(n, gamma\), got shape \(2,\)"),
    (lambda: sts.raw_logits([[0.5, 1.5]]), r"confidence has values outside \[0, 1\]: min 0.5, max 1.5"),
    (lambda: sts.raw_logits([[0.5, 0.5]], temperatures=[1.0]), r"temperatures has 1 values but gamma is 2.*--current-sts"),
    (lambda: sts.raw_logits([[0.5]], temperatures=[0.0]), r"must all be finite and > 0, got \[0.0\]"),
    (lambda: sts.fit_sts(np.zeros((3, 2)), np.zeros((3, 3))), r"shape \(n, gamma\); got \(3, 2\) and \(3, 3\)"),
    (lambda: sts.fit_sts(np.zeros((0, 2)), np.zeros((0, 2))), r"at least one sample"),
    (lambda: sts.fit_sts(np.zeros((1, 1)), np.full((1, 1), 2.0)), r"y_true has values outside \[0, 1\]"),
    (lambda: sts.fit_sts(np.zeros((1, 1)), np.ones((1, 1)), grid=[-1.0]), r"grid must be .* positive"),
    (lambda: sts.StsCalibration(temperatures=[1.0, -2.0]), r"finite and > 0, got \[1.0, -2.0\]"),
    (lambda: sts.StsCalibration(temperatures=[]), r"at least one temperature"),
    (lambda: sts.StsCalibration.from_json('{"temps": [1]}'), r"not an SGLang STS calibration"),
    (lambda: sts.StsCalibration.from_json("{"), r"not JSON"),
])
def test_bad_inputs_raise_with_the_bad_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_sts_file_is_sglangs_format():
    z, y = synthetic(3, n=2000)
    fit = sts.fit_sts(z, y)
    text = sts.StsCalibration(temperatures=fit.temperatures, dataset="unit", num_samples=2000,
                              ece_before=fit.ece_before, ece_after=fit.ece_after).to_json()
    data = json.loads(text)
    assert set(data) == {"temperatures", "dataset", "num_samples", "ece_before", "ece_after"}
    assert sts.StsCalibration.from_json(text).temperatures == fit.temperatures
    try:  # the fidelity venv has SGLang itself
        from sglang.srt.speculative.dspark_components.dspark_sts import DSparkStsCalibration
    except Exception:  # noqa: BLE001 - not installed here, or its CUDA-only imports fail
        return
    assert DSparkStsCalibration.from_json(text).temperatures == fit.temperatures


# -- on the emulator ------------------------------------------------------------------------

HEAD_T = 0.6  # over-confident head: reported c = sigmoid(logit(c_true) / 0.6)
SERVED_STS = 1.3  # the STS file the second server runs with, on top of the head


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """Two cap-accept runs of a miscalibrated head; the second also serves an STS file."""
    from collectors.sglang.driver import DriveSpec
    from collectors.sglang.session import CollectOptions, collect
    from dspark_obs.emulator.engine import EngineConfig
    from dspark_obs.emulator.server import BackgroundServer

    store = Store(tmp_path_factory.mktemp("sts"))
    spec = DriveSpec(["gsm8k", "arena-hard", "poetry"], 60, concurrency=24, temperature=0.7,
                     max_new_tokens=200, seed=1)
    for run, served in (("mis", None), ("mis-sts", (SERVED_STS,) * 6)):
        # lockstep: batches form as the driver's closed loop says, not as the machine's load times them
        cfg = EngineConfig(mode="cap-accept", seed=1, head_temperature=(HEAD_T,) * 6, sts_temperatures=served,
                           lockstep_concurrency=24)
        with BackgroundServer(cfg) as server:
            collect(store, CollectOptions(url=server.url, run_id=run, poll_interval=0.2, flush_interval=1.0,
                                          drive=spec))
    return store


def test_sts_undoes_a_miscalibrated_head(emulated):
    fit = sts.fit_sts_run(emulated, "mis")
    assert fit.labels == "observed" and fit.num_samples > 2000
    assert all(a < b for a, b in zip(fit.ece_after, fit.ece_before))
    assert np.mean(fit.ece_after) < 0.35 * np.mean(fit.ece_before)  # measured: 0.012 vs 0.091
    # The head sharpened logits by 1/0.6: the fit cools them by about 1/0.6 = 1.67 at every position.
    assert all(t > 1.2 for t in fit.temperatures)
    assert 1.4 < gmean(fit.temperatures) < 2.0
    # nothing was applied by the server (the recorded survival is rounded to 4 decimals, the cumprod of
    # confidences not: a step whose survival sits on a bin edge may change bins, ~1/n_samples of ECE each)
    assert fit.ece_reported == pytest.approx(fit.ece_before, abs=1e-3)


def test_a_sample_of_whole_requests_fits_about_the_same_temperatures(emulated):
    """The report fits STS on a sample of whole requests of a large run: the same steps as the whole run's
    fit reads for those requests, and about the same temperatures as the whole run gives."""
    whole = sts.fit_sts_run(emulated, "mis")
    part = sts.fit_sts_run(emulated, "mis", sample_rows=whole.num_samples // 2)
    assert whole.num_samples // 3 < part.num_samples <= whole.num_samples // 2 + 400   # whole requests
    assert "sample=" in part.dataset and "sample=" not in whole.dataset
    assert 1.4 < gmean(part.temperatures) < 2.0
    assert gmean(part.temperatures) == pytest.approx(gmean(whole.temperatures), rel=0.15)
    same = sts.fit_sts_run(emulated, "mis", sample_rows=10 * whole.num_samples)   # the run fits: no sample
    assert same.temperatures == whole.temperatures and "sample=" not in same.dataset


def test_fitting_data_served_with_sts_accounts_for_it(emulated):
    served = [SERVED_STS] * 6
    fit = sts.fit_sts_run(emulated, "mis-sts", current_temperatures=served)
    naive = sts.fit_sts_run(emulated, "mis-sts")
    # Raw logits are recovered, so the new temperatures replace the served ones: again about 1/0.6.
    assert 1.4 < gmean(fit.temperatures) < 2.0
    # Ignoring the served STS would fit temperatures to apply on top of it — too cold by ~1.3.
    assert 1.15 < gmean(fit.temperatures) / gmean(naive.temperatures) < 1.5
    # ece_before is the raw head (T = 1), worse than what the server showed with its STS.
    assert np.mean(fit.ece_before) > np.mean(fit.ece_reported) > np.mean(fit.ece_after)
    np.testing.assert_allclose(fit.ece_reported, naive.ece_before, atol=1e-3)  # rounding at bin edges, as above


def test_cli_fit_sts_writes_a_file_the_emulator_and_sglang_load(emulated, tmp_path):
    from typer.testing import CliRunner

    from dspark_obs.cli import app
    from dspark_obs.emulator.server import load_sts_temperatures

    served = tmp_path / "served.json"
    served.write_text(json.dumps({"temperatures": [SERVED_STS] * 6}))
    out = tmp_path / "sts.json"
    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", "--data", str(emulated.root), "--run", "mis-sts", "--bootstrap", "0",
                              "--fit-sts", str(out), "--current-sts", str(served)], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    assert "STS fit" in res.output and "wrote" in res.output
    calib = sts.StsCalibration.from_json(out.read_bytes())
    assert len(calib.temperatures) == 6 and calib.num_samples > 2000
    assert 1.4 < gmean(calib.temperatures) < 2.0
    assert load_sts_temperatures(str(out)) == tuple(calib.temperatures)

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"temperatures": [1.0, 1.0]}))
    for args, match in (
        (["--current-sts", str(bad)], "gamma is 6"),
        (["--current-sts", str(tmp_path / "none.json")], "cannot read it"),
    ):
        res = runner.invoke(app, ["calibrate", "--data", str(emulated.root), "--run", "mis-sts", "--bootstrap", "0",
                                  "--fit-sts", str(out), *args], env={"COLUMNS": "200"})
        assert res.exit_code == 2, res.output
        assert match in res.output.replace("\n", " ")


def test_cli_refuses_to_fit_when_the_server_ran_sts_and_none_is_given(tmp_path):
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    store = Store(tmp_path / "data")
    info = json.dumps({"speculative_dspark_confidence_sts_path": "/models/sts.json"})
    store.upsert_run("r", started_at=T0, source="sglang", mode="cap-accept", gamma=2, server_info=info)
    store.write("step_reqs", "r", [
        {"dp_rank": 0, "forward_ct": i, "segment": 0, "rid": f"q{i % 3}", "req_pool_index": 0, "prefix_len": i,
         "verify_len": 2, "acc_len": 1 + min(c, 1), "correct_drafts": min(c, 1), "cap_trim": c - min(c, 1),
         "bonus_token": 1, "draft_tokens": [1, 2], "confidence": [0.8, 0.6]}
        for i, c in enumerate([0, 1, 2, 2, 1, 0, 2, 2])])
    res = CliRunner().invoke(app, ["calibrate", "--data", str(store.root), "--run", "r", "--fit-sts",
                                   str(tmp_path / "o.json")], env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output
    assert "pass that file as --current-sts" in res.output.replace("\n", " ")
    assert not (tmp_path / "o.json").exists()


def test_the_grid_is_scored_in_blocks_with_the_same_eces(monkeypatch):
    """Large runs score a few temperatures at a time (bounded memory); every ECE is unchanged."""
    rng = np.random.default_rng(4)
    z = rng.normal(1.0, 2.0, size=(3000, 3))
    y = (rng.random((3000, 3)) < 1 / (1 + np.exp(-z / 1.7))).astype(float)
    whole = sts.fit_sts(z, y)
    monkeypatch.setattr(sts, "_GRID_CELLS", 7000)  # two temperatures per block
    blocked = sts.fit_sts(z, y)
    monkeypatch.setattr(sts, "_GRID_CELLS", 1)  # one at a time
    single = sts.fit_sts(z, y)
    assert whole == blocked == single
