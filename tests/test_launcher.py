"""Launch mode over real processes: the emulator as the child server."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from collectors.sglang.launcher import LaunchError, child_env, server_command, url_from_command, verify_mode
from dspark_obs.store import Store

CLI = [sys.executable, "-m", "dspark_obs.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.update(extra)
    return env


def test_launch_collects_from_the_child_stores_its_mode_and_imports_the_estimator_jsonl(tmp_path):
    port, est = _free_port(), tmp_path / "est.jsonl"
    proc = subprocess.run(
        CLI + ["collect", "--out", str(tmp_path / "d"), "--run-id", "L1", "--workload", "gsm8k,poetry",
               "--requests", "16", "--concurrency", "4", "--max-new-tokens", "80", "--temperature", "0.8",
               "--api", "chat", "--poll-interval", "0.1", "--flush-interval", "0.5",
               "--estimator-jsonl", str(est), "--", *CLI, "emulate", "--port", str(port)],
        env=_env(SGLANG_RAGGED_VERIFY_MODE="cap-accept"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    store = Store(tmp_path / "d")
    run = store.read("runs", "L1").to_pylist()[0]
    labels = dict(run["labels"])
    assert run["mode"] == "cap-accept" and run["end_reason"] == "completed"
    assert labels["server_stopped_by"] == "SIGTERM" and not _port_open(port)
    assert set(store.read("steps", "L1").column("mode").to_pylist()) == {"cap-accept"}
    assert store.read("requests", "L1").num_rows == 16
    lines = [json.loads(line) for line in est.read_text().splitlines()]
    assert lines and store.read("estimator_records", "L1").num_rows == len(lines)
    # SGLang's row format exactly: these keys, in this order, and nothing else.
    for row in lines:
        keys = list(row)
        assert keys in (["rid", "eos_end"],) or keys[:5] == ["rid", "fct", "w", "cl", "ct"]
        assert set(keys) <= {"rid", "fct", "w", "cl", "ct", "trimmed_tokens", "q_lp", "pg", "eos_end"}
        if "fct" in row and row["cl"] == row["w"] < 6:
            assert len(row["trimmed_tokens"]) == len(row["q_lp"]) == 6 - row["w"]
            assert row["pg"][-1][:2] == [row["fct"], row["w"] + 1] or row["pg"][0][:2] == [row["fct"], row["w"] + 1]


def test_sigterm_is_forwarded_and_the_run_says_why_it_ended(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        CLI + ["collect", "--out", str(tmp_path), "--run-id", "L2", "--poll-interval", "0.1",
               "--flush-interval", "0.2", "--", *CLI, "emulate", "--port", str(port)],
        env=_env(SGLANG_RAGGED_VERIFY_MODE="compact"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (tmp_path / "runs").exists():
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "timeout"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        proc.kill()
    run = Store(tmp_path).read("runs", "L2").to_pylist()[0]
    assert run["mode"] == "compact" and run["end_reason"] == "interrupted: SIGTERM"
    assert dict(run["labels"])["server_stopped_by"] == "SIGTERM" and not _port_open(port)


def test_a_server_that_exits_ends_the_run_with_its_code(tmp_path):
    port = _free_port()
    # the "server" exits once the collector has started the run (its runs row is committed), however
    # long a loaded machine takes to get there
    runs = tmp_path / "runs"
    script = (f"import pathlib,subprocess,sys,time; p=subprocess.Popen({CLI + ['emulate', '--port', str(port)]!r}); "
              f"runs=pathlib.Path({str(runs)!r})\n"
              "while not (runs.exists() and any(runs.rglob('*.parquet'))): time.sleep(0.1)\n"
              "time.sleep(0.5); p.terminate(); p.wait(); sys.exit(3)")
    proc = subprocess.run(CLI + ["collect", "--out", str(tmp_path), "--run-id", "L3", "--poll-interval", "0.1",
                                 "--", sys.executable, "-c", script, "--port", str(port)],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    run = Store(tmp_path).read("runs", "L3").to_pylist()[0]
    assert run["end_reason"] == "server_exited: code 3" and run["mode"] == "static"


def test_a_server_that_never_gets_healthy_is_a_clear_error(tmp_path):
    proc = subprocess.run(CLI + ["collect", "--out", str(tmp_path), "--", sys.executable, "-c", "raise SystemExit(7)"],
                          env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2 and "exited with code 7" in proc.stderr


def test_launch_helpers():
    cmd = ["python", "-m", "sglang.launch_server", "--port", "31001", "--host", "0.0.0.0"]
    assert url_from_command(cmd) == "http://127.0.0.1:31001"
    assert server_command(cmd)[-1] == "--enable-metrics"
    assert server_command(["python", "-m", "dspark_obs.cli", "emulate"])[-1] == "emulate"
    env = child_env({"SGLANG_RAGGED_VERIFY_MODE": "compact"}, estimator_jsonl="/x.jsonl")
    assert env["SGLANG_DSPARK_DEBUG_DUMP"].startswith("core,") and env["SGLANG_DSPARK_FOLDED_PROPOSAL"] == "0"
    assert verify_mode({}) == "static" and verify_mode(env) == "compact"
    with pytest.raises(LaunchError, match="SGLANG_RAGGED_VERIFY_MODE='fast'"):
        verify_mode({"SGLANG_RAGGED_VERIFY_MODE": "fast"})
