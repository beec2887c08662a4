"""The fault suite of issue 13: outages, kill -9 and --resume, a stalled server and SIGTERM, a full disk,
two driven runs on one server, and the exit codes that tell errors.

Every service is started by the test on 127.0.0.1 (the emulator's HTTP server or a small fake).
Each scenario asserts that every forward_ct the server produced is stored once or lies in a gap
row, that every row dropped is counted in the store, and what the exit code says.  Tests are
bounded by timeouts only (the suite runs on loaded machines).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest
from typer.testing import CliRunner

from collectors.sglang.driver import DriveSpec
from collectors.sglang.session import CollectError, CollectOptions, Collector, collect
from dspark_obs.cli import app
from dspark_obs.store import Store

runner = CliRunner()
TIMEOUT_S = 300  # per subprocess; a bound, not a speed requirement


def _produced(srv) -> set[tuple[int, int]]:
    return {(rank.index, fct) for rank in srv.emulator.engine.ranks for fct, _ in rank.dumper.produced}


def _range_gaps(store, run_id) -> list[dict]:
    """Gap rows that are forward_ct ranges (dp_rank >= 0); the rest are per request or per table."""
    return [g for g in store.read("gaps", run_id).to_pylist() if g["dp_rank"] >= 0]


def _inside(gaps, rank, fct, segment=None) -> bool:
    return any(g["dp_rank"] == rank and (segment is None or g["segment"] in (segment, segment + 1))
               and g["first_missing_forward_ct"] <= fct
               and (fct <= g["last_missing_forward_ct"] or g["last_missing_forward_ct"] == -1) for g in gaps)


def _assert_requests_accounted(store, run_id) -> None:
    """Each finished request's stored request-steps equal its spec_verify_ct, or a gap row says by how much."""
    reqs = store.read("requests", run_id).to_pylist()
    steps = Counter(store.read("step_reqs", run_id).column("rid").to_pylist())
    missing = {g["rid"]: g["rows_lost"] for g in store.read("gaps", run_id).to_pylist()
               if g["reason"] == "request_steps_missing"}
    for r in reqs:
        if r["spec_verify_ct"] is None:
            continue
        assert steps[r["rid"]] == r["spec_verify_ct"] or missing.get(r["rid"]) == r["spec_verify_ct"] - steps[r["rid"]], \
            (r["rid"], r["spec_verify_ct"], steps[r["rid"]], missing.get(r["rid"]))


# -- server outage while driving traffic ----------------------------------------------

def test_an_outage_while_driving_is_retried_and_every_loss_is_a_row(tmp_path, emulator):
    first = emulator(mode="compact", seed=31, track_produced=True)
    port, store = first.port, Store(tmp_path)
    servers = {"first": first}

    async def scenario():
        col = Collector(store, CollectOptions(
            url=first.url, run_id="out", poll_interval=0.05, clear_at=0, flush_interval=0.2, poll_timeout=5,
            drive=DriveSpec(["gsm8k", "poetry"], 40, concurrency=8, max_new_tokens=60, retries=8)))
        run = asyncio.create_task(col.run())
        while col.summary.requests < 8:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(first.stop)  # down ...
        await asyncio.sleep(1.5)
        servers["second"] = await asyncio.to_thread(emulator, mode="compact", seed=32, port=port,
                                                    track_produced=True)  # ... and back, restarted
        return await asyncio.wait_for(run, TIMEOUT_S)

    summary = asyncio.run(scenario())
    gaps = store.read("gaps", "out").to_pylist()
    outages = [g for g in gaps if g["reason"] in ("poll_error", "poll_stall")]
    assert outages and all(g["duration_s"] > 0 and g["detail"] for g in outages)
    # every request: a requests row or a request_failed row of its own
    failed = {g["rid"] for g in gaps if g["reason"] == "request_failed"}
    done = set(store.read("requests", "out").column("rid").to_pylist())
    assert len(done) + len(failed) == 40 and not done & failed
    assert summary.failed_requests == len(failed)
    # every produced forward_ct: stored once or in a gap (segment 0 = first server, 1 = after the restart)
    steps = store.read("steps", "out")
    keys = list(zip(steps.column("segment").to_pylist(), steps.column("dp_rank").to_pylist(),
                    steps.column("forward_ct").to_pylist()))
    assert len(keys) == len(set(keys))
    ranges = _range_gaps(store, "out")
    assert {g["reason"] for g in ranges} <= {"server_restart", "deque_wrap", "clear"}
    for segment, srv in enumerate((servers["first"], servers["second"])):
        stored = {(r, f) for s, r, f in keys if s == segment}
        assert all((r, f) in stored or _inside(ranges, r, f) for r, f in _produced(srv)), segment
    _assert_requests_accounted(store, "out")
    assert store.read("runs", "out").to_pylist()[0]["end_reason"] == "completed"


# -- two driven runs on one server --------------------------------------------------------

