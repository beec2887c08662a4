"""Tests for dspark_obs.quarantine and `dspark-obs doctor`: a truncated part file never breaks the store."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dspark_obs import quarantine, sql, sql_readonly
from dspark_obs.cli import app
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
runner = CliRunner()


def _step(forward_ct: int) -> dict:
    return {"dp_rank": 0, "forward_ct": forward_ct, "segment": 0, "bs": 1, "num_running_reqs": 1,
            "mode": "compact", "num_verify_tokens": 4, "verify_tokens_local": 4,
            "verify_tokens_dp_synced": 4, "verify_tokens_graph_key": 4}


@pytest.fixture
def damaged(tmp_path) -> tuple[Store, Path]:
    """A closed run with two steps files, one of them cut to half its size."""
    s = Store(tmp_path / "data")
    s.upsert_run("r1", started_at=T0, ended_at=T0, source="emulator", mode="compact", gamma=3,
                 end_reason="completed")
    good = s.write("steps", "r1", [_step(1), _step(2)])
    bad = s.write("steps", "r1", [_step(3), _step(4), _step(5)])
    assert good and bad
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    return s, bad


def test_sweep_moves_a_truncated_file_aside_and_lists_it(damaged):
    store, bad = damaged
    moved = quarantine.sweep(store.root)
    assert [m["file_name"] for m in moved] == [bad.name]
    assert not bad.exists()
    listed = quarantine.listing(store.root).to_pylist()
    assert [(r["table_name"], r["run_id"], r["file_name"]) for r in listed] == [("steps", "r1", bad.name)]
    assert Path(listed[0]["path"]).exists() and listed[0]["size_bytes"] > 0
    assert quarantine.sweep(store.root) == []  # once


def test_every_reader_still_runs_on_a_damaged_store(damaged):
    store, bad = damaged
    assert sorted(store.read("steps").column("forward_ct").to_pylist()) == [1, 2]
    con = sql.connect(store.root)
    assert sql.query(con, "SELECT count(*) AS n FROM runs").column("n").to_pylist() == [1]
    assert sql.query(con, "SELECT file_name FROM quarantined_files").column("file_name").to_pylist() == [bad.name]


def test_read_only_sql_sweeps_before_it_reads(damaged):
    store, bad = damaged
    got = sql_readonly.run(store.root, "SELECT count(*) AS n FROM steps")
    assert got.column("n").to_pylist() == [2]
    names = sql_readonly.run(store.root, "SELECT file_name FROM quarantined_files").column("file_name")
    assert names.to_pylist() == [bad.name]


def test_cli_sql_runs_and_warns_about_quarantined_files(damaged):
    store, bad = damaged
    result = runner.invoke(app, ["sql", "--data", str(store.root), "--format", "csv",
                                 "select count(*) as n from runs"])
    assert result.exit_code == 0, result.output
    assert "n\n1\n" in result.stdout
    assert "quarantined" in " ".join(result.stderr.split())


def test_doctor_exit_codes(damaged, tmp_path):
    store, bad = damaged
    result = runner.invoke(app, ["doctor", "--data", str(store.root)])
    assert result.exit_code == 1
    assert bad.name in result.stdout and "quarantined" in result.stdout
    healthy = Store(tmp_path / "healthy")
    healthy.upsert_run("ok", started_at=T0, ended_at=T0, source="emulator", end_reason="completed")
    assert runner.invoke(app, ["doctor", "--data", str(healthy.root)]).exit_code == 0


def test_doctor_lists_unclosed_runs_and_leftover_tmp(tmp_path):
    s = Store(tmp_path / "data")
    s.upsert_run("open", started_at=T0, source="emulator")
    (s.root / "runs" / "run_id=open" / ".part-x.parquet.tmp").write_bytes(b"partial")
    result = runner.invoke(app, ["doctor", "--data", str(s.root)])
    assert result.exit_code == 1
    text = " ".join(result.stdout.split())
    assert "unclosed run: open" in text and "leftover temporary file" in text


def test_every_command_still_runs_on_a_store_with_a_truncated_file(tmp_path, emulator):
    """A real run, its step_reqs files cut short: sql, estimate, calibrate and doctor still run."""
    from collectors.sglang.driver import DriveSpec
    from collectors.sglang.session import CollectOptions, collect

    srv = emulator(mode="compact", seed=41)
    root = tmp_path / "data"
    store = Store(root)
    for part in range(2):  # two flushes' worth of files, so one can be damaged and the rest remain
        collect(store, CollectOptions(url=srv.url, run_id=f"r{part}", poll_interval=0.05, flush_interval=0.1,
                                      drive=DriveSpec(["gsm8k", "poetry"], 4, concurrency=2, max_new_tokens=40,
                                                      temperature=0.7)))
    # every step_reqs file of r0 cut short (how many flushes a run makes depends on the machine's speed)
    victims = sorted((root / "step_reqs" / "run_id=r0").glob("part-*.parquet"))
    assert victims
    for victim in victims:
        victim.write_bytes(victim.read_bytes()[:100])
    commands = [
        ["sql", "--data", str(root), "select count(*) from runs"],
        ["estimate", "--data", str(root), "--run", "r1", "--bootstrap", "20"],
        ["calibrate", "--data", str(root), "--run", "r1", "--bootstrap", "20"],
    ]
    for args in commands:
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args[0], result.output[-2000:], result.exception)
    # the damaged run lost its only step_reqs file: a clean error naming what is left, not a traceback
    result = runner.invoke(app, ["estimate", "--data", str(root), "--run", "r0", "--bootstrap", "20"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "runs with steps: r1" in " ".join(result.output.split())
    result = runner.invoke(app, ["doctor", "--data", str(root)])
    assert result.exit_code == 1 and all(v.name in result.stdout for v in victims)
    assert not any(v.exists() for v in victims)


def test_doctor_closes_runs_whose_collector_is_gone_as_crashed(tmp_path):
    s = Store(tmp_path / "data")
    s.upsert_run("gone", started_at=T0, source="emulator")
    s.write("steps", "gone", [_step(1)])
    result = runner.invoke(app, ["doctor", "--data", str(s.root), "--mark-crashed-after", "0"])
    assert result.exit_code == 0, result.output
    run = s.read("runs", "gone").to_pylist()[0]
    assert run["end_reason"].startswith("crashed: the collector ended without closing the run")
    assert run["ended_at"] is not None
    assert runner.invoke(app, ["doctor", "--data", str(s.root)]).exit_code == 0
