"""Companion replays without a server: inputs, selection, concurrency, identity, the mode check."""

from __future__ import annotations

import datetime as dt
import json

import msgspec
import pyarrow as pa
import pytest

from collectors.sglang.companion import (
    CompanionError, parse_server_info, require_cap_accept, resolve_concurrency, select,
)
from collectors.sglang.driver import PlannedRequest, generate_body, openai_body
from collectors.sglang.replay_inputs import from_requests, merge, read_prompts, read_request_log
from dspark_obs import schema
from dspark_obs.estimators import pairing

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)


def _log_line(event: str, rid, obj: dict, out: dict | None = None, ts: str = "2026-11-01T10:00:00") -> str:
    data = {"timestamp": ts, "event": event, "rid": rid, "obj": obj}
    if out is not None:
        data["out"] = out
    return "[2026-11-01 10:00:00] " + json.dumps(data)


# -- request logs ------------------------------------------------------------------

def test_request_log_gives_token_ids_full_sampling_params_outputs_and_received_order(tmp_path):
    sp = {"temperature": 0.7, "max_new_tokens": 64, "sampling_seed": 11, "top_p": 0.9, "min_p": None}
    lines = [
        "[2026-11-01 10:00:00] INFO some ordinary log line",
        _log_line("request.received", "b", {"input_ids": [7, 8], "sampling_params": sp}, ts="2026-11-01T10:00:01"),
        _log_line("request.received", "a", {"text": "hello there", "sampling_params": sp}, ts="2026-11-01T10:00:02"),
        _log_line("request.finished", "a", {"text": "hello there", "sampling_params": sp},
                  {"output_ids": [1, 2, 3], "meta_info": {"e2e_latency": 0.5}}, ts="2026-11-01T10:00:05"),
        # after logging the received event SGLang fills in obj.text from the ids: ids still win
        _log_line("request.finished", "b", {"input_ids": [7, 8], "text": "w7 w8", "sampling_params": sp},
                  {"meta_info": {"output_token_logprobs": [[-0.1, 4, None], [-0.2, 5, None]]}},
                  ts="2026-11-01T10:00:06"),
        _log_line("request.received.openai", None, {"prompt": "x"}),
    ]
    path = tmp_path / "requests.log"
    path.write_text("\n".join(lines) + "\n")
    got = read_request_log(path, workload=lambda rid: "w-" + rid)
    assert got.problems == [] and got.skipped == 2
    a, b = got.inputs["a"], got.inputs["b"]
    assert (a.text, a.input_ids, a.input_kind) == ("hello there", None, "text")
    assert (b.input_ids, b.input_kind, b.text) == ((7, 8), "input_ids", "w7 w8")
    assert a.sampling_params == {"temperature": 0.7, "max_new_tokens": 64, "sampling_seed": 11, "top_p": 0.9}
    assert a.output_ids == (1, 2, 3) and b.output_ids == (4, 5)
    assert b.order < a.order and a.workload == "w-a" and a.source == "request-log"


def test_request_log_entries_without_a_whole_prompt_are_problems_naming_the_log_level(tmp_path):
    long_ids = list(range(1024)) + ["..."] + list(range(1024))
    lines = [
        _log_line("request.finished", "lvl1", {"sampling_params": {}}, {"meta_info": {}}),
        _log_line("request.finished", "cut", {"input_ids": long_ids}, {"meta_info": {}}),
        _log_line("request.finished", "cut-text", {"text": "a" * 1024 + "..." + "b" * 1024}, {"meta_info": {}}),
        _log_line("request.finished", "batch", {"text": ["p1", "p2"]}, {"meta_info": {}}),
        _log_line("request.finished", ["x", "y"], {"text": "p"}, {"meta_info": {}}),
        "{not json",
    ]
    path = tmp_path / "requests.log"
    path.write_text("\n".join(lines) + "\n")
    got = read_request_log(path)
    assert got.inputs == {}
    reasons = " | ".join(why for _, why in got.problems)
    assert len(got.problems) == 6
    assert "--log-requests-level 2 on (use 3" in reasons
    assert reasons.count("log with --log-requests-level 3") == 2
    assert "batch request" in reasons and "single string rid" in reasons and "not JSON" in reasons


# -- prompts files and stored requests -----------------------------------------------