def test_two_driven_runs_on_one_server_keep_their_requests_apart(tmp_path, emulator):
    srv = emulator(mode="compact", seed=33)
    store = Store(tmp_path)
    spec = DriveSpec(["gsm8k", "arena-hard"], 6, concurrency=3, max_new_tokens=48)
    for run in ("first", "second"):
        summary = collect(store, CollectOptions(url=srv.url, run_id=run, poll_interval=0.05, clear_at=0,
                                                flush_interval=0.2, drive=spec))
        assert summary.requests == 6 and summary.end_reason == "completed"
    rids = {run: set(store.read("requests", run).column("rid").to_pylist()) for run in ("first", "second")}
    assert len(rids["first"]) == len(rids["second"]) == 6 and not rids["first"] & rids["second"]
    for run in ("first", "second"):
        reqs = store.read("requests", run).to_pylist()
        steps = Counter(store.read("step_reqs", run).column("rid").to_pylist())
        assert set(steps) == rids[run]  # no step of earlier traffic joined the run
        assert all(steps[r["rid"]] == r["spec_verify_ct"] for r in reqs)
        assert not [g for g in store.read("gaps", run).to_pylist() if g["reason"] == "request_steps_missing"]


def test_a_run_id_that_exists_is_refused_without_resume(tmp_path, emulator):
    srv = emulator(mode="compact", seed=34)
    store = Store(tmp_path)
    opts = dict(url=srv.url, run_id="dup", poll_interval=0.05, flush_interval=0.2,
                drive=DriveSpec(["gsm8k"], 2, concurrency=2, max_new_tokens=24))
    collect(store, CollectOptions(**opts))
    before = store.read("steps", "dup").num_rows
    with pytest.raises(CollectError, match=r"run 'dup' already exists.*--resume"):
        collect(store, CollectOptions(**opts))
    assert store.read("steps", "dup").num_rows == before
    result = runner.invoke(app, ["collect", "--url", srv.url, "--out", str(tmp_path), "--run-id", "dup",
                                 "--duration", "0.2"])
    assert result.exit_code == 2 and "--resume" in " ".join(result.output.split())


# -- kill -9, then --resume ------------------------------------------------------------------

def _collect_cmd(url, out, run, *extra) -> list[str]:
    return [sys.executable, "-m", "dspark_obs.cli", "collect", "--url", url, "--out", str(out), "--run-id", run,
            "--workload", "gsm8k,poetry", "--requests", "40", "--concurrency", "8", "--max-new-tokens", "64",
            "--poll-interval", "0.05", "--flush-interval", "0.3", "--clear-at", "0", *extra]


