"""Tests for collectors.sglang.request_log and `collect --request-log`: following SGLang's JSON request log."""

from __future__ import annotations

import asyncio
import json
import os
import threading

import httpx

from collectors.sglang.request_log import LogTail, RequestLogFollower
from collectors.sglang.session import CollectOptions, Collector
from dspark_obs import sql
from dspark_obs.store import Store


def _finished(rid: str, ids: list[int]) -> str:
    return "[2026-01-01 00:00:00] " + json.dumps({
        "timestamp": 1.0, "event": "request.finished", "rid": rid,
        "obj": {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 8}},
        "out": {"text": "x", "output_ids": ids, "meta_info": {"id": rid, "completion_tokens": len(ids),
                                                             "spec_verify_ct": 1}}})


def test_tail_starts_at_the_end_and_returns_complete_lines_only(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("old line\n")
    tail = LogTail(str(path))
    assert tail.read() == []
    with open(path, "a") as fh:
        fh.write("one\ntw")
    assert tail.read() == ["one"]
    with open(path, "a") as fh:
        fh.write("o\n")
    assert tail.read() == ["two"]


def test_tail_follows_rename_rotation_and_copytruncate(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("")
    tail = LogTail(str(path))
    with open(path, "a") as fh:
        fh.write("a\nb-partial")
    os.rename(path, tmp_path / "server.log.1")
    assert tail.read() == ["a"]  # the new file is not there yet: keep the old one
    with open(tmp_path / "server.log.1", "a") as fh:
        fh.write("-done\n")
    path.write_text("c-a-longer-line\n")
    assert tail.read() == ["b-partial-done", "c-a-longer-line"] and tail.rotations == 1
    path.write_text("")  # truncated in place (copytruncate) ...
    with open(path, "a") as fh:
        fh.write("d\n")  # ... and written again, shorter than before
    assert tail.read() == ["d"] and tail.rotations == 2


def test_tail_waits_for_a_file_that_does_not_exist_yet(tmp_path):
    path = tmp_path / "later.log"
    tail = LogTail(str(path))
    assert tail.read() == []
    path.write_text("first\n")
    assert tail.read() == ["first"]


def test_follower_turns_finished_events_into_rows_and_bad_lines_into_dead_letters(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("")
    follower = RequestLogFollower(str(path), lambda rid: rid.split("-")[0])
    with open(path, "a") as fh:
        fh.write(_finished("gsm8k-000001", [5, 6, 7]) + "\n")
        fh.write('[t] {"timestamp": 1, "event": "request.received", "rid": "x", "obj": {}}\n')
        fh.write("INFO ordinary log line\n")
        fh.write('{"event": "request.finished", "rid": "y"}\n')
        fh.write("{not json\n")
    rows = follower.poll()
    assert [r["rid"] for r, _ in rows] == ["gsm8k-000001"] and rows[0][0]["workload"] == "gsm8k"
    assert rows[0][1].column("token_id").to_pylist() == [5, 6, 7]
    assert follower.skipped == 2 and [d[0] for d in follower.dead] == [
        "request.finished without an 'out' object", "not JSON: Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)"]


def _send(url: str, names: list[str]) -> None:
    for rid in names:
        httpx.post(f"{url}/generate", json={"rid": rid, "text": f"[{rid.split('-')[0]}] {rid}",
                                             "sampling_params": {"temperature": 0, "max_new_tokens": 40},
                                             "return_logprob": True}, timeout=60).raise_for_status()


def test_collect_follows_the_request_log_and_joins_requests_to_their_steps(tmp_path, emulator):
    log = tmp_path / "server.log"
    srv = emulator(mode="compact", seed=9, request_log_path=str(log))
    _send(srv.url, ["gsm8k-000900"])  # before the run: neither its steps nor its log line are this run's
    store = Store(tmp_path / "data")
    col = Collector(store, CollectOptions(url=srv.url, run_id="prod", poll_interval=0.05, flush_interval=0.2,
                                          request_log=str(log)))
    started, result = threading.Event(), {}

    async def run() -> None:
        result["loop"] = asyncio.get_running_loop()
        task = asyncio.create_task(col.run())
        while getattr(col, "_log_follower", None) is None and not task.done():
            await asyncio.sleep(0.01)
        started.set()
        result["summary"] = await task

    thread = threading.Thread(target=lambda: asyncio.run(run()))
    thread.start()
    assert started.wait(120)
    _send(srv.url, [f"gsm8k-{i:06d}" for i in range(4)])
    os.rename(log, tmp_path / "server.log.1")  # rotated mid-run; the server recreates the file
    _send(srv.url, [f"poetry-{i:06d}" for i in range(4, 8)])
    result["loop"].call_soon_threadsafe(col.stop)
    thread.join()
    summary = result["summary"]
    con = sql.connect(store.root)
    rids = [r[0] for r in con.execute("SELECT rid FROM requests WHERE run_id = 'prod' ORDER BY rid").fetchall()]
    assert rids == [f"gsm8k-{i:06d}" for i in range(4)] + [f"poetry-{i:06d}" for i in range(4, 8)]
    assert summary.requests == 8 and summary.dead_letters == 0
    # every finished request joins its own steps: one request-step per verify, one token row per output token
    joined = con.execute("""
        SELECT r.rid, r.spec_verify_ct, r.completion_tokens, r.workload,
               (SELECT count(*) FROM step_reqs s WHERE s.run_id = r.run_id AND s.rid = r.rid) AS steps,
               (SELECT count(*) FROM tokens t WHERE t.run_id = r.run_id AND t.rid = r.rid AND t.logprob IS NOT NULL)
        FROM requests r WHERE r.run_id = 'prod'""").fetchall()
    for rid, verify_ct, completion, workload, steps, tokens in joined:
        assert steps == verify_ct > 0 and tokens == completion and workload == rid.split("-")[0], rid
