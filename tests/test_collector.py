"""The collector over real HTTP: every record exactly once, and every loss reported."""

import asyncio
import time

import httpx
import msgspec
import pytest

from collectors.sglang.cursor import ForwardCursor
from collectors.sglang.decode import PayloadError, decode_server_info, records_to_tables
from collectors.sglang.driver import DriveSpec
from collectors.sglang.session import CollectError, CollectOptions, Collector, collect
from dspark_obs import sql
from dspark_obs.store import Store


def _produced(srv):
    return {(rank.index, fct, rid) for rank in srv.emulator.engine.ranks
            for fct, rids in rank.dumper.produced for rid in rids}


def _collected(store, run_id):
    t = store.read("step_reqs", run_id)
    return list(zip(t.column("dp_rank").to_pylist(), t.column("forward_ct").to_pylist(),
                    t.column("rid").to_pylist()))


@pytest.mark.parametrize("dp_size", [1, 2])
def test_every_record_lands_exactly_once(tmp_path, emulator, dp_size):
    srv = emulator(mode="compact", dp_size=dp_size, seed=4, track_produced=True)
    store = Store(tmp_path)
    summary = collect(store, CollectOptions(
        url=srv.url, run_id="r1", poll_interval=0.05, clear_at=0, flush_interval=0.2,
        drive=DriveSpec(["gsm8k", "arena-hard", "poetry"], 45, concurrency=12, max_new_tokens=96)))
    collected = _collected(store, "r1")
    assert len(collected) == len(set(collected))                 # no duplicates
    assert set(collected) == _produced(srv)                     # nothing lost, nothing invented
    steps = store.read("steps", "r1")
    produced_steps = sum(rank.dumper.records_produced for rank in srv.emulator.engine.ranks)
    assert steps.num_rows == produced_steps == summary.steps
    assert set(steps.column("dp_rank").to_pylist()) == set(range(dp_size))
    assert summary.gaps == 0 and store.read("gaps").num_rows == 0
    assert store.read("requests", "r1").num_rows == 45
    runs = store.read("runs").to_pylist()
    assert runs[0]["mode"] == "compact" and runs[0]["gamma"] == 6 and runs[0]["dp_size"] == dp_size
    assert runs[0]["end_reason"] == "completed" and runs[0]["source"] == "emulator"
    # tokens: one row per committed output token, with logprobs and top-5
    con = sql.connect(tmp_path)
    mismatch = con.execute("""
        SELECT count(*) FROM requests r
        JOIN (SELECT rid, count(*) n, bool_and(len(top_ids) = 5) top5 FROM tokens GROUP BY rid) t USING (rid)
        WHERE r.completion_tokens != t.n OR NOT t.top5""").fetchall()[0][0]
    assert mismatch == 0


def _clear_after_a_step(engine) -> None:
    """Make every clear race the step loop, as it does on a busy server.

    On a loaded machine the engine can sit still between the collector's dump
    and its clear, and then a clear loses nothing; here the clear waits (while
    work is in flight) until the engine has made another record, so each clear
    during the run drops at least that record and the pending step.
    """
    original = engine.clear_records

    def clear_records():
        def produced():
            return sum(rank.dumper.records_produced for rank in engine.ranks)

        def busy():
            return any(rank.waiting or rank.running for rank in engine.ranks)

        start = produced()
        deadline = time.monotonic() + 10.0
        while busy() and produced() == start and time.monotonic() < deadline:
            time.sleep(0.001)
        original()

    engine.clear_records = clear_records