def test_prompts_jsonl_validates_each_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join([
        json.dumps({"rid": "r1", "input_ids": [3, 4], "output_ids": [9]}),
        json.dumps({"rid": "r2", "text": "hi", "sampling_params": {"temperature": 0}, "workload": "poetry"}),
        json.dumps({"text": "no rid"}),
        json.dumps({"rid": "r3"}),
        json.dumps({"rid": "r4", "text": "x", "sampling_params": [1]}),
        "[1, 2]",
    ]) + "\n")
    got = read_prompts(path)
    assert set(got.inputs) == {"r1", "r2"}
    assert got.inputs["r1"].input_ids == (3, 4) and got.inputs["r1"].output_ids == (9,)
    assert got.inputs["r2"].sampling_params == {"temperature": 0} and got.inputs["r2"].workload == "poetry"
    assert [w.split(":")[1] for w, _ in got.problems] == ["3", "4", "5", "6"]


def _requests(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema.schema_for("requests"))


def test_stored_requests_replay_ids_first_and_keep_sampling_and_order():
    table = _requests([
        {"rid": "g-000001", "api": "chat", "prompt_text": "p1", "temperature": 0.7, "max_new_tokens": 32,
         "sampling_seed": 5, "submitted_at": T0, "workload": "g"},
        {"rid": "g-000002", "api": "log", "prompt_text": "p2", "input_ids": [1, 2], "temperature": 0.0},
        {"rid": "g-000003", "api": "generate"},  # redacted: nothing to replay
    ])
    got = from_requests(table)
    assert set(got.inputs) == {"g-000001", "g-000002"}
    one, two = got.inputs["g-000001"], got.inputs["g-000002"]
    assert (one.api, one.text, one.order) == ("chat", "p1", T0.timestamp())
    assert one.sampling_params == {"temperature": 0.7, "max_new_tokens": 32, "sampling_seed": 5}
    assert (two.api, two.input_kind, two.sampling_params) == ("generate", "input_ids", {"temperature": 0.0})


def test_file_inputs_override_stored_prompts_but_keep_stored_sampling_and_order(tmp_path):
    stored = from_requests(_requests([{"rid": "r1", "prompt_text": "old", "temperature": 0.7,
                                       "sampling_seed": 5, "submitted_at": T0}]))
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"rid": "r1", "input_ids": [4, 5]}) + "\n")
    merged = merge(stored, [read_prompts(path)])
    assert merged["r1"].input_ids == (4, 5) and merged["r1"].source == "prompts"
    assert merged["r1"].sampling_params == {"temperature": 0.7, "sampling_seed": 5}
    assert merged["r1"].order == T0.timestamp()


# -- request bodies ---------------------------------------------------------------------

def test_replayed_bodies_send_token_ids_extra_sampling_params_and_leave_unknowns_to_the_server():
    req = PlannedRequest(0, "r1", None, "text", None, 32, 7, input_ids=(5, 6), sampling_params={"top_p": 0.9})
    body = generate_body(req, top_logprobs=5)
    assert body["input_ids"] == [5, 6] and "text" not in body
    assert body["sampling_params"] == {"top_p": 0.9, "max_new_tokens": 32, "sampling_seed": 7}
    completion = openai_body(req, "completions", model="m", top_logprobs=5)
    assert completion["prompt"] == [5, 6] and completion["seed"] == 7 and "temperature" not in completion
    plain = PlannedRequest(1, "r2", "w", "hello", 0.0, 16, 3)
    assert generate_body(plain, top_logprobs=5)["sampling_params"] == {
        "temperature": 0.0, "max_new_tokens": 16, "sampling_seed": 3}


# -- selection, concurrency ----------------------------------------------------------------

def test_a_sample_is_seeded_and_keeps_the_original_order():
    rids = [f"r{i}" for i in range(50)]
    first, desc = select(rids, sample=10, seed=3)
    assert first == select(rids, sample=10, seed=3)[0] and first != select(rids, sample=10, seed=4)[0]
    assert first == sorted(first, key=rids.index) and desc == "10 of 50 (seed 3)"
    assert len(select(rids, fraction=0.2)[0]) == 10
    assert select(rids, sample=500) == (rids, "all")
    with pytest.raises(CompanionError, match="not both"):
        select(rids, sample=2, fraction=0.5)
    with pytest.raises(CompanionError, match=r"--fraction must be in \(0, 1\], got 1.5"):
        select(rids, fraction=1.5)


