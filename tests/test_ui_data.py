"""The dashboard's queries (sql/ui_*.sql) and data access (dspark_obs.ui.data), hand-computed on a tiny store."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from dspark_obs import sql
from dspark_obs.store import Store
from dspark_obs.ui.data import Filters, query_parameters, run_query

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
UI_QUERIES = sorted(n for n in sql.canned_queries() if n.startswith("ui_"))


def _req(rid, workload, submitted, **kw):
    return {"rid": rid, "workload": workload, "temperature": 0.0, "prompt_tokens": 10, "completion_tokens": 8,
            "submitted_at": submitted, "finished_at": submitted + dt.timedelta(seconds=2), "e2e_latency_s": 2.0,
            "concurrency": 2, "spec_verify_ct": 3, **kw}


def _sr(fct, rid, prefix, verify_len, correct, cap_trim=0, conf=(0.9, 0.8, 0.5)):
    surv = [conf[0], conf[0] * conf[1], conf[0] * conf[1] * conf[2]]
    return {"dp_rank": 0, "forward_ct": fct, "segment": 0, "rid": rid, "req_pool_index": 0, "prefix_len": prefix,
            "verify_len": verify_len, "acc_len": correct + 1, "correct_drafts": correct, "cap_trim": cap_trim,
            "bonus_token": 7, "draft_tokens": [1, 2, 3], "confidence": list(conf), "survival": surv}


def _ce(fct, rid, workload, prefix, window, correct, lo, mid, hi, category="exact_in_window"):
    return {"dp_rank": 0, "forward_ct": fct, "segment": 0, "rid": rid, "workload": workload, "temperature": 0.0,
            "prefix_len": prefix, "window": window, "correct_drafts": correct,
            "censored": category != "exact_in_window", "category": category, "walked": 0,
            "lo": lo, "mid": mid, "hi": hi, "method": "default"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """r1: compact (gamma 3) with requests a (math, T0) and b (poetry, T0 + 60 s); r2: its cap-accept companion."""
    root = tmp_path_factory.mktemp("ui-data")
    s = Store(root)
    s.upsert_run("r1", started_at=T0, ended_at=T0 + dt.timedelta(seconds=100), source="emulator", mode="compact",
                 gamma=3, dp_size=1, labels={"method": "compact"})
    s.upsert_run("r2", started_at=T0 + dt.timedelta(seconds=200), ended_at=T0 + dt.timedelta(seconds=300),
                 source="emulator", mode="cap-accept", gamma=3, dp_size=1, companion_of="r1")
    s.write("requests", "r1", [_req("a", "math", T0), _req("b", "poetry", T0 + dt.timedelta(seconds=60))])
    s.write("requests", "r2", [_req("a", "math", T0 + dt.timedelta(seconds=200))])
    s.write("step_reqs", "r1", [_sr(1, "a", 10, 4, 3), _sr(2, "a", 14, 2, 1), _sr(2, "b", 20, 1, 0),
                                _sr(3, "a", 16, 3, 0)])
    s.write("step_reqs", "r2", [_sr(1, "a", 10, 4, 3), _sr(2, "a", 14, 2, 1, cap_trim=1), _sr(3, "a", 16, 3, 0)])
    steps = [{"dp_rank": 0, "forward_ct": f, "segment": 0, "bs": bs, "num_running_reqs": bs, "mode": "compact",
              "budget": b, "lag_steps": 2, "num_verify_tokens": 8, "verify_tokens_local": 8,
              "verify_tokens_dp_synced": 8, "verify_tokens_graph_key": 8, "step_gpu_ms": ms, "predicted_step_ms": 9.0}
             for f, bs, b, ms in ((1, 1, 3, 9.0), (2, 2, 2, 10.0), (3, 1, 2, 11.0))]
    s.write("steps", "r1", steps)
    s.write("gaps", "r1", [{"dp_rank": 0, "first_missing_forward_ct": 5, "last_missing_forward_ct": 6,
                            "reason": "clear", "segment": 0, "detected_at": T0}])
    s.write("ceiling", "r1", [
        _ce(1, "a", "math", 10, 3, 3, 3, 3, 3), _ce(2, "a", "math", 14, 1, 1, 1, 2, 3, "censored_diverged"),
        _ce(2, "b", "poetry", 20, 0, 0, 0, 0.5, 3, "censored_diverged"), _ce(3, "a", "math", 16, 2, 0, 0, 0, 0)])
    s.write("tokens", "r1", [{"rid": "a", "pos": p, "token_id": 100 + p, "logprob": -0.1 * p} for p in range(8)])
    return root


@pytest.fixture
def con(root):
    return sql.connect(root)


def _rows(con, name, filters=None, **extra):
    return run_query(con, name, filters, **extra).to_dict("records")


def test_every_ui_query_declares_its_columns_and_is_empty_on_an_empty_store(tmp_path):
    con = sql.connect(tmp_path)
    assert len(UI_QUERIES) >= 16
    for name in UI_QUERIES:
        description, text = sql.canned_queries()[name]
        assert description.startswith("Dashboard"), name
        assert text.isascii(), name  # DuckDB's tokenizer positions are bytes
        declared = text.split("-- Output columns:")[1].split("\n--\n")[0]
        declared = [c.strip() for ln in declared.splitlines() if ln.startswith("--")
                    for c in ln.lstrip("-").split(",") if c.strip()]
        got = sql.query(con, name)
        assert got.num_rows == 0, name
        assert got.column_names == declared, name


def test_ui_queries_return_plain_numbers_not_decimals(con):
    needs = {"ui_request_steps": {"run_id": "r1", "rid": "a"}, "ui_request_tokens": {"run_id": "r1", "rid": "a"},
             "ui_run_info": {"run_id": "r1"}}
    for name in UI_QUERIES:
        table = sql.query(con, name, needs.get(name))  # result types do not depend on the rows
        assert not [f.name for f in table.schema if str(f.type).startswith("decimal")], name  # HUGEINT sums


def test_ui_runs_counts_what_each_run_collected(con):
    rows = {r["run_id"]: r for r in _rows(con, "ui_runs")}
    assert [*rows] == ["r1", "r2"]
    r1 = rows["r1"]
    assert (r1["mode"], r1["method"], r1["duration_s"], r1["requests"], r1["steps"], r1["request_steps"]) == \
        ("compact", "compact", 100.0, 2, 3, 4)
    assert (r1["gaps"], r1["missing_forward_cts"], r1["dead_letters"]) == (1, 2, 0)
    assert rows["r2"]["method"] == "cap-accept" and rows["r2"]["companion_of"] == "r1"


def test_ui_workloads_hand_computed(con):
    rows = {(r["run_id"], r["workload"]): r for r in _rows(con, "ui_workloads")}
    math = rows[("r1", "math")]
    assert math["mean_acc_len"] == pytest.approx(7 / 3) and math["mean_window"] == pytest.approx(2.0)
    assert math["full_window_share"] == pytest.approx(1 / 3) and math["censored_share"] == pytest.approx(1 / 3)
    assert (math["ceiling_len"], math["ceiling_len_lo"], math["ceiling_len_hi"]) == \
        pytest.approx((8 / 3, 7 / 3, 3.0))
    assert math["ceiling_source"] == "estimate" and math["utilisation"] == pytest.approx(7 / 8)
    total = rows[("r1", "*")]
    assert total["requests"] == 2 and total["mean_acc_len"] == pytest.approx(2.0)
    assert total["censored_share"] == pytest.approx(0.5) and total["utilisation"] == pytest.approx(8 / 9.5)
    cap = rows[("r2", "math")]
    assert cap["ceiling_source"] == "exact" and cap["ceiling_len"] == pytest.approx(8 / 3)
    assert cap["ceiling_len_lo"] == cap["ceiling_len_hi"] == cap["ceiling_len"]
    assert cap["utilisation"] == pytest.approx(7 / 8) and cap["censored_share"] == 0


def test_filters_restrict_runs_workloads_ranks_and_time(con):
    only_b = _rows(con, "ui_workloads", Filters(t0=T0 + dt.timedelta(seconds=30), t1=T0 + dt.timedelta(seconds=90)))
    assert {(r["run_id"], r["workload"]) for r in only_b} == {("r1", "*"), ("r1", "poetry")}
    assert _rows(con, "ui_workloads", Filters(dp_ranks=(1,))) == []
    poetry = _rows(con, "ui_window_dist", Filters(workloads=("poetry",)))
    assert [(r["run_id"], r["window"], r["request_steps"]) for r in poetry] == [("r1", 0, 1)]
    assert {r["run_id"] for r in _rows(con, "ui_runs", Filters(runs=("r2",)))} == {"r2"}
    timeline = _rows(con, "ui_budget_timeline", Filters(t0=T0 + dt.timedelta(seconds=30)), buckets=10)
    assert [r["forward_ct"] for r in timeline] == [2]  # b's only step


def test_ui_window_dist_exact_utilisation_and_estimates(con):
    rows = {(r["run_id"], r["workload"], r["window"]): r for r in _rows(con, "ui_window_dist")}
    r2 = rows[("r2", "math", 1)]  # one step: 1 accepted + 1 trimmed by cap-accept
    assert (r2["accepted_tokens"], r2["ceiling_tokens"], r2["ceiling_source"]) == (2, 3.0, "exact")
    assert r2["utilisation"] == pytest.approx(2 / 3)
    r1 = rows[("r1", "math", 1)]
    assert (r1["ceiling_tokens"], r1["utilisation"], r1["ceiling_source"]) == (3.0, pytest.approx(2 / 3), "estimate")
    assert rows[("r1", "math", 3)]["share"] == pytest.approx(1 / 3)


def test_ui_ceiling_position_expectation_from_mid(con):
    rows = {(r["run_id"], r["workload"], r["position"]): r for r in _rows(con, "ui_ceiling_position")}
    # poetry's one step: mid 0.5 -> P(first 1 survive) = 0.5, lo 0 -> 0, hi 3 -> 1 at every position
    p1 = rows[("r1", "poetry", 1)]
    assert (p1["committed_share"], p1["full_block_share"], p1["full_block_lo"], p1["full_block_hi"]) == (0, 0.5, 0, 1)
    assert rows[("r2", "math", 2)]["full_block_share"] == pytest.approx(2 / 3)  # blocks 3, 2, 0
    assert rows[("r2", "math", 2)]["source"] == "exact"


def test_ui_request_steps_pairs_the_companion_truth(con):
    rows = _rows(con, "ui_request_steps", run_id="r1", rid="a")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["truth_block"] for r in rows] == [3, 2, 0]
    assert [r["ceiling_mid"] for r in rows] == [3, 2, 0] and rows[1]["category"] == "censored_diverged"
    assert list(rows[0]["confidence"]) == pytest.approx([0.9, 0.8, 0.5])
    assert _rows(con, "ui_request_steps") == []


def test_ui_request_tokens_maps_tokens_to_steps(con):
    rows = _rows(con, "ui_request_tokens", run_id="r1", rid="a")
    assert [(r["pos"], r["source"]) for r in rows] == [
        (0, "prefill"), (1, "draft"), (2, "draft"), (3, "draft"), (4, "bonus"), (5, "draft"), (6, "bonus"),
        (7, "bonus")]
    assert [r["step"] for r in rows][1:] == [1, 1, 1, 1, 2, 2, 3]


def test_ui_throughput_and_request_list(con):
    tp = {(r["run_id"], r["workload"]): r for r in _rows(con, "ui_throughput")}
    total = tp[("r1", "*")]
    # 16 tokens over sum(e2e) / concurrency = 4 s / 2: 8 tok/s; per request 8 / 2 = 4 tok/s
    assert (total["throughput_tok_s"], total["per_user_tok_s"], total["method"]) == (8.0, 4.0, "compact")
    # a workload's share: its 8 tokens over the run's busy time (2 s), never its own extrapolated load
    assert tp[("r1", "math")]["throughput_tok_s"] == 4.0
    assert (total["clock"], tp[("r1", "math")]["clock"]) == ("wall", "wall")  # unrecorded clock: wall
    only_math = {(r["run_id"], r["workload"]): r for r in _rows(con, "ui_throughput", Filters(workloads=("math",)))}
    assert only_math[("r1", "*")]["throughput_tok_s"] == 4.0  # filtering a workload out lowers the total
    assert [r["rid"] for r in _rows(con, "ui_request_list", rid_like="B", max_rows=10)] == ["b"]
    assert len(_rows(con, "ui_request_list", max_rows=1)) == 1


def test_run_query_binds_only_declared_parameters(con):
    assert query_parameters("ui_options") == frozenset()
    assert query_parameters("ui_budget_timeline") == {"runs", "dp_ranks", "t0", "t1", "buckets"}
    assert len(run_query(con, "ui_options", Filters(runs=("r1",)))) == 1  # filters it does not take are left out
    with pytest.raises(ValueError, match=r"takes no parameters \['bogus'\]"):
        run_query(con, "ui_runs", bogus=1)
    with pytest.raises(KeyError, match="no canned query 'ui_nope'"):
        query_parameters("ui_nope")


def test_filters_params():
    f = Filters(runs=("a",), workloads=None, dp_ranks=(0, 1), t0=T0)
    assert f.params() == {"runs": ["a"], "workloads": None, "dp_ranks": [0, 1], "t0": T0, "t1": None}


def test_ui_latency_percentiles_and_itl_hand_computed(tmp_path):
    s = Store(tmp_path)
    s.upsert_run("v", started_at=T0, source="emulator", mode="compact", gamma=3, dp_size=1, clock="virtual")
    s.write("requests", "v", [_req(f"r{i}", "math", T0, e2e_latency_s=float(i), ttft_s=0.1 * i,
                                   completion_tokens=11) for i in range(1, 6)])
    row = {r["workload"]: r for r in _rows(sql.connect(tmp_path), "ui_latency")}["*"]
    assert (row["clock"], row["requests"], row["e2e_p50_s"]) == ("virtual", 5, 3.0)
    assert row["ttft_p90_s"] == pytest.approx(0.46)  # quantile_cont over 0.1 .. 0.5
    assert row["itl_p50_s"] == pytest.approx((3.0 - 0.3) / 10)  # (e2e - ttft) / (tokens - 1)


def test_ui_worst_requests_ranks_by_tokens_lost_and_cap_accept_is_observed(con):
    worst = _rows(con, "ui_worst_requests", run_id="r1")
    # a: censored step 2 mid 2 vs 1 correct -> 1 lost; b: 0.5 - 0 -> 0.5
    assert [(r["rid"], r["tokens_lost"]) for r in worst] == [("a", 1.0), ("b", 0.5)]
    assert worst[0]["utilisation"] == pytest.approx(7 / 8)  # a committed 4 + 2 + 1 tokens in its steps, lost 1
    cap = _rows(con, "ui_worst_requests", run_id="r2")
    assert [(r["rid"], r["tokens_lost"]) for r in cap] == [("a", 1.0)]  # sum of cap_trim, observed


def test_ui_ceiling_categories_shows_cap_accept_steps_as_observed(con, root):
    Store(root).write("ceiling", "r2", [_ce(1, "a", "math", 10, 3, 3, 3, 3, 3, "censored_diverged")])
    cats = {(r["run_id"], r["category"]) for r in _rows(sql.connect(root), "ui_ceiling_categories")}
    assert ("r2", "observed_cap_accept") in cats and not any(r == "r2" and c != "observed_cap_accept"
                                                            for r, c in cats)
    Store(root).drop_run("ceiling", "r2")


def test_ui_verdicts_reads_the_latest_report_with_its_limits(tmp_path):
    s = Store(tmp_path)

    def row(report, at, metric, verdict, value, kind="max", limit=0.05, position=None):
        return {"report_id": report, "generated_at": at, "report_status": "pass", "section": "calibration",
                "metric": metric, "workload": "gsm8k", "position": position, "value": value,
                "limit_kind": kind, "limit_value": limit, "verdict": verdict}

    s.write("reports", "r1", [row("old", T0, "ece", "fail", 0.2),
                              row("new", T0 + dt.timedelta(days=1), "debiased_ece", "warn", 0.06, position=1),
                              row("new", T0 + dt.timedelta(days=1), "debiased_ece", "pass", 0.04, position=2),
                              row("new", T0 + dt.timedelta(days=1), "auroc", "pass", 0.8, kind="min", limit=0.75)])
    v = _rows(sql.connect(tmp_path), "ui_verdicts")
    assert {r["report_id"] for r in v} == {"new"}
    first = v[0]  # the worst first
    assert (first["metric"], first["verdict"], first["worst_value"], first["rows"]) == ("debiased_ece", "warn", 0.06, 2)
    from dspark_obs.ui.verdicts import limits

    assert limits(pd.DataFrame(v)) == {"debiased_ece": (0.05, "max"), "auroc": (0.75, "min")}
