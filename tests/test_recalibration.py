"""Recalibration beyond temperature: fitted on one half of the requests, scored on the other."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dspark_obs.estimators.calibration import recalibration as rc


def test_the_split_is_by_request_seeded_and_about_half():
    rids = np.array([f"r{i}" for i in range(2000)] * 3, dtype=object)
    a = rc.request_split(rids, seed=0)
    assert np.array_equal(a, rc.request_split(rids, seed=0))
    assert np.array_equal(a[:2000], a[2000:4000])           # every step of a request is on one side
    assert 0.45 < a[:2000].mean() < 0.55
    b = rc.request_split(rids, seed=1)
    assert not np.array_equal(a, b)


def test_platt_recovers_a_logit_affine_miscalibration():
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.02, 0.98, 40_000)
    y = (rng.random(truth.size) < truth).astype(float)
    head = 1 / (1 + np.exp(-(0.5 * np.log(truth / (1 - truth)) - 1.0)))   # flat and under-confident
    m = rc.fit_map("platt", head, y)
    a, b = m.params["w"]
    assert a == pytest.approx(2.0, rel=0.08) and b == pytest.approx(2.0, rel=0.08)   # the inverse map
    grid = np.array([0.1, 0.5, 0.9])
    g_head = 1 / (1 + np.exp(-(0.5 * np.log(grid / (1 - grid)) - 1.0)))
    np.testing.assert_allclose(m.apply(g_head), grid, atol=0.03)


def test_isotonic_is_monotone_and_beta_keeps_a_calibrated_head():
    rng = np.random.default_rng(1)
    s = rng.uniform(0, 1, 20_000)
    y = (rng.random(s.size) < s).astype(float)
    iso = rc.fit_map("isotonic", s, y)
    grid = np.linspace(0, 1, 101)
    assert np.all(np.diff(iso.apply(grid)) >= 0)
    beta = rc.fit_map("beta", s, y)
    np.testing.assert_allclose(beta.apply(np.array([0.2, 0.5, 0.8])), [0.2, 0.5, 0.8], atol=0.03)


def test_few_rows_keep_the_identity_and_unknown_methods_are_refused():
    assert rc.fit_map("platt", np.array([0.5] * 3), np.array([1.0] * 3)).method == "none"
    with pytest.raises(ValueError, match="not one of"):
        rc.fit_map("histogram", np.full(50, 0.5), np.ones(50))


def test_applied_maps_keep_the_survival_non_increasing():
    maps = [rc.SurvivalMap("isotonic", {"x": [0.0, 1.0], "y": [0.0, 0.5]}),
            rc.SurvivalMap("isotonic", {"x": [0.0, 1.0], "y": [0.2, 0.9]})]
    out = rc.apply_survival_map(np.array([[1.0, 0.8]]), maps)
    assert out.tolist() == [[0.5, 0.5]]
    with pytest.raises(ValueError, match="positions"):
        rc.apply_survival_map(np.ones((1, 3)), maps)


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    """A cap-accept emulator run (labels exact at every position) of an under-confident head."""
    from collectors.sglang.driver import DriveSpec
    from collectors.sglang.session import CollectOptions, collect
    from dspark_obs.emulator.engine import EngineConfig
    from dspark_obs.emulator.server import BackgroundServer
    from dspark_obs.store import Store

    store = Store(tmp_path_factory.mktemp("recalibration"))
    cfg = EngineConfig(mode="cap-accept", seed=4, head_temperature=(1.0,), head_bias=(-1.2,))
    with BackgroundServer(cfg) as server:
        collect(store, CollectOptions(url=server.url, run_id="biased", poll_interval=0.1, flush_interval=1.0,
                                      drive=DriveSpec(["gsm8k", "arena-hard", "poetry"], 90, concurrency=16,
                                                      temperature=0.7, seed=4)))
    return store


def test_a_bias_capable_map_beats_sts_held_out_on_a_biased_head(biased):
    result = rc.recalibrate_run(biased, "biased", labels="observed", n_bootstrap=50)
    table = biased.read("recalibration", "biased").to_pylist()
    assert {r["method"] for r in table} == set(rc.METHODS) and {r["split"] for r in table} == {"held_out"}
    means = {m: result.mean_ece(m) for m in rc.METHODS}
    print("\nheld-out mean ECE over positions: " + ", ".join(f"{m} {v:.4f}" for m, v in means.items()))
    best = result.best_bias_capable()
    assert means[best] < means["sts"] < means["none"]
    star = [r for r in table if r["workload"] == "*" and r["method"] == best]
    assert len(star) == 6 and all(r["ece_ci_lo"] <= r["ece"] <= r["ece_ci_hi"] for r in star)
    # the exported map says what it is and applies to the run's survivals
    doc = json.loads(rc.survival_map_json(result))
    assert doc["format"] == rc.FORMAT and "NOT loadable by SGLang" in doc["note"]
    maps = rc.load_survival_map(rc.survival_map_json(result))
    assert len(maps) == 6 and maps[0].method == best


def test_rerunning_replaces_the_rows_of_the_same_labels(biased):
    rc.recalibrate_run(biased, "biased", labels="observed", n_bootstrap=0)
    rc.recalibrate_run(biased, "biased", labels="observed", n_bootstrap=0, seed=3)
    rows = biased.read("recalibration", "biased").to_pylist()
    assert {r["seed"] for r in rows} == {3}


def test_a_foreign_json_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="for SGLang's STS file use --sts"):
        rc.load_survival_map(json.dumps({"temperatures": [1.0] * 6}))


def test_calibrate_recalibrate_then_replay_the_map(biased, tmp_path):
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    out = tmp_path / "map.json"
    got = CliRunner().invoke(app, ["calibrate", "--data", str(biased.root), "--run", "biased", "--labels", "observed",
                                   "--bootstrap", "20", "--recalibrate", "--recalibrate-out", str(out)])
    assert got.exit_code == 0, got.output
    text = " ".join(got.output.split())
    assert "best bias-capable" in text and "Held-out ECE" in text
    assert json.loads(out.read_text())["format"] == rc.FORMAT
    got = CliRunner().invoke(app, ["replay", "--data", str(biased.root), "--run", "biased", "--recalibration", str(out)])
    assert got.exit_code == 0, got.output
    scenarios = {r["scenario"]: r for r in biased.read("replay_whatif", "biased").to_pylist()}
    assert "recalibration" in scenarios
    # an under-confident head, recalibrated, plans larger windows: more tokens verified per step
    assert scenarios["recalibration"]["accepted_tokens_mean"] >= scenarios["replay"]["accepted_tokens_mean"]


def test_recalibrate_out_needs_recalibrate(biased, tmp_path):
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    got = CliRunner().invoke(app, ["calibrate", "--data", str(biased.root), "--run", "biased",
                                   "--recalibrate-out", str(tmp_path / "x.json")])
    assert got.exit_code != 0 and "add --recalibrate" in " ".join(got.output.split())
