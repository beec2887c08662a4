"""Trimming health end to end on the emulator: --sps-table none, doctor, the sidecar's counters, the dashboard."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

import dspark_obs.ui
from collectors.sglang.driver import DriveSpec
from collectors.sglang.metrics import SidecarMetrics
from collectors.sglang.session import CollectOptions, Collector
from dspark_obs import health, sql
from dspark_obs.cli import app
from dspark_obs.emulator.engine import EngineConfig
from dspark_obs.emulator.server import BackgroundServer
from dspark_obs.store import Store

runner = CliRunner()
APP = str(Path(dspark_obs.ui.__file__).parent / "app.py")
RUNS = {"with-table": {}, "no-table": {"sps_table": None}}


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of one /metrics scrape."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _collect_scraping(store: Store, run: str, cfg: dict) -> list[dict]:
    """Collect one emulator run with the sidecar served; scrape it while the run goes on."""
    metrics = SidecarMetrics()
    port = metrics.serve(0)
    scrapes: list[dict] = []
    done = threading.Event()

    def scraper() -> None:
        while not done.wait(0.05):
            scrapes.append(scrape(port))

    with BackgroundServer(EngineConfig(mode="compact", seed=5, dp_size=2, **cfg)) as srv:
        thread = threading.Thread(target=scraper, daemon=True)
        thread.start()
        opts = CollectOptions(url=srv.url, run_id=run, poll_interval=0.05, flush_interval=0.2, drive=DriveSpec(
            ["gsm8k", "arena-hard", "poetry"], 36, concurrency=9, max_new_tokens=80))
        asyncio.run(Collector(store, opts, metrics=metrics).run())
        done.set()
        thread.join()
        scrapes.append(scrape(port))
    metrics.close()
    return scrapes


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    root = tmp_path_factory.mktemp("health") / "data"
    store = Store(root)
    scrapes = {run: _collect_scraping(store, run, cfg) for run, cfg in RUNS.items()}
    return root, scrapes


def test_sps_table_none_verifies_whole_blocks_and_reports_no_table(emulator):
    gsm = [f"[gsm8k] q {i}" for i in range(6)]
    for cfg, expect in (({"sps_table": None}, "none"), ({}, "builtin")):
        srv = emulator(mode="compact", seed=2, **cfg)
        for i, text in enumerate(gsm):  # fixed rids: the emulator draws a request's drafts from its rid
            httpx.post(f"{srv.url}/generate", json={"text": text, "rid": f"gsm8k-{i:06d}",
                                                     "sampling_params": {"max_new_tokens": 40}},
                       timeout=60).raise_for_status()
        info = httpx.get(f"{srv.url}/server_info", timeout=30).json()
        assert info["speculative_dspark_sps_table_path"] is None and info["emulator_sps_table"] == expect
        lens = {r["verify_len"] for rec in info["internal_states"][0]["dspark_info_record"]["records"]
                for r in rec.get("reqs", [])}
        assert (lens == {7}) == (expect == "none"), lens  # these requests' survivals never drop below the floor


def test_emulate_sps_table_flag_parses_none_and_a_file(tmp_path):
    from dspark_obs import costtable
    from dspark_obs.commands.emulate import planning_table as _planning_table

    assert _planning_table(Path("none")) == {"sps_table": None, "sps_table_path": None}
    path = tmp_path / "t.json"
    path.write_text(costtable.to_json(costtable.default_additive_table()))
    got = _planning_table(path)
    assert got["sps_table_path"] == str(path) and got["sps_table"] == costtable.default_additive_table()


def test_doctor_on_the_store(collected):
    root, _ = collected
    bad = runner.invoke(app, ["doctor", "--data", str(root), "--run", "no-table"])
    text = " ".join(bad.stdout.split())
    assert bad.exit_code == 1, bad.output
    assert text.startswith("FAIL trimming inactive: no cost table loaded")
    assert "--speculative-dspark-sps-table-path" in text
    good = runner.invoke(app, ["doctor", "--data", str(root), "--run", "with-table", "--fail-on", "fail", "--json"])
    assert good.exit_code == 0, good.output
    body = json.loads(good.stdout)
    assert body["exit_code"] == 0 and not [f for f in body["findings"] if f["severity"] == "fail"]
    assert any(f["code"] == "trimming_active" and f["severity"] == "ok" for f in body["findings"])
    missing = runner.invoke(app, ["doctor", "--data", str(root), "--run", "nope"])
    assert missing.exit_code == 2 and "runs with request-steps: no-table, with-table" in " ".join(missing.output.split())


def test_doctor_against_a_live_server(emulator):
    bare = emulator(mode="compact", seed=3, sps_table=None)
    result = runner.invoke(app, ["doctor", "--url", bare.url, "--json"])
    body = json.loads(result.stdout)
    assert result.exit_code == 1 and body["findings"][0]["code"] == "no_cost_table"  # no traffic yet
    for i in range(40):
        httpx.post(f"{bare.url}/generate", json={"text": f"[gsm8k] q {i}", "sampling_params": {"max_new_tokens": 30}},
                   timeout=60).raise_for_status()
    result = runner.invoke(app, ["doctor", "--url", bare.url, "--fail-on", "fail"])
    assert result.exit_code == 1 and "FAIL trimming inactive: no cost table loaded" in " ".join(result.stdout.split())
    table = emulator(mode="compact", seed=3)
    for i in range(40):
        httpx.post(f"{table.url}/generate", json={"text": f"[poetry] q {i}",
                                                  "sampling_params": {"max_new_tokens": 30}}, timeout=60)
    result = runner.invoke(app, ["doctor", "--url", table.url, "--fail-on", "fail", "--show-ok"])
    assert result.exit_code == 0, result.output
    assert "ok    trimming active" in result.stdout
    dead = runner.invoke(app, ["doctor", "--url", "http://127.0.0.1:9"])
    assert dead.exit_code == 2 and "cannot read http://127.0.0.1:9/server_info" in " ".join(dead.output.split())
    assert runner.invoke(app, ["doctor", "--url", table.url, "--fail-on", "info"]).exit_code == 2


def _rank_sum(sample: dict, name: str) -> float:
    return sum(v for (n, _), v in sample.items() if n == name)


COUNTER_COLUMNS = {"request_steps_total": "request_steps", "trimmed_request_steps_total": "trimmed_steps",
                   "budget_trimmed_request_steps_total": "budget_trimmed_steps",
                   "censored_request_steps_total": "censored_steps", "verified_tokens_total": "verified_tokens",
                   "no_trim_tokens_total": "no_trim_tokens", "accepted_drafts_total": "accepted_drafts",
                   "verified_drafts_total": "verified_drafts", "proposed_drafts_total": "proposed_drafts",
                   "expected_accepted_drafts_total": "expected_accepted", "decode_steps_total": "decode_steps",
                   "graph_tokens_total": "graph_tokens", "padded_tokens_total": "padded_tokens",
                   "costtable_fit_steps_total": "fit_steps", "step_cpu_steps_total": "timed_steps"}


@pytest.mark.parametrize("run", list(RUNS))
def test_sidecar_counters_scraped_during_the_run_agree_with_the_store(collected, run):
    root, scrapes = collected
    frame = health.figures(sql.connect(root), runs=[run])
    final = scrapes[run][-1]
    assert len(scrapes[run]) >= 3
    for counter, column in COUNTER_COLUMNS.items():
        for rank in ("0", "1"):
            want = float(frame[(frame["dp_rank"] == rank) & (frame["workload"] == "*")][column].fillna(0).iloc[0])
            got = final[("dspark_obs:" + counter, (("dp_rank", rank),))]
            assert got == pytest.approx(want, rel=1e-6), (counter, rank)
    # counters never go down while the run goes on (rate() works on them)
    seen = [_rank_sum(s, "dspark_obs:request_steps_total") for s in scrapes[run]]
    assert seen == sorted(seen) and seen[-1] > seen[0] or seen[0] == seen[-1] > 0
    pooled = health.run_row(frame, run)
    mape = _rank_sum(final, "dspark_obs:costtable_abs_pct_error_total") / _rank_sum(
        final, "dspark_obs:costtable_fit_steps_total")
    assert mape == pytest.approx(pooled["costtable_mape"], rel=1e-6)
    lens = {dict(k)["verify_len"]: v for (n, k), v in final.items() if n == "dspark_obs:verify_len_request_steps_total"}
    assert sum(v > 0 for v in lens.values()) == pooled["window_sizes"] and sum(lens.values()) == pooled["request_steps"]
    pos = health.by_position(sql.connect(root), runs=[run]).set_index("position")
    for k, row in pos.iterrows():
        key = (("position", str(k)),)
        assert final[("dspark_obs:position_accepted_total", key)] == row["actual_accepted"]
        assert final[("dspark_obs:position_expected_accepted_total", key)] == pytest.approx(row["expected_accepted"])
    # the observation's own cost: the collector's timings, counted live and stored in the runs row
    assert final[("dspark_obs:observation_requests_total", ())] == pooled["observation_requests"] > 0
    assert final[("dspark_obs:observation_server_seconds_total", ())] == pytest.approx(pooled["observation_server_s"])
    assert final[("dspark_obs:observation_collect_seconds_total", ())] == pytest.approx(pooled["collect_s"])
    assert 0 < pooled["observation_share"] < 1 and pooled["poll_step_ratio"] > 0
    step_ms = 1000 * _rank_sum(final, "dspark_obs:step_cpu_seconds_total") / _rank_sum(
        final, "dspark_obs:step_cpu_steps_total")
    assert step_ms == pytest.approx(pooled["step_cpu_ms"], rel=1e-6)
    active = {"with-table": 1.0, "no-table": 0.0}[run]
    assert final[("dspark_obs:trimming_active", ())] == active
    assert final[("dspark_obs:cost_table_loaded", ())] == active


def test_the_overview_says_trimming_inactive_for_the_run_without_a_table(collected, monkeypatch):
    root, _ = collected
    monkeypatch.setenv("DSPARK_OBS_DATA", str(root))
    at = AppTest.from_file(APP, default_timeout=600).run()
    assert not at.exception, [e.value for e in at.exception]
    marks = " ".join(m.value for m in at.markdown)
    assert "**no-table** · trimming inactive" in marks and "**with-table** · trimming active" in marks
    cost = [m for m in at.metric if m.label == "observation cost"]
    assert len(cost) == 2 and all(m.value.endswith("%") for m in cost)
    warnings = [w.value for w in at.warning if "trimming inactive" in w.value]
    assert len(warnings) == 1 and "--speculative-dspark-sps-table-path" in warnings[0]
    titles = [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "") for c in at.get("plotly_chart")]
    assert "Expected vs actual acceptance by draft position" in titles


def test_live_ceiling_for_greedy_requests_equals_the_offline_estimate(tmp_path):
    from dspark_obs.estimators.ceiling import estimate_run

    store, metrics = Store(tmp_path / "data"), SidecarMetrics()
    port = metrics.serve(0)
    with BackgroundServer(EngineConfig(mode="compact", seed=3, dp_size=2)) as srv:
        opts = CollectOptions(url=srv.url, run_id="g", poll_interval=0.05, flush_interval=0.2, drive=DriveSpec(
            ["gsm8k", "arena-hard", "poetry"], 30, concurrency=8, max_new_tokens=64, temperature=0.0))
        asyncio.run(Collector(store, opts, metrics=metrics).run())
    final = scrape(port)
    metrics.close()
    estimate_run(store, "g")
    row = health.run_row(health.figures(sql.connect(store.root), runs=["g"]), "g")
    assert final[("dspark_obs:ceiling_request_steps_total", ())] == row["censored_steps"] > 0
    assert final[("dspark_obs:tokens_lost_lo_total", ())] == pytest.approx(row["tokens_lost_lo"])
    assert final[("dspark_obs:tokens_lost_hi_total", ())] == pytest.approx(row["tokens_lost_hi"])
    assert final[("dspark_obs:tokens_lost_lo_total", ())] <= row["tokens_lost"] <= final[
        ("dspark_obs:tokens_lost_hi_total", ())]
    assert final[("dspark_obs:ceiling_requests_total", (("sampling", "greedy"),))] == 30


def test_live_ceiling_for_sampled_requests_equals_the_offline_estimate_with_the_same_fit(tmp_path):
    from dspark_obs.estimators.ceiling import estimate_run
    from dspark_obs.estimators.ceiling.fit import CeilingFit

    store = Store(tmp_path / "data")
    drive = DriveSpec(["gsm8k", "arena-hard", "poetry"], 24, concurrency=8, max_new_tokens=64, temperature=0.8)
    with BackgroundServer(EngineConfig(mode="compact", seed=4, dp_size=2)) as srv:
        opts = CollectOptions(url=srv.url, run_id="earlier", poll_interval=0.05, flush_interval=0.2, drive=drive)
        asyncio.run(Collector(store, opts).run())
        path = tmp_path / "fit.json"  # estimate --fit-out of an earlier run of the same deployment
        res = runner.invoke(app, ["estimate", "--data", str(store.root), "--run", "earlier", "--bootstrap", "0",
                                  "--fit-out", str(path)])
        assert res.exit_code == 0, res.output
        fit = CeilingFit.load(path)
        metrics = SidecarMetrics(ceiling_fit=fit)
        port = metrics.serve(0)
        opts = CollectOptions(url=srv.url, run_id="today", poll_interval=0.05, flush_interval=0.2,
                              drive=DriveSpec(["gsm8k", "arena-hard", "poetry"], 24, concurrency=8, max_new_tokens=64,
                                              temperature=0.8, seed=1))
        asyncio.run(Collector(store, opts, metrics=metrics).run())
    final = scrape(port)
    metrics.close()
    res = runner.invoke(app, ["estimate", "--data", str(store.root), "--run", "today", "--bootstrap", "0",
                              "--fit-in", str(path)])
    assert res.exit_code == 0, res.output
    rows = store.read("ceiling", "today").to_pandas()
    censored = rows[rows["censored"]]
    assert final[("dspark_obs:ceiling_sampled_request_steps_total", ())] == len(censored) > 0
    for key in ("lo", "mid", "hi"):
        want = float((censored[key] - censored["correct_drafts"]).sum())
        assert final[(f"dspark_obs:tokens_lost_sampled_{key}_total", ())] == pytest.approx(want, rel=1e-9), key
    assert final[("dspark_obs:ceiling_request_steps_total", ())] == 0  # no greedy request
    assert final[("dspark_obs:ceiling_fit_loaded", ())] == 1.0
    assert final[("dspark_obs:ceiling_requests_total", (("sampling", "sampled"),))] == 24
    # its own fit gives other numbers: the live sums are those of the fit the sidecar was given
    own = estimate_run(store, "today", n_bootstrap=0, write=False).ceiling.to_pandas()
    own = own[own["censored"]]
    assert float((own["mid"] - own["correct_drafts"]).sum()) != pytest.approx(
        final[("dspark_obs:tokens_lost_sampled_mid_total", ())], rel=1e-9)


def test_collect_ceiling_fit_needs_the_metrics_port_and_a_fit(tmp_path):
    res = runner.invoke(app, ["collect", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "d"),
                              "--ceiling-fit", str(tmp_path / "fit.json")])
    assert res.exit_code != 0 and "--metrics-port" in " ".join(res.output.split())
    (tmp_path / "fit.json").write_text("{}")
    res = runner.invoke(app, ["collect", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "d"),
                              "--metrics-port", "0", "--ceiling-fit", str(tmp_path / "fit.json")])
    assert res.exit_code != 0 and "--fit-out FILE" in " ".join(res.output.split())
