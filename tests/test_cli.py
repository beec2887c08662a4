"""The command line end to end: the quick demo, the sql command, and its errors."""

import csv
import io
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dspark_obs.cli import app
from dspark_obs.store import Store

runner = CliRunner()


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    proc = subprocess.run([sys.executable, "-m", "dspark_obs.cli", "demo", "--quick", "--no-dashboard",
                           "--out", str(out)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr   # its duration is a benchmark figure (bench/), not a test
    return out, proc.stderr


def test_quick_demo_leaves_two_runs_with_every_table(demo_store):
    out, log = demo_store
    store = Store(out)
    assert store.runs() == ["demo-cap-accept-s0", "demo-compact-s0"]
    for table in ("steps", "step_reqs", "requests", "tokens", "runs"):
        for run in store.runs():
            assert store.read(table, run).num_rows > 0, (table, run)
    runs = {r["run_id"]: r for r in store.read("runs").to_pylist()}
    assert runs["demo-compact-s0"]["mode"] == "compact"
    assert runs["demo-cap-accept-s0"]["mode"] == "cap-accept"
    assert runs["demo-cap-accept-s0"]["companion_of"] == "demo-compact-s0"
    assert "dspark-obs sql" in log


def test_demo_runs_commit_identical_tokens_per_rid(demo_store):
    out, _ = demo_store
    result = runner.invoke(app, ["sql", "--data", str(out), "--format", "json", """
        SELECT rid, list(token_id ORDER BY pos) FILTER (WHERE run_id = 'demo-compact-s0') AS a,
                    list(token_id ORDER BY pos) FILTER (WHERE run_id = 'demo-cap-accept-s0') AS b
        FROM tokens GROUP BY rid"""])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 90
    assert all(r["a"] == r["b"] and r["a"] for r in rows)


def test_sql_prints_one_row_per_workload_in_difficulty_order(demo_store):
    out, _ = demo_store
    result = runner.invoke(app, ["sql", "--data", str(out), "--format", "csv",
                                 "select workload, avg(verify_len) from step_reqs join requests "
                                 "using (run_id, rid) group by 1 order by 2 desc"])
    assert result.exit_code == 0, result.output
    rows = [r for r in csv.reader(io.StringIO(result.stdout)) if r]
    assert [r[0] for r in rows[1:]] == ["gsm8k", "arena-hard", "poetry"]


def test_canned_queries_run_by_name(demo_store):
    out, _ = demo_store
    for name in ("window_by_workload", "acceptance_by_position", "step_time_by_shape",
                 "window_distribution", "gaps_summary", "run_overview"):
        result = runner.invoke(app, ["sql", "--data", str(out), "--format", "json", name])
        assert result.exit_code == 0, (name, result.output)
        assert isinstance(json.loads(result.stdout), list)
    result = runner.invoke(app, ["sql", "--data", str(out), "--format", "table", "window_by_workload"])
    assert "gsm8k" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["sql", "--data", "/nonexistent", "select 1"], "is not a directory"),
    (["sql", "--data", ".", "--format", "xml", "select 1"], "--format"),
    (["collect", "--url", "http://127.0.0.1:9", "--out", "x", "--run-id", "bad id!"], "run_id"),
    (["emulate", "--mode", "fast"], "--mode"),
])
def test_bad_input_is_a_one_line_error_with_exit_2(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output


def test_a_failing_query_says_why(demo_store):
    out, _ = demo_store
    result = runner.invoke(app, ["sql", "--data", str(out), "select nope from steps"])
    assert result.exit_code == 2 and "query failed" in result.output and "nope" in result.output


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    for name in ("emulate", "collect", "sql", "demo", "queries"):
        assert name in result.output


def test_no_help_text_loses_a_placeholder_to_markdown():
    """The CLI renders help as Markdown, which drops ``<name>`` as an HTML tag: placeholders are spelled NAME."""
    import re

    import typer

    tag = re.compile(r"<[A-Za-z][^<>]*>")
    root = typer.main.get_command(app)
    lost = []
    for name, command in root.commands.items():
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        lost += [f"{name}: {t}" for t in texts if tag.search(t)]
    assert lost == []
