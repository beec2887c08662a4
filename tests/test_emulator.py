"""The emulator: SGLang's modes, records and endpoints, and identical commits across modes."""

import httpx
import numpy as np
import pytest

from dspark_obs.emulator.engine import Engine, EngineConfig, GenerateRequest
from dspark_obs.records import InfoRecordPayload
from dspark_obs.scheduler import survival_from_confidence
import msgspec

from conftest import run_engine


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_mode_commits_identical_tokens_for_the_same_seed(temperature):
    outs = {mode: run_engine(mode, temperature=temperature)[1] for mode in ("static", "compact", "cap-accept")}
    assert set(outs["static"]) == set(outs["compact"]) == set(outs["cap-accept"])
    for rid in outs["static"]:
        assert outs["compact"][rid]["output_ids"] == outs["cap-accept"][rid]["output_ids"] \
            == outs["static"][rid]["output_ids"], rid


def test_a_different_seed_commits_different_tokens():
    a = run_engine("compact", n=6, temperature=0.8, seed=1)[1]
    b = run_engine("compact", n=6, temperature=0.8, seed=2)[1]
    assert any(a[r]["output_ids"] != b[r]["output_ids"] for r in a)


def _records(eng):
    return [rec for payload in eng.dump() for rec in payload["records"]]


@pytest.mark.parametrize("mode", ["static", "compact", "cap-accept"])
def test_record_invariants_per_mode(mode):
    eng, _ = run_engine(mode, temperature=0.7)
    gamma = eng.cfg.gamma
    recs = _records(eng)
    assert recs
    for rec in recs:
        verify = [q["verify_len"] for q in rec["reqs"]]
        for q in rec["reqs"]:
            window = q["verify_len"] - 1
            assert 1 <= q["verify_len"] <= gamma + 1
            assert q["acc_len"] == q["correct_drafts"] + 1
            assert 0 <= q["correct_drafts"] <= window
            assert len(q["draft_tokens"]) == gamma
            if mode == "cap-accept":
                assert q["correct_drafts"] + q["cap_trim"] == q["emu_block_accept"]
            else:
                assert q["cap_trim"] == 0
                assert q["correct_drafts"] == min(q["emu_block_accept"], window)
            if mode == "static":
                assert "confidence" not in q and "survival" not in q
            else:
                surv = survival_from_confidence(np.asarray(q["confidence"], dtype=np.float32))
                assert q["survival"] == [round(float(s), 4) for s in surv]
        if mode == "static":
            assert rec["num_verify_tokens"] == rec["bs"] * (gamma + 1) and "budget" not in rec
        elif mode == "cap-accept":
            assert rec["num_verify_tokens"] == sum(verify)
        else:
            assert rec["num_verify_tokens"] >= sum(verify)
            assert rec["num_verify_tokens"] in eng.capture_tiers
            assert sum(v - 1 for v in verify) <= rec["budget"]
        assert rec["num_running_reqs"] == rec["bs"] == len(rec["reqs"])


def test_records_decode_with_sglangs_record_contract():
    eng, _ = run_engine("compact", n=9)
    for payload in eng.dump():
        decoded = msgspec.json.decode(msgspec.json.encode(payload), type=InfoRecordPayload)
        assert decoded.gamma == 6 and decoded.verify_num_draft_tokens == 7
        assert len(decoded.records) == len(payload["records"])


def test_spec_meta_info_matches_the_steps():
    eng, results = run_engine("cap-accept", n=9, temperature=0.7)
    recs = _records(eng)
    for rid, res in results.items():
        meta = res["meta_info"]
        steps = [q for rec in recs for q in rec["reqs"] if q["rid"] == rid]
        assert meta["spec_verify_ct"] == len(steps)
        assert meta["spec_num_correct_drafts"] == sum(q["correct_drafts"] for q in steps)
        assert meta["spec_cap_length"] == pytest.approx(np.mean([q["verify_len"] for q in steps]))
        assert meta["spec_block_accept_length"] == pytest.approx(
            np.mean([q["acc_len"] + q["cap_trim"] for q in steps]))
        # the prefill token is not a verify step
        assert sum(q["acc_len"] for q in steps) >= meta["completion_tokens"] - 1
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
        assert all(len(t) == 5 for t in meta["output_top_logprobs"])