def test_clears_lose_records_only_inside_reported_gaps(tmp_path, emulator):
    srv = emulator(mode="compact", seed=5, track_produced=True, real_time=0.2)
    _clear_after_a_step(srv.emulator.engine)
    store = Store(tmp_path)
    summary = collect(store, CollectOptions(
        url=srv.url, run_id="r2", poll_interval=0.05, clear_at=5, flush_interval=0.2,
        drive=DriveSpec(["poetry"], 30, concurrency=8, max_new_tokens=96)))
    assert summary.clears > 0
    collected = _collected(store, "r2")
    assert len(collected) == len(set(collected))
    produced = _produced(srv)
    assert set(collected) <= produced
    lost_fcts = {fct for (_, fct, _) in produced - set(collected)}
    assert lost_fcts, "a clear discards the pending step, so something must be lost"
    rows = store.read("gaps", "r2").to_pylist()
    gaps = [g for g in rows if g["dp_rank"] >= 0]  # forward_ct ranges; dp_rank -1 rows are per request
    assert {g["reason"] for g in gaps} == {"clear"}
    # every request-step lost to a clear is also counted against its request, and the cause named
    per_request = [g for g in rows if g["dp_rank"] < 0]
    assert {g["reason"] for g in per_request} == {"request_steps_missing"}
    short = {rid for (_, _, rid) in produced - set(collected)}
    assert short <= {g["rid"] for g in per_request}
    verify_ct = {r["rid"]: r["spec_verify_ct"] for r in store.read("requests", "r2").to_pylist()}
    stored = {rid: sum(1 for c in collected if c[2] == rid) for rid in verify_ct}
    assert {g["rid"]: g["rows_lost"] for g in per_request} == {
        rid: verify_ct[rid] - stored[rid] for rid in verify_ct if verify_ct[rid] != stored[rid]}
    assert all("clear" in g["detail"] for g in per_request)
    for fct in lost_fcts:
        # -1: a clear that ended the run, whose loss has no later record to bound it
        assert any(g["first_missing_forward_ct"] <= fct
                   and (fct <= g["last_missing_forward_ct"] or g["last_missing_forward_ct"] == -1)
                   for g in gaps), (fct, [(g["first_missing_forward_ct"], g["last_missing_forward_ct"]) for g in gaps])


def test_deque_wrap_between_polls_is_reported(tmp_path, emulator):
    srv = emulator(mode="compact", seed=6, max_records=8, track_produced=True)
    store = Store(tmp_path)
    collect(store, CollectOptions(url=srv.url, run_id="r3", poll_interval=0.5, clear_at=0, flush_interval=0.2,
                                  drive=DriveSpec(["gsm8k"], 24, concurrency=8, max_new_tokens=120)))
    produced = _produced(srv)
    collected = set(_collected(store, "r3"))
    lost = {fct for (_, fct, _) in produced - collected}
    gaps = [g for g in store.read("gaps", "r3").to_pylist() if g["dp_rank"] >= 0]  # forward_ct ranges
    assert lost and gaps and {g["reason"] for g in gaps} == {"deque_wrap"}
    outside = sorted(f for f in lost if not any(g["first_missing_forward_ct"] <= f <= g["last_missing_forward_ct"]
                                                for g in gaps))
    assert not outside, (outside, [(g["first_missing_forward_ct"], g["last_missing_forward_ct"]) for g in gaps])


def test_server_restart_starts_a_new_segment(tmp_path, emulator):
    first = emulator(mode="compact", seed=7)
    port = first.port
    store = Store(tmp_path)

    async def scenario():
        col = Collector(store, CollectOptions(url=first.url, run_id="r4", flush_interval=0.1))
        async with httpx.AsyncClient(base_url=first.url, timeout=30) as client:
            await col._start_run(client)
            await client.post("/generate", json={"text": "[gsm8k] a", "rid": "a",
                                                 "sampling_params": {"max_new_tokens": 40}})
            await col.poll_once(client)
        first.stop()
        second = emulator(mode="compact", seed=7, port=port)
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as client:
            await client.post("/generate", json={"text": "[gsm8k] b", "rid": "b",
                                                 "sampling_params": {"max_new_tokens": 40}})
            await col.poll_once(client)
        col.writer.close()
        return col

    asyncio.run(scenario())
    gaps = store.read("gaps", "r4").to_pylist()
    assert [g["reason"] for g in gaps] == ["server_restart"] and gaps[0]["segment"] == 1
    steps = store.read("steps", "r4")
    seg_of = dict(zip(store.read("step_reqs", "r4").column("rid").to_pylist(),
                      store.read("step_reqs", "r4").column("segment").to_pylist()))
    assert seg_of["a"] == 0 and seg_of["b"] == 1
    keys = list(zip(steps.column("segment").to_pylist(), steps.column("forward_ct").to_pylist()))
    assert len(keys) == len(set(keys))  # forward_ct restarts, (segment, forward_ct) stays unique


def _body(records, startup=1.0):
    return msgspec.json.encode({"startup_time": startup, "internal_states": [
        {"dspark_info_record": {"mode": "compact", "gamma": 3, "verify_num_draft_tokens": 4,
                                "components": ["core"], "records": records}}]})


