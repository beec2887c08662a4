"""The CLI as a newcomer meets it (issue 17): every main path at 80 columns, every bad input a clean error.

One quick demo (in process, its non-serving default) feeds the main paths; each
printed line must fit 80 columns and no cell may be cut to ``…``.  Each bad input
must exit 2 with one unwrapped ``error:`` line naming the option, the value and
what is allowed, and no traceback.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
from rich.table import Table
from typer.testing import CliRunner

from dspark_obs import console as console_mod
from dspark_obs.cli import app
from dspark_obs.collect_progress import CollectProgress
from dspark_obs.console import print_table

WIDTH = 80
runner = CliRunner(env={"COLUMNS": str(WIDTH)})


@pytest.fixture(autouse=True)
def _stderr_console_at_80(monkeypatch):
    monkeypatch.setattr(console_mod.console, "width", WIDTH)


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    """``dspark-obs demo --quick``: it must exit on its own, without serving the dashboard."""
    from dspark_obs.ui import serve as dashboard

    out = tmp_path_factory.mktemp("newcomer") / "demo-data"
    served = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dashboard, "serve_dashboard", lambda *a, **k: served.append(a))
        mp.setattr(console_mod.console, "width", WIDTH)
        result = runner.invoke(app, ["demo", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert served == []
    return out, result.output


def _invoke(args):
    result = runner.invoke(app, args)
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def _assert_fits(text: str) -> None:
    """No cell cut to ``…``; every table line within the width (commands and errors stay one line, unwrapped)."""
    assert "…" not in text
    too_wide = [line for line in text.splitlines() if len(line) > WIDTH and set(line) & set("│┃┏┡└├")]
    assert not too_wide, too_wide[:3]


def test_demo_ends_with_its_summary_and_the_command_that_opens_the_dashboard(demo_store):
    out, output = demo_store
    assert f"dspark-obs dashboard --data {out}" in " ".join(output.split())
    assert "schedule replay reproduces" in output
    _assert_fits(output)


MAIN_PATHS = {
    "sql canned": ["sql", "window_by_workload"],
    "sql wide": ["sql", "select * from ceiling", "--max-rows", "3"],
    "queries": ["queries"],
    "calibrate": ["calibrate", "--run", "demo-compact-s0", "--bootstrap", "20"],
    "costmodel": ["costmodel", "--run", "demo-compact-s0", "--no-write"],
    "estimate": ["estimate", "--run", "demo-compact-s0", "--bootstrap", "20"],
    "replay": ["replay", "--run", "demo-compact-s0", "--no-write"],
}


def _with_data(args, out):
    return args if args[0] == "queries" else [args[0], "--data", str(out), *args[1:]]


@pytest.mark.parametrize("name", list(MAIN_PATHS))
def test_each_main_path_fits_80_columns_with_no_cut_cells(demo_store, name):
    out, _ = demo_store
    result = _invoke(_with_data(MAIN_PATHS[name], out))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip()
    _assert_fits(result.output)


@pytest.mark.parametrize("name", list(MAIN_PATHS))
def test_each_table_command_prints_csv_and_json_on_stdout(demo_store, name):
    out, _ = demo_store
    args = _with_data(MAIN_PATHS[name], out)
    as_json = _invoke([*args, "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    text = as_json.stdout.strip()
    docs = [json.loads(text)] if text.startswith("[") else [json.loads(line) for line in text.splitlines()]
    rows = [r for d in docs for r in (d if isinstance(d, list) else d["rows"])]
    assert rows and all(isinstance(r, dict) for r in rows)
    as_csv = _invoke([*args, "--format", "csv"])
    assert as_csv.exit_code == 0, as_csv.output
    table = [r for r in csv.reader(io.StringIO(as_csv.stdout)) if r]
    assert len(table) >= 2 and "…" not in as_csv.stdout


def test_sql_on_a_large_table_prints_the_limit_note_and_max_rows_0_prints_all(demo_store):
    out, _ = demo_store
    total = json.loads(_invoke(["sql", "--data", str(out), "--format", "json",
                                "select count(*) as n from step_reqs"]).stdout)[0]["n"]
    assert total > 100
    cut = _invoke(["sql", "--data", str(out), "--format", "csv", "select * from step_reqs"])
    assert cut.exit_code == 0
    assert len([r for r in csv.reader(io.StringIO(cut.stdout)) if r]) == 1 + 100
    note = " ".join(cut.stderr.split())
    assert f"showing 100 of {total} rows ({total - 100} cut)" in note
    assert "--max-rows N" in note and "--max-rows 0 for all" in note
    everything = _invoke(["sql", "--data", str(out), "--format", "csv", "--max-rows", "0", "select * from step_reqs"])
    assert len([r for r in csv.reader(io.StringIO(everything.stdout)) if r]) == 1 + total
    assert "showing" not in everything.stderr


def test_sql_timeout_covers_the_printing_too(demo_store, monkeypatch):
    from dspark_obs import sql_command

    out, _ = demo_store

    def slow_render(*_a):
        raise TimeoutError("the command exceeded --timeout 5 s while printing 100 rows")

    monkeypatch.setattr(sql_command, "render", slow_render)
    result = _invoke(["sql", "--data", str(out), "--timeout", "5", "select * from steps"])
    assert result.exit_code == 2 and "exceeded --timeout 5 s while printing" in result.output


def test_unicode_labels_print_as_text_in_every_format(demo_store):
    out, _ = demo_store
    query = "select 'Genève' as place, map(['city'], ['Genève']) as labels"
    for fmt in ("table", "csv", "json"):
        result = _invoke(["sql", "--data", str(out), "--format", fmt, query])
        assert result.exit_code == 0
        assert result.stdout.count("Genève") == 2 and "\\u00e8" not in result.stdout, (fmt, result.stdout)


def test_every_commands_help_renders_at_80_columns():
    import typer

    for name in typer.main.get_command(app).commands:
        result = _invoke([name, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, name
        assert "--list" not in result.output, name


def test_make_demo_does_not_serve_and_make_dashboard_does():
    from pathlib import Path

    blocks = (Path(__file__).resolve().parents[1] / "Makefile").read_text().split("\n\n")

    def recipe(target: str) -> str:
        return next(b for b in blocks if f"\n{target}:" in "\n" + b)

    assert "dspark-obs demo" in recipe("demo") and "--serve" not in recipe("demo")
    assert "dspark-obs dashboard --data" in recipe("dashboard")


def test_help_names_no_list_option_and_points_to_queries():
    result = _invoke(["sql", "--help"])
    assert "--list" not in result.output and "dspark-obs queries" in " ".join(result.output.split())


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine\n")
    return path


BAD_INPUTS = {
    "emulate port": (["emulate", "--port", "-1"], ["'--port'", "-1", "1<=x<=65535"]),
    "emulate gamma": (["emulate", "--gamma", "0"], ["'--gamma'", "0", "1<=x<=64"]),
    "collect max-new-tokens": (["collect", "--url", "http://127.0.0.1:9", "--out", "{tmp}/d", "--workload", "gsm8k",
                                "--max-new-tokens", "-1"], ["'--max-new-tokens'", "-1", "x>=1"]),
    "collect requests": (["collect", "--url", "http://127.0.0.1:9", "--out", "{tmp}/d", "--workload", "gsm8k",
                          "--requests", "0"], ["'--requests'", "0", "x>=1"]),
    "collect poll interval": (["collect", "--url", "http://127.0.0.1:9", "--out", "{tmp}/d", "--poll-interval", "0"],
                              ["'--poll-interval'", "0", "x>0"]),
    "collect duration with workload": (["collect", "--url", "http://127.0.0.1:9", "--out", "{tmp}/d", "--workload",
                                        "gsm8k", "--duration", "5"],
                                       ["--duration 5 does nothing with --workload", "drop --duration"]),
    "collect requests without workload": (["collect", "--url", "http://127.0.0.1:9", "--out", "{tmp}/d",
                                           "--requests", "5"], ["--requests does nothing without --workload"]),
    "collect metrics port": (["collect", "--url", "http://127.0.0.1:9", "--out", "{tmp}/d", "--metrics-port",
                              "70000"], ["'--metrics-port'", "70000", "0<=x<=65535"]),
    "dashboard port": (["dashboard", "--data", "{tmp}", "--port", "0"], ["'--port'", "0", "1<=x<=65535"]),
    "demo out is a file": (["demo", "--out", "{file}"], ["--out {file} is a file", "--out demo-data"]),
    "sql canned typo": (["sql", "--data", "{tmp}", "windw_by_workload"],
                        ["'windw_by_workload' is not a canned query", "did you mean 'window_by_workload'",
                         "dspark-obs queries"]),
    "sql view as name": (["sql", "--data", "{tmp}", "steps"], ["'steps' is a view", "select * from steps"]),
    "sql param": (["sql", "--data", "{tmp}", "--param", "foo", "select 1"],
                  ["--param expects NAME=VALUE, got 'foo'"]),
    "sql unknown param": (["sql", "--data", "{tmp}", "--param", "foo=1", "window_by_workload"],
                          ["--param: unknown parameters ['foo'] for 'window_by_workload'"]),
    "sql max rows": (["sql", "--data", "{tmp}", "--max-rows", "-1", "select 1"], ["'--max-rows'", "-1", "x>=0"]),
    "sql timeout": (["sql", "--data", "{tmp}", "--timeout", "0", "select 1"], ["'--timeout'", "0", "x>0"]),
    "calibrate format": (["calibrate", "--data", "{tmp}", "--run", "r", "--format", "xml"],
                         ["--format 'xml' is not one of table, csv, json"]),
    "queries format": (["queries", "--format", "yaml"], ["--format 'yaml' is not one of table, csv, json"]),
    "estimate bootstrap": (["estimate", "--data", "{tmp}", "--bootstrap", "-1"], ["'--bootstrap'", "-1"]),
    "calibrate bootstrap": (["calibrate", "--data", "{tmp}", "--run", "r", "--bootstrap", "-1"], ["'--bootstrap'", "-1"]),
    "doctor mark crashed": (["doctor", "--data", "{tmp}", "--mark-crashed-after", "-1"],
                            ["'--mark-crashed-after'", "-1"]),
    "companion sample": (["companion", "--of", "r", "--url", "http://127.0.0.1:9", "--out", "{tmp}", "--sample", "0"],
                         ["'--sample'", "0", "x>=1"]),
    "companion fraction": (["companion", "--of", "r", "--url", "http://127.0.0.1:9", "--out", "{tmp}",
                            "--fraction", "2"], ["'--fraction'", "2", "0<=x<=1"]),
    "report bootstrap": (["report", "--data", "{tmp}", "--out", "{tmp}/r", "--bootstrap", "-1"],
                         ["'--bootstrap'", "-1", "x>=0"]),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_each_bad_input_is_one_unwrapped_error_line_with_exit_2(name, tmp_path, a_file, monkeypatch):
    args, expected = BAD_INPUTS[name]
    fill = {"tmp": str(tmp_path), "file": str(a_file)}
    monkeypatch.setattr(console_mod.console, "width", 40)  # narrower than any message: nothing may wrap
    result = runner.invoke(app, [a.format(**fill) for a in args], env={"COLUMNS": "40"})
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "╭" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    for part in expected:
        assert part.format(**fill) in errors[0], (errors[0], part)


def test_demo_out_a_file_is_refused_before_anything_runs(a_file, monkeypatch):
    import dspark_obs.demo as demo

    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("the demo started"))
    result = _invoke(["demo", "--out", str(a_file)])
    assert result.exit_code == 2 and a_file.read_text() == "mine\n"


def test_collect_progress_prints_sent_done_rows_and_gaps_every_interval():
    now = [0.0]
    lines: list[str] = []

    class Writer:
        rows_written = {"steps": 7, "step_reqs": 30}

    class Summary:
        gaps = 2

    class FakeCollector:
        writer, summary = Writer(), Summary()

    progress = CollectProgress("r1", total_requests=10, concurrency=4, emit=lines.append, every_s=5.0,
                               clock=lambda: now[0])
    progress.collector = FakeCollector()
    progress("requests", 1)
    assert lines == []  # before the interval: nothing
    now[0] = 6.0
    progress("steps", 3)
    assert lines == ["collecting r1: requests 5/10 sent, 1 done; 3 steps collected; 37 rows stored; 2 gaps; 6s"]
    for _ in range(9):
        progress("requests", 1)
    now[0] = 12.0
    progress("steps", 1)
    assert lines[-1].startswith("collecting r1: requests 10/10 sent, 10 done; 4 steps collected")


def test_collect_without_workload_progress_leaves_out_requests():
    progress = CollectProgress("r2", total_requests=None, concurrency=1, emit=print, clock=lambda: 0.0)
    assert progress.line() == "collecting r2: 0 steps collected; 0 rows stored; 0 gaps; 0s"


def test_driven_collect_says_what_it_does_and_ends_with_a_one_line_summary(emulator, tmp_path):
    srv = emulator(mode="compact", seed=3)
    result = _invoke(["collect", "--url", srv.url, "--out", str(tmp_path / "d"), "--run-id", "nc1",
                      "--workload", "gsm8k", "--requests", "4", "--concurrency", "2", "--max-new-tokens", "24",
                      "--poll-interval", "0.05", "--flush-interval", "0.2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("collecting run nc1 from ") and "(4 requests, concurrency 2)" in line for line in lines)
    summary = [line for line in lines if line.startswith("run nc1 (compact")]
    assert len(summary) == 1 and "4 requests" in summary[0] and "ended: completed" in summary[0]


def test_print_table_csv_and_json_carry_plain_cells():
    table = Table(title="T [bold]x[/bold]")
    table.add_column("k")
    table.add_column("observed\nECE")
    table.add_row("1", "[green]0.0123[/green]")
    table.add_row("2", "-")
    buf = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(buf):
        print_table(table, "csv")
    assert buf.getvalue() == "k,observed ECE\n1,0.0123\n2,-\n"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_table(table, "json")
    assert json.loads(buf.getvalue()) == {"table": "T x", "rows": [{"k": 1, "observed ECE": 0.0123},
                                                                     {"k": 2, "observed ECE": None}]}


def test_demo_tables_print_as_json_on_stdout_with_format_json(demo_store, capsys):
    from dspark_obs import demo
    from dspark_obs.store import Store

    out, _ = demo_store
    demo._print_windows(Store(out), console_mod.console, "json")
    doc = json.loads(capsys.readouterr().out)
    assert doc["table"].startswith("Verify windows per workload")
    assert {r["workload"] for r in doc["rows"]} == {"gsm8k", "arena-hard", "poetry"}
    assert all(isinstance(r["steps"], int) for r in doc["rows"])


def test_sql_deadline_interrupts_what_runs_after_the_query():
    import time

    from dspark_obs.sql_command import deadline

    with pytest.raises(TimeoutError, match="while printing"):
        with deadline(0.05, "exceeded --timeout 0.05 s while printing 100 rows"):
            time.sleep(60)  # the printing, standing in: only the alarm ends it early


def test_readme_first_ten_minutes_names_only_commands_that_exist():
    import re
    from pathlib import Path

    import typer

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## First ten minutes", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"dspark-obs ([a-z]+)", section))
    assert {"dashboard", "queries", "sql", "estimate", "calibrate", "collect"} <= named
    assert named <= set(typer.main.get_command(app).commands)
    assert "make demo" in section and "make dashboard" in section
