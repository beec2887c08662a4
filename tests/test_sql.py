"""Tests for dspark_obs.sql: views over the store, canned queries, limits, formatting."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pyarrow as pa
import pytest

from dspark_obs import schema, sql
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
GAMMA = 3


def _step(forward_ct: int, bs: int, tokens: int, gpu: float | None, cpu: float | None, pred: float | None):
    return {"dp_rank": 0, "forward_ct": forward_ct, "segment": 0, "bs": bs, "num_running_reqs": bs,
            "mode": "compact", "num_verify_tokens": tokens, "verify_tokens_local": tokens,
            "verify_tokens_dp_synced": tokens, "verify_tokens_graph_key": tokens,
            "step_gpu_ms": gpu, "step_cpu_ms": cpu, "predicted_step_ms": pred}


def _req(forward_ct: int, rid: str, verify_len: int, correct: int, conf: list[float] | None = None):
    survival = None
    if conf is not None:
        survival, s = [], 1.0
        for c in conf:
            s *= c
            survival.append(s)
    return {"dp_rank": 0, "forward_ct": forward_ct, "segment": 0, "rid": rid, "req_pool_index": 0,
            "prefix_len": 10, "verify_len": verify_len, "acc_len": correct + 1, "correct_drafts": correct,
            "cap_trim": 0, "bonus_token": 1, "draft_tokens": [5] * GAMMA, "confidence": conf,
            "survival": survival}


def _gap(rank: int, first: int, last: int, reason: str):
    return {"dp_rank": rank, "first_missing_forward_ct": first, "last_missing_forward_ct": last,
            "reason": reason, "segment": 0, "detected_at": T0}


@pytest.fixture
def store(tmp_path) -> Store:
    """Run r1 (gamma 3): math requests a; poetry request b.  Run r2 has one step and no runs row."""
    s = Store(tmp_path)
    s.upsert_run("r1", started_at=T0, source="emulator", mode="compact", gamma=GAMMA)
    s.write("requests", "r1", [{"rid": "a", "workload": "math", "temperature": 0.0},
                               {"rid": "b", "workload": "poetry", "temperature": 1.0}])
    s.write("step_reqs", "r1", [
        _req(1, "a", 4, 3, [0.9, 0.8, 0.7]),   # window 3, all accepted
        _req(2, "a", 3, 1, [0.8, 0.5, 0.5]),   # window 2, one accepted
        _req(3, "a", 2, 0, [0.6, 0.5, 0.5]),   # window 1, none accepted
    ])
    s.write("step_reqs", "r1", [
        _req(4, "a", 4, 0, [0.5, 0.5, 0.5]),   # window 3, none accepted
        _req(4, "b", 1, 0),                    # window 0, no confidence sent
    ])
    s.write("steps", "r1", [
        _step(1, 3, 10, 10.0, 12.0, 9.0),
        _step(2, 5, 12, 20.0, None, 11.0),
        _step(3, 9, 40, 30.0, 31.0, None),
        _step(4, -1, -1, 5.0, None, None),
    ])
    s.write("gaps", "r1", [_gap(0, 10, 14, "deque_wrap"), _gap(0, 20, 20, "deque_wrap"),
                           _gap(0, 30, 30, "clear"), _gap(1, 5, 6, "deque_wrap")])
    s.write("steps", "r2", [_step(1, 1, 4, 1.0, 1.0, 1.0)])
    return s


@pytest.fixture
def con(store):
    return sql.connect(store.root)


def rows(table: pa.Table) -> list[dict]:
    return table.to_pylist()


# -- views -------------------------------------------------------------------

def test_views_exist_and_are_empty_on_an_empty_store(tmp_path):
    con = sql.connect(tmp_path)
    for table, file_schema in schema.TABLES.items():
        got = sql.query(con, f"SELECT * FROM {sql.quote_ident(table)}")
        assert got.num_rows == 0
        assert got.column_names == [*file_schema.names, "run_id"]
        for f in file_schema:
            assert got.schema.field(f.name).type.equals(f.type), (table, f.name)
    got = sql.query(con, "SELECT * FROM step_reqs_w")
    assert got.num_rows == 0
    assert got.column_names[-3:] == ["workload", "temperature", "window"]
    for name in sql.canned_queries():
        assert sql.query(con, name).num_rows == 0, name


def test_views_see_files_written_after_connect(tmp_path):
    store = Store(tmp_path)
    con = sql.connect(tmp_path)
    assert sql.query(con, "SELECT count(*) AS n FROM gaps").column("n")[0].as_py() == 0
    store.write("gaps", "r", [_gap(0, 1, 2, "clear")])
    assert sql.query(con, "SELECT count(*) AS n FROM gaps").column("n")[0].as_py() == 1
    store.write("gaps", "r", [_gap(0, 3, 4, "clear")])
    assert sql.query(con, "SELECT count(*) AS n FROM gaps").column("n")[0].as_py() == 2


def test_sql_ignores_tmp_and_foreign_files_and_keeps_run_id_a_string(tmp_path):
    store = Store(tmp_path)
    path = store.write("gaps", "007", [_gap(0, 1, 2, "clear")])
    data = path.read_bytes()
    (path.parent / f".{path.name}.tmp").write_bytes(data[: len(data) // 2])
    (path.parent / "junk.parquet").write_bytes(data[:50])
    con = sql.connect(tmp_path)
    got = sql.query(con, "SELECT run_id, typeof(run_id) AS t FROM gaps")
    assert rows(got) == [{"run_id": "007", "t": "VARCHAR"}]


def test_runs_view_keeps_newest_file_per_run(tmp_path):
    store = Store(tmp_path)
    old = store.upsert_run("r", started_at=T0, source="emulator", mode="static")
    old_bytes = old.read_bytes()
    store.upsert_run("r", mode="compact")
    old.write_bytes(old_bytes)  # a writer died between commit and cleanup
    got = sql.query(sql.connect(tmp_path), "SELECT run_id, mode FROM runs")
    assert rows(got) == [{"run_id": "r", "mode": "compact"}]


def test_step_reqs_w_joins_workload_and_window(con):
    got = sql.query(con, 'SELECT rid, workload, temperature, "window" FROM step_reqs_w ORDER BY forward_ct, rid')
    assert [(r["rid"], r["workload"], r["window"]) for r in rows(got)] == [
        ("a", "math", 3), ("a", "math", 2), ("a", "math", 1), ("a", "math", 3), ("b", "poetry", 0)]


def test_request_windows_macro_sums_per_request_and_window_and_filters(con):
    q = ('SELECT rid, "window", n, acc, all_accepted, workload, mode, gamma, exact_tokens '
         'FROM request_windows($runs, $workloads, NULL, NULL, NULL) ORDER BY rid, "window"')
    got = [tuple(r.values()) for r in rows(sql.query(con, q, {"runs": ["r1"], "workloads": None}))]
    assert got == [  # compact: no exact full-block tokens
        ("a", 1, 1, 1, 0, "math", "compact", GAMMA, None),
        ("a", 2, 1, 2, 0, "math", "compact", GAMMA, None),
        ("a", 3, 2, 5, 1, "math", "compact", GAMMA, None),  # fct 1 (3 accepted) + fct 4 (none)
        ("b", 0, 1, 1, 1, "poetry", "compact", GAMMA, None),
    ]
    only = rows(sql.query(con, q, {"runs": None, "workloads": ["poetry"]}))
    assert [(r["rid"], r["window"]) for r in only] == [("b", 0)]
    assert rows(sql.query(con, "SELECT count(*) AS n FROM ceiling_request_windows(NULL, NULL, NULL, NULL, NULL)")
                ) == [{"n": 0}]  # no estimate yet: the macro reads the empty ceiling view


# -- canned queries ------------------------------------------------------------

def test_canned_query_headers_declare_params_and_output_columns(tmp_path):
    con = sql.connect(tmp_path)
    queries = sql.canned_queries()
    # the spine's queries are always there; every query file, old or new, honours the header contract
    assert {"acceptance_by_position", "window_distribution", "window_by_workload",
            "step_time_by_shape", "gaps_summary", "run_overview"} <= set(queries)
    for name, (description, text) in queries.items():
        assert description and not description.startswith("-")
        assert "-- Parameters:" in text and "-- Output columns:" in text, name
        declared = text.split("-- Output columns:")[1].split("\n--\n")[0]
        declared = [c.strip() for ln in declared.splitlines() if ln.startswith("--")
                    for c in ln.lstrip("-").split(",") if c.strip()]
        declared = [c for c in declared if not c.startswith(("WITH", "SELECT"))]
        assert sql.query(con, name).column_names == declared, name


def test_acceptance_by_position_hand_computed(con):
    got = {(r["workload"], r["k"]): r for r in rows(sql.query(con, "acceptance_by_position"))}
    approx = pytest.approx
    k1, k2, k3 = got[("math", 1)], got[("math", 2)], got[("math", 3)]
    assert (k1["verified_steps"], k2["verified_steps"], k3["verified_steps"]) == (4, 3, 2)
    assert k1["accepted_share"] == approx(2 / 4) and k1["cond_accepted_share"] == approx(2 / 4)
    assert k2["accepted_share"] == approx(1 / 3) and k2["cond_accepted_share"] == approx(1 / 2)
    assert k3["accepted_share"] == approx(1 / 2) and k3["cond_accepted_share"] == approx(1.0)
    assert k1["mean_confidence"] == approx(0.7, rel=1e-6)
    assert k2["mean_confidence"] == approx(0.6, rel=1e-6)
    assert k2["mean_survival"] == approx((0.72 + 0.4 + 0.25) / 3, rel=1e-6)
    assert k3["mean_survival"] == approx((0.504 + 0.125) / 2, rel=1e-6)
    poetry = [got[("poetry", k)] for k in (1, 2, 3)]
    assert [p["verified_steps"] for p in poetry] == [0, 0, 0]
    assert all(p["accepted_share"] is None for p in poetry)


def test_window_distribution_hand_computed(con):
    got = [(r["workload"], r["window"], r["steps"], r["share"]) for r in rows(sql.query(con, "window_distribution"))]
    assert got == [
        ("math", 0, 0, 0.0), ("math", 1, 1, 0.25), ("math", 2, 1, 0.25), ("math", 3, 2, 0.5),
        ("poetry", 0, 1, 1.0), ("poetry", 1, 0, 0.0), ("poetry", 2, 0, 0.0), ("poetry", 3, 0, 0.0),
    ]


def test_window_by_workload_hand_computed(con):
    got = {r["workload"]: r for r in rows(sql.query(con, "window_by_workload"))}
    math = got["math"]
    assert math["steps"] == 4
    assert math["mean_window"] == pytest.approx(9 / 4)
    assert math["full_window_share"] == pytest.approx(0.5)
    assert math["share_le3"] == pytest.approx(1.0)
    assert math["mean_acc_len"] == pytest.approx((4 + 2 + 1 + 1) / 4)
    assert (got["poetry"]["steps"], got["poetry"]["mean_window"], got["poetry"]["full_window_share"]) == (1, 0, 0)


def test_step_time_by_shape_hand_computed_and_parameters(con):
    got = rows(sql.query(con, "step_time_by_shape", {"run_id": "r1"}))
    key = [(r["bs_bucket"], r["num_verify_tokens_bucket"], r["n"]) for r in got]
    assert key == [(0, 0, 2), (8, 32, 1), (None, None, 1)]
    first = got[0]
    assert (first["median_step_gpu_ms"], first["mean_step_gpu_ms"]) == (15.0, 15.0)
    assert (first["median_step_cpu_ms"], first["mean_step_cpu_ms"]) == (12.0, 12.0)  # the null is skipped
    assert first["mean_predicted_step_ms"] == 10.0
    narrow = rows(sql.query(con, "step_time_by_shape", {"run_id": "r1", "bs_width": 4}))
    assert [r["bs_bucket"] for r in narrow] == [0, 4, 8, None]


def test_gaps_summary_hand_computed(con):
    got = [tuple(r.values()) for r in rows(sql.query(con, "gaps_summary"))]
    assert got == [("r1", 0, "clear", 1, 1), ("r1", 0, "deque_wrap", 2, 6), ("r1", 1, "deque_wrap", 1, 2)]


def test_run_overview_hand_computed(con):
    got = rows(sql.query(con, "run_overview"))
    assert got == [
        {"run_id": "r1", "source": "emulator", "mode": "compact", "gamma": 3, "started_at": T0,
         "steps": 4, "request_steps": 5, "requests": 2, "gaps": 4},
        {"run_id": "r2", "source": None, "mode": None, "gamma": None, "started_at": None,
         "steps": 1, "request_steps": 0, "requests": 0, "gaps": 0},
    ]
    assert [r["run_id"] for r in rows(sql.query(con, "run_overview", {"run_id": "r2"}))] == ["r2"]


def test_unknown_parameter_of_a_canned_query_is_an_error(con):
    with pytest.raises(ValueError, match=r"unknown parameters \['nope'\] for 'gaps_summary'.*run_id"):
        sql.query(con, "gaps_summary", {"nope": 1})


# -- query mechanics ------------------------------------------------------------

def test_limit_wraps_the_query(con):
    got = sql.query(con, "SELECT range AS i FROM range(10) ORDER BY i; -- trailing comment", limit=3)
    assert got.column("i").to_pylist() == [0, 1, 2]
    assert sql.query(con, "gaps_summary", limit=1).num_rows == 1
    with pytest.raises(ValueError, match="limit must be a non-negative integer"):
        sql.query(con, "SELECT 1", limit=-1)


def test_timeout_interrupts_a_slow_query_and_the_connection_survives(con):
    slow = "SELECT sum(a.range * b.range) AS s FROM range(1000000) a, range(1000000) b"
    with pytest.raises(sql.QueryTimeout, match=r"time limit of 0\.2 s.*larger timeout_s"):
        sql.query(con, slow, timeout_s=0.2)
    assert sql.query(con, "SELECT 42 AS x").column("x").to_pylist() == [42]


def test_read_only_rejects_writes_and_outside_files(con, tmp_path):
    with pytest.raises(PermissionError, match="read-only: COPY statements are refused"):
        sql.query(con, f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'")
    with pytest.raises(Exception, match="disabled by configuration"):
        sql.query(con, "SELECT * FROM read_csv('/etc/hostname')")
    writable = sql.connect(tmp_path, read_only=False)
    sql.query(writable, "CREATE TABLE t AS SELECT 1 AS x")
    assert sql.query(writable, "SELECT x FROM t").column("x").to_pylist() == [1]


def test_one_statement_at_a_time(con):
    with pytest.raises(ValueError, match="exactly one SQL statement, got 2"):
        sql.query(con, "SELECT 1; SELECT 2")


# -- formatting -----------------------------------------------------------------

FORMAT_INPUT = pa.table({
    "name": ["a", None, "c,d"],
    "x": [1 / 3, None, 1234567.891],
    "n": pa.array([1, 2, None], pa.int64()),
    "ts": pa.array([T0, None, T0], pa.timestamp("us", tz="UTC")),
    "xs": [[0.1, 0.25], None, []],
})


def test_csv_round_trip():
    text = sql.format_result(FORMAT_INPUT, "csv")
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert list(parsed[0]) == FORMAT_INPUT.column_names
    assert [r["name"] for r in parsed] == ["a", "", "c,d"]
    assert [r["x"] for r in parsed] == ["0.333333", "", "1234568.0"]
    assert [r["n"] for r in parsed] == ["1", "2", ""]
    assert dt.datetime.fromisoformat(parsed[0]["ts"]) == T0
    assert json.loads(parsed[0]["xs"]) == [0.1, 0.25]


def test_json_round_trip():
    parsed = json.loads(sql.format_result(FORMAT_INPUT, "json"))
    assert parsed[1] == {"name": None, "x": None, "n": 2, "ts": None, "xs": None}
    assert parsed[0]["x"] == 0.333333 and parsed[2]["x"] == 1234568.0
    assert dt.datetime.fromisoformat(parsed[2]["ts"]) == T0
    assert parsed[2]["xs"] == []
    assert json.loads(sql.format_result(FORMAT_INPUT.slice(0, 0), "json")) == []


def test_json_of_a_query_result_with_maps_and_nan(con):
    got = sql.query(con, "SELECT MAP {'k': 'v'} AS m, 'nan'::DOUBLE AS bad, 10::HUGEINT AS big")
    assert json.loads(sql.format_result(got, "json")) == [{"m": {"k": "v"}, "bad": None, "big": 10}]


def test_table_format_aligns_columns():
    text = sql.format_result(FORMAT_INPUT, "table")
    assert "name" in text and "0.333333" in text and "1234568.0" in text and "null" in text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len({len(ln) for ln in lines}) == 1  # a rectangle


def test_unknown_format_is_an_error():
    with pytest.raises(ValueError, match="unknown format 'xml'; use 'table', 'csv' or 'json'"):
        sql.format_result(FORMAT_INPUT, "xml")


def test_non_ascii_text_before_a_trailing_semicolon_survives_the_row_limit(tmp_path):
    con = sql.connect(tmp_path)
    out = sql.query(con, "SELECT 'é—x' AS s -- a comment — with a dash\n;", limit=3)
    assert out.to_pylist() == [{"s": "é—x"}]
