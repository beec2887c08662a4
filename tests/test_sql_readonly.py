"""Tests for dspark_obs.sql_readonly: every bypass of issue 13 against `dspark-obs sql` and the console.

Each bypass is tried twice: through the statement check (the message names
what was refused) and, with the check skipped, against the engine itself (the
connection cannot touch a file).  After every attempt the store's files are
compared with a snapshot: nothing added, nothing removed, nothing rewritten.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from dspark_obs import sql, sql_readonly
from dspark_obs.cli import app
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
runner = CliRunner()


def _step(forward_ct: int) -> dict:
    return {"dp_rank": 0, "forward_ct": forward_ct, "segment": 0, "bs": 1, "num_running_reqs": 1,
            "mode": "compact", "num_verify_tokens": 4, "verify_tokens_local": 4,
            "verify_tokens_dp_synced": 4, "verify_tokens_graph_key": 4}


@pytest.fixture
def root(tmp_path) -> Path:
    s = Store(tmp_path / "data")
    s.upsert_run("r1", started_at=T0, source="emulator", mode="compact", gamma=3)
    s.write("steps", "r1", [_step(1), _step(2)])
    s.write("requests", "r1", [{"rid": "a", "workload": "math", "temperature": 0.0}])
    s.write("tokens", "r1", [{"rid": "a", "pos": 0, "token_id": 7}, {"rid": "a", "pos": 1, "token_id": 8}])
    return s.root


def _snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _bypasses(root: Path) -> dict[str, str]:
    """The statements that wrote or changed the store through the old 'read-only' SQL."""
    part = root / "steps" / "run_id=r1" / "part-99990101T000000000000Z-evil.parquet"
    return {
        "explain_analyze_copy_into_run": f"EXPLAIN ANALYZE COPY (SELECT * FROM steps) TO '{part}' (FORMAT parquet)",
        "explain_analyze_copy_new_partition": (
            f"EXPLAIN ANALYZE COPY (SELECT * REPLACE ('evil' AS run_id) FROM steps) TO '{root / 'steps'}' "
            "(FORMAT parquet, PARTITION_BY (run_id), APPEND, FILENAME_PATTERN 'part-evil-{uuid}')"),
        "explain_analyze_copy_overwrite": (
            f"EXPLAIN ANALYZE COPY (SELECT * FROM tokens WHERE false) TO '{root / 'tokens'}' "
            "(FORMAT parquet, PARTITION_BY (run_id), OVERWRITE)"),
        "explain_options_analyze_copy": f"EXPLAIN (ANALYZE, FORMAT json) COPY (SELECT 1) TO '{part}'",
        "explain_analyze_create_view": "EXPLAIN ANALYZE CREATE OR REPLACE VIEW requests AS SELECT 'x' AS rid",
        "explain_analyze_insert_cte": "EXPLAIN ANALYZE WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a",
        "copy": f"COPY (SELECT 1) TO '{part}'",
        "create_view": "CREATE OR REPLACE VIEW requests AS SELECT 'x' AS rid",
        "attach": f"ATTACH '{root / 'evil.duckdb'}' AS evil",
        "import_database": f"IMPORT DATABASE '{root}'",
        "pragma_import": f"PRAGMA import_database('{root}')",
        "set_external_access": "SET enable_external_access = true",
        "install": "INSTALL httpfs",
    }


@pytest.mark.parametrize("name", sorted(_bypasses(Path("/x"))))
def test_statement_check_refuses_each_bypass(root, name):
    before = _snapshot(root)
    with pytest.raises(PermissionError, match=r"read-only: .* (refused|is refused)"):
        sql_readonly.run(root, _bypasses(root)[name])
    assert _snapshot(root) == before


@pytest.mark.parametrize("name", ["explain_analyze_copy_into_run", "explain_analyze_copy_new_partition",
                                  "explain_analyze_copy_overwrite", "copy", "attach", "import_database",
                                  "set_external_access"])
def test_engine_refuses_file_access_even_without_the_check(root, name):
    """The second lock: skip the statement check and run on the connection directly."""
    before = _snapshot(root)
    con = sql_readonly.open_connection(root)
    try:
        with pytest.raises(duckdb.Error, match=r"(?i)disabled by configuration|locked|permission"):
            con.execute(_bypasses(root)[name])
    finally:
        con.close()
    assert _snapshot(root) == before


def test_reading_statements_still_run(root):
    run = sql_readonly.run
    assert run(root, "SELECT count(*) AS n FROM steps").column("n").to_pylist() == [2]
    plan = run(root, "EXPLAIN ANALYZE SELECT count(*) FROM steps")
    assert plan.num_rows >= 1
    assert run(root, "EXPLAIN (FORMAT json) SELECT 1").num_rows >= 1
    assert "forward_ct" in run(root, "DESCRIBE steps").column("column_name").to_pylist()
    assert "forward_ct" in run(root, "PRAGMA table_info('steps')").column("name").to_pylist()
    assert run(root, "FROM runs SELECT run_id").column("run_id").to_pylist() == ["r1"]
    assert run(root, "gaps_summary").num_rows == 0  # canned queries run the same way


def test_files_outside_the_store_are_unreachable(root):
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        sql_readonly.run(root, "SELECT * FROM read_csv('/etc/hostname')")
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        sql_readonly.run(root, f"SELECT * FROM read_parquet('{root}/steps/*/*.parquet')")


def test_a_query_changes_nothing_the_next_query_sees(root):
    """Each query has its own connection: a variable or view set by one is gone for the next."""
    con = sql_readonly.open_connection(root)
    con.execute("CREATE TEMP TABLE leftover AS SELECT 1")  # on the connection, bypassing run()
    con.close()
    with pytest.raises(duckdb.Error, match="leftover"):
        sql_readonly.run(root, "SELECT * FROM leftover")
    assert sql_readonly.run(root, "SELECT rid FROM requests").column("rid").to_pylist() == ["a"]


def test_trusted_connection_refuses_explain_analyze_of_writes(root):
    con = sql.connect(root)
    before = _snapshot(root)
    for name in ("explain_analyze_copy_into_run", "explain_analyze_create_view", "import_database"):
        with pytest.raises(PermissionError, match="read-only"):
            sql.query(con, _bypasses(root)[name])
    assert sql.query(con, "SELECT rid FROM requests").column("rid").to_pylist() == ["a"]
    assert _snapshot(root) == before


# -- dspark-obs sql -------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(_bypasses(Path("/x"))))
def test_cli_sql_refuses_each_bypass_and_exits_2(root, name):
    before = _snapshot(root)
    result = runner.invoke(app, ["sql", "--data", str(root), _bypasses(root)[name]])
    assert result.exit_code == 2, result.output
    assert "read-only" in " ".join(result.output.split())
    assert _snapshot(root) == before


def test_cli_sql_prints_stored_markup_as_text(root):
    Store(root).write("requests", "r1", [{"rid": "[/x]", "workload": "[bold]w[/bold]"}])
    result = runner.invoke(app, ["sql", "--data", str(root), "SELECT rid, workload FROM requests ORDER BY rid"])
    assert result.exit_code == 0, result.output
    assert "[/x]" in result.output and "[bold]w[/bold]" in result.output


# -- the dashboard console ------------------------------------------------------

def test_console_refuses_bypasses_and_sessions_do_not_share_state(root):
    from dspark_obs.ui.data import DataSource

    session_a, session_b = DataSource(root), DataSource(root)
    before = _snapshot(root)
    for name, text in _bypasses(root).items():
        with pytest.raises(PermissionError, match="read-only"):
            session_a.console(text, None, limit=10, timeout_s=30)
    assert _snapshot(root) == before
    got = session_b.console("SELECT rid FROM requests", None, limit=10, timeout_s=30)
    assert got.column("rid").to_pylist() == ["a"]


def test_console_page_shows_the_refusal(root, monkeypatch):
    from streamlit.testing.v1 import AppTest

    import dspark_obs.ui

    monkeypatch.setenv("DSPARK_OBS_DATA", str(root))
    at = AppTest.from_file(str(Path(dspark_obs.ui.__file__).with_name("app.py")), default_timeout=600)
    at = at.switch_page("app_pages/sql_console.py").run()
    before = _snapshot(root)
    at.text_area(key="sql_text").set_value(_bypasses(root)["explain_analyze_copy_into_run"])
    at.button[0].click().run()
    assert not at.exception
    message = re.sub(r"\s+", " ", at.error[0].value)
    assert "read-only" in message and "EXPLAIN of a COPY" in message
    assert _snapshot(root) == before
