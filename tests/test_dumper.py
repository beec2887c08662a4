"""The emulator's info dumper speaks SGLang's record encoding and bookkeeping."""

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.emulator.dumper import ALL_COMPONENTS, InfoDumper
from dspark_obs.records import DecodeStepRecord, InfoRecordPayload, ReqDetail


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _step(fct, **over):
    step = {"forward_ct": fct, "bs": 1, "mode": "compact", "budget": 3, "lag_steps": 2,
            "num_running_reqs": 1, "num_verify_tokens": 8, "verify_tokens_local": 4,
            "verify_tokens_dp_synced": -1, "verify_tokens_graph_key": 8, "predicted_step_ms": 9.0,
            "predicted_theta": 400.0, "step_gpu_ms": 8.0, "draft_gpu_ms": 2.0,
            "target_verify_gpu_ms": 6.0,
            "reqs": [{"req_pool_index": 0, "prefix_len": 10, "verify_len": 4, "acc_len": 2,
                      "correct_drafts": 1, "cap_trim": 0, "bonus_token": 7,
                      "draft_tokens": [1, 2, 3], "rid": "r"}]}
    step.update(over)
    return step


def test_pending_step_drains_on_next_observe_and_on_dump():
    clock = Clock()
    d = InfoDumper(gamma=3, mode="compact", clock=clock)
    d.observe_decode_step(_step(2))
    assert d.records_produced == 0  # still pending, like a step whose device results are in flight
    clock.t += 0.01
    d.observe_decode_step(_step(3))
    assert d.records_produced == 1
    payload = d.dump()
    assert [r["forward_ct"] for r in payload["records"]] == [2, 3]
    assert payload["verify_num_draft_tokens"] == 4


def test_clear_loses_the_pending_step():
    clock = Clock()
    d = InfoDumper(gamma=3, mode="compact", clock=clock)
    d.observe_decode_step(_step(2))
    d.observe_decode_step(_step(3))
    d.clear()  # drops record 2 and pending 3
    d.observe_decode_step(_step(4))
    assert [r["forward_ct"] for r in d.dump()["records"]] == [4]


def test_step_cpu_ms_is_absent_after_prefill_clear_and_long_gaps():
    clock = Clock()
    d = InfoDumper(gamma=3, mode="compact", clock=clock)
    d.observe_decode_step(_step(2))          # first step: no previous stamp
    clock.t += 0.0125
    d.observe_decode_step(_step(3))          # 12.5 ms
    d.note_non_decode_step()                 # a prefill batch
    clock.t += 0.01
    d.observe_decode_step(_step(5))          # after prefill: absent
    clock.t += 2.0
    d.observe_decode_step(_step(6))          # > 1 s: absent
    recs = {r["forward_ct"]: r for r in d.dump()["records"]}
    assert "step_cpu_ms" not in recs[2]
    assert recs[3]["step_cpu_ms"] == 12.5
    assert "step_cpu_ms" not in recs[5] and "step_cpu_ms" not in recs[6]


def test_deque_is_bounded_and_keeps_the_newest():
    d = InfoDumper(gamma=3, mode="compact", clock=Clock(), max_records=5)
    for fct in range(1, 21):
        d.observe_decode_step(_step(fct))
    assert [r["forward_ct"] for r in d.dump()["records"]] == list(range(16, 21))


def test_components_select_fields():
    d = InfoDumper(gamma=3, mode="compact", clock=Clock(), components=frozenset({"core"}))
    d.observe_decode_step(_step(2))
    rec = d.dump()["records"][0]
    assert "reqs" not in rec and "step_gpu_ms" not in rec and rec["bs"] == 1
    only_reqs = InfoDumper(gamma=3, mode="compact", clock=Clock(), components=frozenset({"reqs"}))
    only_reqs.observe_decode_step(_step(2))
    rec = only_reqs.dump()["records"][0]
    assert set(rec) == {"forward_ct", "reqs"}  # bs=-1 etc. omitted as SGLang's defaults


_opt_int = st.one_of(st.none(), st.integers(-1, 10_000))
_opt_float = st.one_of(st.none(), st.floats(0, 1e4, allow_nan=False))
_req = st.fixed_dictionaries({
    "req_pool_index": st.integers(0, 512), "prefix_len": st.integers(0, 10**6),
    "verify_len": st.integers(1, 8), "acc_len": st.integers(1, 8), "correct_drafts": st.integers(0, 7),
    "cap_trim": st.integers(0, 7), "bonus_token": st.integers(0, 200_000),
    "draft_tokens": st.lists(st.integers(0, 200_000), min_size=1, max_size=8),
}, optional={
    "rid": st.text(min_size=1, max_size=12),
    "confidence": st.lists(st.floats(0, 1), min_size=1, max_size=8),
    "survival": st.lists(st.floats(0, 1), min_size=1, max_size=8),
})


@settings(max_examples=150, deadline=None)
@given(fct=st.integers(1, 10**9), bs=st.integers(-1, 512), mode=st.sampled_from(["", "compact", "static"]),
       budget=_opt_int, lag=_opt_int, nvt=st.integers(-1, 4096), pred=_opt_float, theta=_opt_float,
       gpu=_opt_float, reqs=st.one_of(st.none(), st.lists(_req, max_size=4)))
def test_records_encode_exactly_like_sglangs_omit_defaults_structs(fct, bs, mode, budget, lag, nvt, pred,
                                                                  theta, gpu, reqs):
    clock = Clock()
    d = InfoDumper(gamma=3, mode="compact", clock=clock, components=ALL_COMPONENTS)
    # the engine builds request entries in SGLang's field order; so does this test
    reqs = None if reqs is None else [{k: q[k] for k in ReqDetail.__struct_fields__ if k in q} for q in reqs]
    step = {"forward_ct": fct, "bs": bs, "mode": mode, "budget": budget, "lag_steps": lag,
            "num_running_reqs": bs, "num_verify_tokens": nvt, "verify_tokens_local": -1,
            "verify_tokens_dp_synced": -1, "verify_tokens_graph_key": nvt, "predicted_step_ms": pred,
            "predicted_theta": theta, "step_gpu_ms": gpu, "draft_gpu_ms": None,
            "target_verify_gpu_ms": gpu, "reqs": reqs}
    d.observe_decode_step(step)
    got = d.dump()["records"][0]
    want = msgspec.to_builtins(DecodeStepRecord(
        forward_ct=fct, bs=bs, mode=mode, budget=budget, lag_steps=lag, num_running_reqs=bs,
        num_verify_tokens=nvt, verify_tokens_graph_key=nvt, predicted_step_ms=pred, predicted_theta=theta,
        step_gpu_ms=gpu, target_verify_gpu_ms=gpu,
        reqs=None if reqs is None else [ReqDetail(**q) for q in reqs]))
    assert msgspec.json.encode(got) == msgspec.json.encode(want)
    # and the whole payload decodes as SGLang's payload
    payload = msgspec.json.decode(msgspec.json.encode(d.dump()), type=InfoRecordPayload)
    assert payload.records[0].forward_ct == fct
