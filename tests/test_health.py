"""Tests for dspark_obs.health: every figure hand-computed on a small store, and the verdicts."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from dspark_obs import health, sql
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
GAMMA = 3


def _step(dp_rank, fct, nvt, pred, gpu, local=-1, synced=-1):
    return {"dp_rank": dp_rank, "forward_ct": fct, "segment": 0, "bs": 2, "num_running_reqs": 2, "mode": "compact",
            "num_verify_tokens": nvt, "verify_tokens_local": local, "verify_tokens_dp_synced": synced,
            "verify_tokens_graph_key": nvt, "predicted_step_ms": pred, "step_gpu_ms": gpu}


def _req(dp_rank, fct, rid, verify_len, correct, survival):
    return {"dp_rank": dp_rank, "forward_ct": fct, "segment": 0, "rid": rid, "req_pool_index": 0, "prefix_len": 10,
            "verify_len": verify_len, "acc_len": correct + 1, "correct_drafts": correct, "cap_trim": 0,
            "bonus_token": 1, "draft_tokens": [5] * GAMMA, "survival": survival}


STEPS = [_step(0, 1, 8, 10.0, 8.0, local=6, synced=8), _step(0, 2, 8, 10.0, 10.0, local=8, synced=8),
         _step(1, 1, 4, 12.0, 10.0), _step(1, 2, 4, None, 10.0)]
REQS = [
    _req(0, 1, "a", 4, 2, [0.9, 0.6, 0.3]),    # whole block
    _req(0, 1, "b", 2, 1, [0.8, 0.4, 0.1]),    # trimmed at S_2 = 0.4: budget-trimmed, censored
    _req(0, 2, "a", 3, 1, [0.9, 0.5, 0.005]),  # trimmed at S_3 = 0.005 < 0.01: not budget-trimmed
    _req(0, 2, "b", 4, 3, None),               # whole block, no survival
    _req(1, 1, "a", 1, 0, [0.2, 0.1, 0.05]),   # window 0, budget-trimmed, censored
    _req(1, 2, "b", 3, 2, [0.95, 0.9, 0.6]),   # budget-trimmed, censored
]


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "data")
    s.upsert_run("r", started_at=T0, ended_at=T0, source="emulator", mode="compact", gamma=GAMMA,
                 end_reason="completed")
    s.write("steps", "r", STEPS)
    s.write("step_reqs", "r", REQS)
    s.write("requests", "r", [{"rid": "a", "workload": "gsm8k"}, {"rid": "b", "workload": "poetry"}])
    base = {"segment": 0, "prefix_len": 10, "method": "default", "censored": True, "category": "censored_diverged"}
    s.write("ceiling", "r", [
        {**base, "dp_rank": 0, "forward_ct": 1, "rid": "b", "window": 1, "correct_drafts": 1, "lo": 1.0,
         "mid": 2.5, "hi": 3.0},
        {**base, "dp_rank": 1, "forward_ct": 1, "rid": "a", "window": 0, "correct_drafts": 0, "lo": 0.0,
         "mid": 0.5, "hi": 2.0}])
    return s


def _row(frame: pd.DataFrame, dp_rank="*", workload="*") -> dict:
    sel = frame[(frame["dp_rank"] == dp_rank) & (frame["workload"] == workload)]
    assert len(sel) == 1, (dp_rank, workload, frame[["dp_rank", "workload"]])
    return sel.iloc[0].to_dict()


def test_every_figure_by_hand(store):
    r = _row(health.figures(sql.connect(store.root)))
    assert (r["request_steps"], r["trimmed_steps"], r["budget_trimmed_steps"], r["window_sizes"]) == (6, 4, 3, 4)
    assert r["trimmed_share"] == pytest.approx(4 / 6) and r["budget_trimmed_share"] == pytest.approx(0.5)
    assert (r["verified_tokens"], r["no_trim_tokens"]) == (17, 24) and r["trim_ratio"] == pytest.approx(17 / 24)
    assert r["censored_steps"] == 3 and r["trim_regret"] == pytest.approx(3 / 4)
    assert (r["accepted_drafts"], r["verified_drafts"], r["proposed_drafts"]) == (9, 11, 18)
    assert r["acceptance"] == pytest.approx(9 / 11) and r["spec_accept_rate"] == pytest.approx(0.5)
    assert r["accept_rate_gap"] == pytest.approx(9 / 11 - 0.5)
    assert r["survival_steps"] == 5 and r["survival_accepted"] == 6
    assert r["expected_accepted"] == pytest.approx(1.8 + 0.8 + 1.4 + 0 + 1.85, abs=1e-5)
    assert health.expected_accept_error(r) == pytest.approx((5.85 - 6) / 6, abs=1e-5)
    assert r["ceiling_steps"] == 2
    assert (r["tokens_lost"], r["tokens_lost_lo"], r["tokens_lost_hi"]) == pytest.approx((2.0, 0.0, 4.0))
    assert r["decode_steps"] == 4 and r["graph_tokens"] == 24 and r["padded_tokens"] == 2 + 1 + 3 + 1
    assert r["padding_share"] == pytest.approx(7 / 24)
    assert r["dp_tier_tokens"] == 2  # rank 0 step 1 rounded 6 up to 8; rank 1 reports no DP tiers
    assert r["fit_steps"] == 3 and r["costtable_mape"] == pytest.approx((0.25 + 0 + 0.2) / 3)
    # steps in order (fct 1 rank 0, fct 1 rank 1 | fct 2 rank 0, fct 2 rank 1): halves 0.225 and 0
    assert r["costtable_mape_first_half"] == pytest.approx(0.225) and r["costtable_mape_second_half"] == 0
    assert r["costtable_mape_drift"] == pytest.approx(-0.225)


def test_figures_by_workload_and_rank(store):
    frame = health.figures(sql.connect(store.root))
    g = _row(frame, workload="gsm8k")
    assert (g["request_steps"], g["trimmed_steps"], g["budget_trimmed_steps"], g["censored_steps"]) == (3, 2, 1, 1)
    assert pd.isna(g["padded_tokens"])  # a step serves many workloads: step figures only on '*' rows
    r1 = _row(frame, dp_rank="1")
    assert (r1["request_steps"], r1["verified_tokens"], r1["padded_tokens"], r1["fit_steps"]) == (2, 4, 4, 1)
    assert pd.isna(r1["dp_tier_tokens"])
    only = health.figures(sql.connect(store.root), workloads=["poetry"], dp_ranks=[0])
    assert _row(only)["request_steps"] == 2 and set(only["workload"]) == {"*", "poetry"}


def test_by_position_by_hand(store):
    pos = health.by_position(sql.connect(store.root)).set_index("position")
    assert pos.loc[1, "n"] == 4 and pos.loc[1, "actual"] == 1.0
    assert pos.loc[1, "expected"] == pytest.approx((0.9 + 0.8 + 0.9 + 0.95) / 4, abs=1e-6)
    assert pos.loc[2, "n"] == 3 and pos.loc[2, "actual"] == pytest.approx(2 / 3)
    assert pos.loc[2, "expected"] == pytest.approx((0.6 + 0.5 + 0.9) / 3, abs=1e-6)
    assert pos.loc[3, "n"] == 1 and pos.loc[3, "actual"] == 0 and pos.loc[3, "expected"] == pytest.approx(0.3)


def test_memory_connection_gives_the_store_figures(store):
    con = sql.connect(store.root)
    steps = con.sql("SELECT * EXCLUDE (run_id) FROM steps").to_arrow_table()
    reqs = con.sql("SELECT * EXCLUDE (run_id) FROM step_reqs").to_arrow_table()
    mem = health.memory_connection(steps, reqs, run_id="live", gamma=GAMMA)
    got, want = _row(health.memory_figures(mem), dp_rank="0"), _row(health.figures(con), dp_rank="0")
    for col in ("request_steps", "budget_trimmed_steps", "censored_steps", "verified_tokens", "padded_tokens",
                "expected_accepted", "costtable_mape"):
        assert got[col] == pytest.approx(want[col]), col
    again = health.memory_connection(steps.slice(0, 1), reqs.slice(0, 2), run_id="live", gamma=GAMMA, con=mem)
    assert again is mem and _row(health.memory_figures(mem))["request_steps"] == 2


def test_empty_store_gives_no_rows(tmp_path):
    Store(tmp_path / "e").upsert_run("x", started_at=T0, source="emulator")
    assert health.figures(sql.connect(tmp_path / "e")).empty
    assert health.run_row(health.figures(sql.connect(tmp_path / "e"))) is None


# -- verdicts ------------------------------------------------------------------------------

ROW = {"request_steps": 1000, "gamma": 6, "trimmed_steps": 600, "budget_trimmed_steps": 300,
       "budget_trimmed_share": 0.3, "trimmed_share": 0.6, "window_sizes": 5, "trim_ratio": 0.8,
       "censored_steps": 120, "trim_regret": 0.2, "tokens_lost": None, "acceptance": 0.8, "spec_accept_rate": 0.6,
       "expected_accepted": 2100.0, "survival_accepted": 2000, "survival_steps": 1000,
       "costtable_mape": 0.05, "costtable_mape_drift": 0.0, "fit_steps": 300,
       "padding_share": 0.1, "padded_tokens": 100, "graph_tokens": 1000, "dp_tier_tokens": None}


def _codes(findings, severity=None):
    return [f.code for f in findings if severity is None or f.severity == severity]


def test_no_cost_table_is_trimming_inactive_naming_the_flag():
    state = health.ServerState.from_args({"speculative_algorithm": "DSPARK",
                                          "speculative_dspark_sps_table_path": None}, mode="compact")
    found = health.diagnose({**ROW, "budget_trimmed_steps": 0, "budget_trimmed_share": 0.0}, state=state)
    assert found[0].severity == "fail" and found[0].code == "trimming_inactive"
    assert health.COST_TABLE_FLAG in found[0].fix and "no cost table" in found[0].what
    assert "no_cost_table" not in _codes(found)  # one finding for one cause
    assert not any(c.startswith("costtable") for c in _codes(found))  # the flat placeholder predicts nothing
    assert health.exit_code(found, "fail") == 1 and health.exit_code(found, "warn") == 1


def test_a_healthy_run_passes_and_the_ranking_puts_the_worst_first():
    state = health.ServerState.from_args({"speculative_dspark_sps_table_path": "/t.json",
                                          "speculative_dspark_confidence_sts_path": "/s.json"}, mode="compact")
    found = health.diagnose(ROW, state=state)
    assert health.exit_code(found, "warn") == 0
    assert set(_codes(found, "ok")) >= {"trimming_active", "trim_regret", "expected_vs_actual", "costtable_fit",
                                       "padding"}
    bad = health.diagnose({**ROW, "trim_regret": 0.7, "costtable_mape": 0.5}, state=state)
    assert _codes(bad, "warn") == ["trim_regret", "costtable_fit"]
    assert [f.severity for f in bad] == sorted([f.severity for f in bad], key=health.SEVERITIES.index)
    assert health.exit_code(bad, "warn") == 1 and health.exit_code(bad, "fail") == 0


def test_verdict_limits_come_from_the_thresholds_file(tmp_path):
    from dspark_obs.report.thresholds import load_thresholds

    path = tmp_path / "t.toml"
    path.write_text("version = 1\n[metrics.trim_regret]\nmax = 0.1\n[metrics.padding_share]\nmax = 0.05\n")
    lim = health.Limits.from_thresholds(load_thresholds(path))
    assert lim.max_trim_regret == 0.1 and lim.max_padding_share == 0.05
    found = health.diagnose(ROW, limits=lim)
    assert {"trim_regret", "padding"} <= set(_codes(found, "warn"))


def test_server_findings():
    f = health.server_findings(health.ServerState(mode="compact", algorithm="EAGLE"))
    assert _codes(f) == ["not_dspark"]
    f = health.server_findings(health.ServerState.from_args(
        {"speculative_algorithm": "DSPARK", "enable_metrics": False, "emulator_sps_table": "builtin",
         "env": {"SGLANG_DSPARK_DEBUG_DUMP": "core", "SGLANG_RAGGED_VERIFY_MODE": "static"}}))
    assert _codes(f) == ["static_mode", "records_components", "metrics_off"]
    assert "reqs" in f[1].what and "SGLANG_RAGGED_VERIFY_MODE=compact" in f[0].fix
    assert health.ServerState.from_args({"emulator_sps_table": "builtin"}).cost_table_loaded
    assert not health.ServerState.from_args({"emulator_sps_table": "none"}).cost_table_loaded
    with pytest.raises(ValueError, match="fail_on must be warn or fail"):
        health.exit_code([], "info")


def test_few_steps_are_not_judged():
    found = health.diagnose({**ROW, "request_steps": 10, "budget_trimmed_share": 0.0})
    assert "few_steps" in _codes(found, "info") and health.exit_code(found, "warn") == 0


def test_observation_overhead_by_hand(tmp_path):
    s = Store(tmp_path / "data")
    # the collector timed 40 polls and clears: 0.5 s of the server's time over 20 s of collection
    s.upsert_run("o", started_at=T0, ended_at=T0, source="emulator", mode="compact", gamma=GAMMA,
                 observation_requests=40, observation_server_s=0.5, collect_s=20.0)
    timed = [10.0, 20.0, None, 30.0]  # step_cpu_ms: the step loop's period (null after a gap)
    s.write("steps", "o", [{**st, "step_cpu_ms": ms} for st, ms in zip(STEPS, timed)])
    s.write("step_reqs", "o", REQS)
    frame = health.figures(sql.connect(s.root), runs=["o"])
    r = _row(frame)
    assert r["observation_share"] == pytest.approx(0.5 / 20.0)
    assert r["poll_ms"] == pytest.approx(12.5) and r["timed_steps"] == 3 and r["step_cpu_ms"] == pytest.approx(20.0)
    assert r["poll_step_ratio"] == pytest.approx(12.5 / 20.0)
    assert _row(frame, dp_rank="0")["step_cpu_ms"] == pytest.approx(15.0)
    assert pd.isna(_row(frame, dp_rank="0")["observation_share"])  # a run figure: pooled rows only
    ok = {f.code: f for f in health.diagnose(health.run_row(frame))}["observation_overhead"]
    assert ok.severity == "ok" and "0.50 s of the collector's 20.0 s" in ok.evidence and "40 polls" in ok.evidence
    warn = {f.code: f for f in health.diagnose(health.run_row(frame), limits=health.Limits(
        max_observation_share=0.02))}["observation_overhead"]
    assert warn.severity == "info" and "--poll-interval" in warn.fix and "SGLANG_DSPARK_DEBUG_DUMP" in warn.fix
    assert "12.5 ms, 0.62 x the mean step (20.0 ms)" in warn.evidence


def test_observation_overhead_is_not_judged_while_the_run_is_open(store):
    r = health.run_row(health.figures(sql.connect(store.root), runs=["r"]))
    assert r["observation_share"] is None
    assert "observation_overhead" not in {f.code for f in health.diagnose(r)}


def test_the_report_gates_the_observation_share(tmp_path):
    from dspark_obs.report.gates import threshold_verdict
    from dspark_obs.report.inputs import RunInfo
    from dspark_obs.report.thresholds import load_thresholds
    from dspark_obs.report.trimming import health_section

    s = Store(tmp_path / "data")
    s.upsert_run("o", started_at=T0, ended_at=T0, source="emulator", mode="compact", gamma=GAMMA,
                 observation_requests=40, observation_server_s=3.0, collect_s=20.0)
    s.write("steps", "o", STEPS)
    s.write("step_reqs", "o", REQS)
    run = RunInfo("o", "compact", GAMMA, "emulator", T0, T0, None, 4, 6, 2)
    fig = next(f for f in health_section(sql.connect(s.root), [run]).figures if f.metric == "observation_share")
    assert fig.value == pytest.approx(0.15) and fig.n == 40 and fig.detail["poll_ms"] == pytest.approx(75.0)
    verdict = threshold_verdict(fig, load_thresholds())
    assert verdict.verdict == "none" and verdict.limit == 0.05  # an upper bound: shown, not gated