def test_kill_9_then_resume_stores_every_record_once_and_keeps_the_crash(tmp_path, emulator):
    srv = emulator(mode="compact", seed=35, track_produced=True, real_time=1.0)
    store = Store(tmp_path)
    proc = subprocess.Popen(_collect_cmd(srv.url, tmp_path, "k"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not list((tmp_path / "requests").glob("run_id=k/part-*.parquet")):
            assert proc.poll() is None and time.monotonic() < deadline, "the collector ended before a flush"
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    started = store.read("runs", "k").to_pylist()[0]["started_at"]
    assert store.read("runs", "k").to_pylist()[0]["ended_at"] is None  # killed: never closed
    done = subprocess.run(_collect_cmd(srv.url, tmp_path, "k", "--resume"), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    run = store.read("runs", "k").to_pylist()[0]
    labels = dict(run["labels"])
    assert run["started_at"] == started and run["end_reason"] == "completed"
    assert labels["resume_1_previous_end"].startswith("crashed")
    assert not list(tmp_path.glob("*/run_id=k/.part-*.tmp"))  # what the kill left half-written is gone
    steps = store.read("steps", "k")
    keys = list(zip(steps.column("dp_rank").to_pylist(), steps.column("forward_ct").to_pylist()))
    assert len(keys) == len(set(keys))  # no record stored twice
    reqs = store.read("step_reqs", "k")
    pairs = list(zip(reqs.column("forward_ct").to_pylist(), reqs.column("rid").to_pylist()))
    assert len(pairs) == len(set(pairs))
    ranges = _range_gaps(store, "k")
    assert all(k in set(keys) or _inside(ranges, *k) for k in _produced(srv))
    # each planned request finished once, under a rid of its own
    rids = store.read("requests", "k").column("rid").to_pylist()
    assert len(rids) == len(set(rids)) == 40
    assert sorted(r.split("@")[0] for r in rids) == sorted({r.split("@")[0] for r in rids})
    _assert_requests_accounted(store, "k")


# -- a stalled server and SIGTERM ----------------------------------------------------------

class _StallingServer:
    """/server_info answers ``answers`` times with a valid empty body, then hangs until released."""

    def __init__(self, answers: int = 2):
        outer = self
        self.release, self.gets = threading.Event(), 0
        body = msgspec.json.encode({"startup_time": 1.0, "version": "0.5.23", "internal_states": [
            {"dspark_info_record": {"mode": "compact", "gamma": 6, "verify_num_draft_tokens": 7,
                                    "components": ["core", "reqs"], "records": []}}]})

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.gets += 1
                if outer.gets > answers:
                    outer.release.wait(timeout=120)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def close(self):
        self.release.set()
        self.httpd.shutdown()


def test_sigterm_stops_the_collector_while_the_server_is_stalled(tmp_path):
    srv = _StallingServer()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "dspark_obs.cli", "collect", "--url", srv.url,
                                 "--out", str(tmp_path), "--run-id", "st", "--poll-interval", "0.05",
                                 "--poll-timeout", "120", "--flush-interval", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + TIMEOUT_S
        while srv.gets <= 2:  # the poll after the answered ones hangs
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(1.2)  # stalled for a while
        proc.send_signal(signal.SIGTERM)
        # the poll timeout is 120 s: returning well before it means the stall did not hold the stop
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.close()
    assert rc == 0, proc.stderr.read().decode()[-2000:]
    store = Store(tmp_path)
    run = store.read("runs", "st").to_pylist()[0]
    assert run["end_reason"].startswith("interrupted") and run["ended_at"] is not None
    stalls = [g for g in store.read("gaps", "st").to_pylist() if g["reason"] == "poll_stall"]
    assert len(stalls) == 1 and stalls[0]["duration_s"] >= 1.0


# -- a full disk -----------------------------------------------------------------------------

class _FullDisk(Store):
    """A store whose disk fills after ``budget`` commits: every later write fails with ENOSPC."""

    def __init__(self, root, budget: int):
        super().__init__(root)
        self.budget = budget

    def write(self, table, run_id, rows):
        if self.budget <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.budget -= 1
        return super().write(table, run_id, rows)

    def upsert_run(self, run_id, **fields):
        if self.budget <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().upsert_run(run_id, **fields)


def test_a_disk_that_stays_full_ends_the_run_in_error_and_counts_every_row(tmp_path, emulator):
    srv = emulator(mode="compact", seed=36)
    store = _FullDisk(tmp_path, budget=3)
    summary = collect(store, CollectOptions(url=srv.url, run_id="full", poll_interval=0.05, flush_interval=0.1,
                                            drive=DriveSpec(["gsm8k"], 8, concurrency=4, max_new_tokens=40)))
    assert summary.rows_failed > 0 and summary.end_reason.startswith("error")
    assert any("could not be written" in e for e in summary.write_errors)


def test_tmpfs_full_disk_exits_non_zero(tmp_path, emulator):
    """The same on a real 1 MiB tmpfs, through the CLI (skipped where tmpfs cannot be mounted)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}); "
                    "test_a_disk_that_stays_full_ends_the_run_in_error_and_counts_every_row covers it in-process")
    try:
        st = os.statvfs(mnt)
        (mnt / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (64 << 10)))  # leave 64 KiB
        srv = emulator(mode="compact", seed=37)
        done = subprocess.run(_collect_cmd(srv.url, mnt / "data", "t"), capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        assert done.returncode == 1, done.stderr[-2000:]
        assert "could not be written" in " ".join(done.stderr.split())
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# -- exit codes ------------------------------------------------------------------------------

def test_out_naming_a_file_is_refused_with_exit_2(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("x")
    result = runner.invoke(app, ["collect", "--url", "http://127.0.0.1:9", "--out", str(target)])
    assert result.exit_code == 2 and "is a file" in " ".join(result.output.split())


class _NoGenerate(_StallingServer):
    """/server_info answers; every /generate is a 500."""

    def __init__(self):
        super().__init__(answers=10**9)

        def do_POST(handler):
            handler.send_response(500)
            handler.send_header("Content-Length", "0")
            handler.end_headers()

        self.httpd.RequestHandlerClass.do_POST = do_POST


def test_a_run_where_every_request_failed_exits_1(tmp_path):
    srv = _NoGenerate()
    try:
        result = runner.invoke(app, ["collect", "--url", srv.url, "--out", str(tmp_path), "--run-id", "f",
                                     "--workload", "gsm8k", "--requests", "3", "--concurrency", "3",
                                     "--poll-interval", "0.05", "--flush-interval", "0.1"])
    finally:
        srv.close()
    assert result.exit_code == 1
    run = Store(tmp_path).read("runs", "f").to_pylist()[0]
    assert run["end_reason"] == "error: all 3 requests failed"
    failed = [g for g in Store(tmp_path).read("gaps", "f").to_pylist() if g["reason"] == "request_failed"]
    assert len(failed) == 3


def test_resume_removes_the_half_written_files_a_kill_left(tmp_path):
    """A kill during a write leaves a hidden ``.part-*.tmp``; resuming the run deletes it, and only its own."""
    from collectors.sglang import runlife

    store = Store(tmp_path)
    store.upsert_run("k", started_at=dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc), source="emulator")
    mine = tmp_path / "tokens" / "run_id=k" / ".part-20261202T000000000000Z-0000.parquet.tmp"
    other = tmp_path / "tokens" / "run_id=other" / ".part-20261202T000000000000Z-0001.parquet.tmp"
    for path in (mine, other):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    assert runlife.remove_stale_tmp(store, "k") == 1
    assert not mine.exists() and other.exists()
    assert store.read("runs", "k").num_rows == 1
