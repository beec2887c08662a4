"""Fuzzed bodies of issue 13 against a fake server on 127.0.0.1: semantic validation, the NaN record,
a duplicate or out-of-order forward_ct, and a flapping startup_time (two servers behind one URL)."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from collectors.sglang.session import CollectOptions, Collector
from dspark_obs.store import Store

GAMMA = 3


def _req(**over) -> dict:
    req = {"req_pool_index": 0, "prefix_len": 10, "verify_len": 3, "acc_len": 2, "correct_drafts": 1,
           "cap_trim": 0, "bonus_token": 5, "draft_tokens": [1, 2, 3], "rid": "a",
           "confidence": [0.9, 0.5, 0.4], "survival": [0.9, 0.45, 0.18]}
    req.update(over)
    return req


def _rec(fct: int, **req_over) -> dict:
    return {"forward_ct": fct, "bs": 1, "num_running_reqs": 1, "mode": req_over.pop("mode", "compact"),
            "reqs": [_req(**req_over)]}


def _body(records: list, startup_time: float = 1.0) -> str:
    import json

    return json.dumps({"startup_time": startup_time, "version": "0.5.23", "internal_states": [
        {"dspark_info_record": {"mode": "compact", "gamma": GAMMA, "verify_num_draft_tokens": GAMMA + 1,
                                "components": ["core", "reqs"], "records": records}}]}, allow_nan=True)


class _Fake:
    """Serves ``bodies`` in turn (the last one repeats); POST clears answer {"updated": true}."""

    def __init__(self):
        outer = self
        self.bodies: list[str] = [_body([])]
        self.gets = self.clears = 0

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                data = outer.bodies[min(outer.gets, len(outer.bodies) - 1)].encode()
                outer.gets += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                outer.clears += 1
                self.send_response(200)
                self.send_header("Content-Length", "17")
                self.end_headers()
                self.wfile.write(b'{"updated": true}')

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"


@pytest.fixture
def fake():
    srv = _Fake()
    yield srv
    srv.httpd.shutdown()


def _collect(fake, tmp_path, bodies: list[str], *, polls: int, clear_at: int = 0) -> tuple[Store, Collector]:
    store = Store(tmp_path)
    fake.bodies, fake.gets = [_body([]), *bodies], 0

    async def go():
        col = Collector(store, CollectOptions(url=fake.url, run_id="v", flush_interval=60, clear_at=clear_at))
        async with httpx.AsyncClient(base_url=fake.url, timeout=10) as client:
            await col._start_run(client)
            for _ in range(polls):
                await col.poll_once(client)
        col.writer.close()
        return col

    return store, asyncio.run(go())


def _fcts(store) -> list[int]:
    return store.read("steps", "v").column("forward_ct").to_pylist()


BAD = {
    "confidence_7": dict(confidence=[7.0, 0.5, 0.4]),
    "confidence_negative": dict(confidence=[-0.2, 0.5, 0.4]),
    "survival_2": dict(survival=[2.0, 0.5, 0.4]),
    "verify_len_99": dict(verify_len=99),
    "acc_len_500": dict(acc_len=500),
    "correct_drafts_negative": dict(correct_drafts=-3, acc_len=-2),
    "draft_tokens_short": dict(draft_tokens=[1, 2]),
    "draft_token_negative": dict(draft_tokens=[1, -2, 3]),
    "confidence_long": dict(confidence=[0.5, 0.5, 0.5, 0.5]),
    "mode_static_in_compact": dict(mode="static"),
    "cap_trim_in_compact": dict(cap_trim=1),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_an_impossible_record_is_dead_lettered_once_and_the_rest_kept(fake, tmp_path, name):
    body = _body([_rec(1), _rec(2, **BAD[name]), _rec(3)])
    store, col = _collect(fake, tmp_path, [body], polls=3)
    assert sorted(_fcts(store)) == [1, 3]
    dead = store.read("dead_letters", "v").to_pylist()
    assert len(dead) == 1 and "forward_ct 2 is not a possible record" in dead[0]["reason"]


def test_a_nan_record_spoils_only_itself(fake, tmp_path):
    body = _body([_rec(1), _rec(2, confidence=[float("nan"), 0.5, 0.4]), _rec(3)])
    assert "NaN" in body
    later = _body([_rec(1), _rec(2, confidence=[float("nan"), 0.5, 0.4]), _rec(3), _rec(4)])
    store, col = _collect(fake, tmp_path, [body, later], polls=4, clear_at=3)
    assert sorted(_fcts(store)) == [1, 3, 4]
    dead = store.read("dead_letters", "v").to_pylist()
    assert len(dead) == 1 and "NaN" in dead[0]["reason"]  # once, though it stayed in the deque
    assert col.summary.poll_errors == 0 and fake.clears >= 1  # the body was used, so clears happen


def test_a_duplicate_and_an_out_of_order_forward_ct_are_stored_once_and_fake_no_restart(fake, tmp_path):
    first = _body([_rec(1), _rec(2), _rec(2), _rec(3)])
    second = _body([_rec(1), _rec(2), _rec(3), _rec(4), _rec(2), _rec(5)])
    huge = _body([_rec(1), _rec(2), _rec(3), _rec(4), _rec(5), _rec(2**62), _rec(6)])
    store, col = _collect(fake, tmp_path, [first, second, huge], polls=3)
    assert sorted(_fcts(store)) == [1, 2, 3, 4, 5, 6]
    assert store.read("gaps", "v").num_rows == 0 and col.cursor.segment == 0
    reasons = [d["reason"] for d in store.read("dead_letters", "v").to_pylist()]
    assert any("repeats" in r for r in reasons) and any("out of order" in r for r in reasons)
    assert any("outside (0, 2^53)" in r for r in reasons)


def test_a_lone_low_record_does_not_fake_a_restart(fake, tmp_path):
    store, col = _collect(fake, tmp_path, [_body([_rec(1), _rec(2), _rec(3)]), _body([_rec(2)])], polls=3)
    assert col.cursor.segment == 0 and store.read("gaps", "v").num_rows == 0


def test_a_flapping_startup_time_is_two_servers_not_restarts(fake, tmp_path):
    a = _body([_rec(1), _rec(2), _rec(3)], startup_time=1.0)
    b = _body([_rec(1), _rec(2)], startup_time=2.0)
    a2 = _body([_rec(1), _rec(2), _rec(3), _rec(4)], startup_time=1.0)
    b2 = _body([_rec(1), _rec(2), _rec(3)], startup_time=2.0)
    store, col = _collect(fake, tmp_path, [a, b, a2, b2, a2, b2], polls=6)
    assert col.cursor.segment <= 1  # at most the first flip looked like a restart
    steps = store.read("steps", "v")
    keys = list(zip(steps.column("segment").to_pylist(), steps.column("forward_ct").to_pylist()))
    assert len(keys) == len(set(keys))
    reasons = [d["reason"] for d in store.read("dead_letters", "v").to_pylist()]
    assert sum("two servers answer behind one URL" in r for r in reasons) == 1


def test_a_body_without_dspark_records_is_a_poll_error(fake, tmp_path):
    import json

    plain = json.dumps({"startup_time": 1.0, "version": "0.5.23", "internal_states": [{}]})
    store, col = _collect(fake, tmp_path, [plain], polls=2)
    assert col.summary.poll_errors == 2
    col_gaps = [g for g in store.read("gaps", "v").to_pylist() if g["reason"] == "poll_error"]
    assert not col_gaps  # still open: closed when a poll succeeds or the run ends
    assert col.outage.polls == 2