def test_concurrency_comes_from_the_flag_then_requests_then_labels_then_steps():
    assert resolve_concurrency([8, 8, 4], {"concurrency": "3"}, 2, given=5) == (5, "--concurrency")
    assert resolve_concurrency([8, 8, 4], {"concurrency": "3"}, 2) == (8, "requests.concurrency")
    assert resolve_concurrency([None], {"concurrency": "3"}, 2) == (3, "runs.labels")
    assert resolve_concurrency([], {}, 2) == (2, "steps (median running requests)")
    with pytest.raises(CompanionError, match="pass --concurrency C"):
        resolve_concurrency([], {}, None)


# -- the server's mode ------------------------------------------------------------------------

def _server_info(mode: str | None, env_mode: str | None, gamma: int = 6) -> bytes:
    payload = {"gamma": gamma, "verify_num_draft_tokens": gamma + 1, "components": ["core"], "records": []}
    if mode is not None:
        payload["mode"] = mode
    body = {"internal_states": [{"dspark_info_record": payload}], "version": "0.5.23", "startup_time": 1.0}
    if env_mode is not None:
        body["env"] = {"SGLANG_RAGGED_VERIFY_MODE": env_mode}
    return msgspec.json.encode(body)


def test_the_mode_comes_from_the_payload_else_from_the_env():
    assert parse_server_info("u", _server_info("cap-accept", "compact")).mode_from == "dspark_info_record"
    env_only = parse_server_info("u", _server_info(None, "cap-accept"))
    assert (env_only.mode, env_only.mode_from) == ("cap-accept", "env")
    require_cap_accept(env_only, gamma=6)


@pytest.mark.parametrize("mode,env_mode,seen", [("compact", None, "mode 'compact'"), ("static", "static", "'static'"),
                                                (None, None, "no verify mode")])
def test_a_server_not_in_cap_accept_mode_is_refused_naming_the_env_var(mode, env_mode, seen):
    check = parse_server_info("http://h:1", _server_info(mode, env_mode))
    with pytest.raises(CompanionError, match="SGLANG_RAGGED_VERIFY_MODE=cap-accept") as info:
        require_cap_accept(check)
    assert seen in str(info.value)


def test_a_different_block_size_or_no_records_payload_is_refused():
    with pytest.raises(CompanionError, match="blocks of 4 tokens but the run drafted 6"):
        require_cap_accept(parse_server_info("u", _server_info("cap-accept", None, gamma=4)), gamma=6)
    with pytest.raises(CompanionError, match="SGLANG_DSPARK_DEBUG_DUMP"):
        parse_server_info("u", msgspec.json.encode({"internal_states": [{}]}))


# -- identity ----------------------------------------------------------------------------------

def _tokens(**seqs) -> pa.Table:
    rows = [{"rid": rid, "pos": i, "token_id": t} for rid, ids in seqs.items() for i, t in enumerate(ids)]
    return pa.Table.from_pylist(rows, schema=pa.schema([("rid", pa.string()), ("pos", pa.int32()),
                                                        ("token_id", pa.int32())]))


def test_identity_compares_every_committed_token_and_names_the_first_divergence():
    original = _tokens(a=[1, 2, 3], b=[1, 2, 3], c=[1, 2, 3], d=[1])
    replay = _tokens(**{"a.x": [1, 2, 3], "b.x": [1, 2, 4], "c.x": [1, 2]})
    got = {r["rid"]: r for r in pairing.output_identity(
        original, replay, {"a": "a.x", "b": "b.x", "c": "c.x", "d": "d.x"}).to_pylist()}
    assert got["a"]["identical"] is True and got["a"]["first_divergence"] is None
    assert (got["b"]["identical"], got["b"]["first_divergence"]) == (False, 2)
    assert (got["c"]["identical"], got["c"]["first_divergence"], got["c"]["companion_output_tokens"]) == (False, 2, 2)
    assert got["d"]["identical"] is None and got["d"]["output_tokens"] == 1


def test_status_follows_inputs_then_completion_then_identity():
    assert pairing.status_of(replayed=False, has_inputs=False, identical=None) == "no_inputs"
    assert pairing.status_of(replayed=False, has_inputs=True, identical=None) == "failed"
    assert pairing.status_of(replayed=True, has_inputs=True, identical=None) == "unverified"
    assert pairing.status_of(replayed=True, has_inputs=True, identical=False) == "diverged"
    assert pairing.status_of(replayed=True, has_inputs=True, identical=True) == "identical"