def test_prefix_len_counts_prompt_and_committed_output_before_the_anchor():
    eng, results = run_engine("compact", n=3)
    recs = _records(eng)
    for rid, res in results.items():
        prompt = res["meta_info"]["prompt_tokens"]
        steps = [q for rec in recs for q in rec["reqs"] if q["rid"] == rid]
        committed = 1  # the prefill token
        for q in steps:
            assert q["prefix_len"] == prompt + committed - 1
            committed += q["acc_len"]


def test_default_profiles_reproduce_the_write_up_shape():
    eng, _ = run_engine("compact", n=150, conc=48, temperature=0.0)
    by = {}
    for rec in _records(eng):
        for q in rec["reqs"]:
            by.setdefault(q["rid"].rsplit("-", 1)[0], []).append((q["verify_len"] - 1, q["correct_drafts"],
                                                                  q["emu_block_accept"]))
    window = {w: np.array([x[0] for x in v]) for w, v in by.items()}
    mean = {w: v.mean() for w, v in window.items()}
    util = {w: sum(x[1] for x in v) / sum(x[2] for x in v) for w, v in by.items()}
    assert mean["gsm8k"] > mean["arena-hard"] > mean["poetry"]
    for w, target in {"gsm8k": 5.24, "arena-hard": 3.78, "poetry": 2.91}.items():
        assert abs(mean[w] - target) < 0.2, (w, mean[w])
        assert 0.85 <= util[w] <= 0.98, (w, util[w])
    # the write-up: about 55% of gsm8k steps at the full window, about 80% of poetry steps at <= 3
    assert 0.50 <= (window["gsm8k"] == 6).mean() <= 0.62
    assert 0.75 <= (window["poetry"] <= 3).mean() <= 0.88


def test_deque_bound_and_clear():
    eng, _ = run_engine("compact", n=9, max_records=10)
    payload = eng.dump()[0]
    assert len(payload["records"]) == 10
    assert eng.ranks[0].dumper.records_produced > 10
    eng.clear_records()
    assert eng.dump()[0]["records"] == []


def test_bad_requests_are_rejected():
    eng = Engine(EngineConfig())
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.submit(GenerateRequest(rid="x", text="hi", max_new_tokens=0))
    with pytest.raises(ValueError, match="SGLANG_RAGGED_VERIFY_MODE"):
        EngineConfig(mode="fast")


def test_http_endpoints_speak_sglang(emulator):
    srv = emulator(mode="compact", dp_size=2, seed=3)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/generate", json={"text": "[gsm8k] 2+2", "rid": "gsm8k-000001",
                                      "sampling_params": {"temperature": 0, "max_new_tokens": 30},
                                      "return_logprob": True, "top_logprobs_num": 3})
        assert r.status_code == 200
        meta = r.json()["meta_info"]
        assert meta["id"] == "gsm8k-000001" and meta["spec_verify_ct"] > 0
        assert len(meta["output_top_logprobs"][0]) == 3
        info = c.get("/server_info").json()
        assert len(info["internal_states"]) == 2
        assert info["speculative_algorithm"] == "DSPARK" and info["version"] == "0.5.23"
        payloads = [s["dspark_info_record"] for s in info["internal_states"]]
        assert sum(len(p["records"]) for p in payloads) > 0
        assert c.post("/set_internal_state",
                      json={"server_args": {"dspark_clear_info_records": True}}).json() == {"updated": True}
        info = c.get("/server_info").json()
        assert all(s["dspark_info_record"]["records"] == [] for s in info["internal_states"])
        assert c.post("/set_internal_state", json={"server_args": {"nope": 1}}).json() == {"updated": False}
        metrics = c.get("/metrics").text
        for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:spec_cap_length",
                     "sglang:spec_verify_calls_total"):
            assert name in metrics
        assert c.get("/health").status_code == 200
        assert c.post("/generate", json={"rid": "x"}).status_code == 400
        assert c.post("/generate", content=b"{not json").status_code == 400