def test_bad_records_become_dead_letters_and_the_rest_decode():
    good = {"forward_ct": 5, "bs": 1, "a_field_from_a_newer_sglang": [1, 2]}
    bad = {"forward_ct": "six"}
    info = decode_server_info(_body([good, bad, {"bs": 2}]))
    rank = info.ranks[0]
    assert [r.forward_ct for r in rank.records] == [5]
    assert len(rank.dead) == 2 and "forward_ct" in rank.dead[1][0]
    with pytest.raises(PayloadError, match="not a /server_info body"):
        decode_server_info(b"<html>502 Bad Gateway</html>")


def test_absent_fields_take_sglangs_defaults():
    info = decode_server_info(_body([{"forward_ct": 9}]))
    steps, reqs = records_to_tables(info.ranks[0].records, dp_rank=0, segment=0)
    row = steps.to_pylist()[0]
    assert row["bs"] == -1 and row["mode"] == "" and row["budget"] is None and row["step_cpu_ms"] is None
    assert reqs.num_rows == 0


def test_cursor_reads_by_high_water_mark():
    cur = ForwardCursor()
    d1 = cur.advance(decode_server_info(_body([{"forward_ct": 2}, {"forward_ct": 3}])))  # core only: no step_cpu_ms
    d2 = cur.advance(decode_server_info(_body([{"forward_ct": 2}, {"forward_ct": 3}, {"forward_ct": 5}])))
    assert [r.forward_ct for r in d1.new[0]] == [2, 3]
    assert [r.forward_ct for r in d2.new[0]] == [5] and not d2.gaps
    d3 = cur.advance(decode_server_info(_body([{"forward_ct": 9}, {"forward_ct": 10}])))
    assert [(g.first_missing_forward_ct, g.last_missing_forward_ct, g.reason) for g in d3.gaps] == [(6, 8, "deque_wrap")]
    d4 = cur.advance(decode_server_info(_body([{"forward_ct": 2}], startup=2.0)))
    assert d4.restarted and d4.gaps[0].reason == "server_restart" and cur.segment == 1
    assert [r.forward_ct for r in d4.new[0]] == [2]


def test_a_wrap_before_the_first_poll_is_reported_when_the_run_started_empty():
    cur = ForwardCursor()
    cur.note_start(decode_server_info(_body([])))  # the body read when the run starts
    d1 = cur.advance(decode_server_info(_body([{"forward_ct": 9}, {"forward_ct": 10}])))
    assert [r.forward_ct for r in d1.new[0]] == [9, 10]
    assert [(g.first_missing_forward_ct, g.last_missing_forward_ct, g.reason) for g in d1.gaps] == [(1, 8, "deque_wrap")]
    # records that predate the run are history, not loss: nothing to report
    cold = ForwardCursor()
    cold.note_start(decode_server_info(_body([{"forward_ct": 4}])))
    assert not cold.advance(decode_server_info(_body([{"forward_ct": 9}, {"forward_ct": 10}]))).gaps


def test_a_jump_after_a_prefill_is_loss_only_when_the_deque_is_full():
    def timed(*fcts):  # step_cpu_ms is absent on the record after a prefill
        return msgspec.json.encode({"startup_time": 1.0, "internal_states": [{"dspark_info_record": {
            "mode": "compact", "gamma": 3, "components": ["core", "step_cpu_time"],
            "records": [{"forward_ct": f} for f in fcts]}}]})
    for capacity, expected in [(3, [(1, 4, "deque_wrap")]), (4, [])]:
        cur = ForwardCursor(capacity=capacity)
        cur.note_start(decode_server_info(timed()))
        gaps = cur.advance(decode_server_info(timed(5, 6, 7))).gaps
        assert [(g.first_missing_forward_ct, g.last_missing_forward_ct, g.reason) for g in gaps] == expected


def test_a_server_without_dspark_records_is_refused_with_the_fix(tmp_path, emulator):
    srv = emulator(mode="compact", components=frozenset())
    with pytest.raises(CollectError, match="SGLANG_DSPARK_DEBUG_DUMP"):
        collect(Store(tmp_path), CollectOptions(url=srv.url, run_id="x", duration=0.1))


def test_an_unreachable_server_is_a_clear_error(tmp_path):
    with pytest.raises(CollectError, match="Is the server up"):
        collect(Store(tmp_path), CollectOptions(url="http://127.0.0.1:9", run_id="x", duration=0.1))
