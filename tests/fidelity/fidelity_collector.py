"""The collector decodes what SGLang's own record structs encode, losslessly.

Hypothesis builds SGLang's ``DecodeStepRecord`` / ``ReqDetail`` (with fields at
their defaults, so ``omit_defaults`` drops them), SGLang's msgspec encodes them
into a ``/server_info`` body, and the collector's decoder turns the body into
Arrow rows that must carry every value back (absent fields as SGLang's
defaults), with no dead letters.
"""

from __future__ import annotations

import math

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.srt.speculative.dspark_components import dspark_observability as sg_obs

from collectors.sglang.decode import decode_server_info, records_to_tables

GAMMA = 6
_f32 = st.floats(0.0, 1.0, width=32)
_opt_ms = st.one_of(st.none(), st.floats(0.0, 1e4, allow_nan=False))

_req = st.builds(
    sg_obs.ReqDetail,
    req_pool_index=st.integers(0, 4096), prefix_len=st.integers(0, 2**31 - 1),
    verify_len=st.integers(1, GAMMA + 1), acc_len=st.integers(1, GAMMA + 1),
    correct_drafts=st.integers(0, GAMMA), cap_trim=st.integers(0, GAMMA),
    bonus_token=st.integers(0, 2**31 - 1),
    draft_tokens=st.lists(st.integers(0, 2**31 - 1), min_size=GAMMA, max_size=GAMMA),
    rid=st.one_of(st.none(), st.text(min_size=1, max_size=16)),
    confidence=st.one_of(st.none(), st.lists(_f32, min_size=GAMMA, max_size=GAMMA)),
    survival=st.one_of(st.none(), st.lists(_f32, min_size=GAMMA, max_size=GAMMA)),
)

_record = st.builds(
    sg_obs.DecodeStepRecord,
    forward_ct=st.integers(1, 2**40), bs=st.integers(-1, 1024), mode=st.sampled_from(["", "compact", "static", "cap-accept"]),
    budget=st.one_of(st.none(), st.integers(0, 8192)), lag_steps=st.one_of(st.none(), st.integers(0, 4)),
    num_running_reqs=st.integers(-1, 1024), num_verify_tokens=st.integers(-1, 8192),
    verify_tokens_local=st.integers(-1, 8192), verify_tokens_dp_synced=st.integers(-1, 8192),
    verify_tokens_graph_key=st.integers(-1, 8192), predicted_step_ms=_opt_ms, predicted_theta=_opt_ms,
    step_cpu_ms=_opt_ms, step_gpu_ms=_opt_ms, draft_gpu_ms=_opt_ms, target_verify_gpu_ms=_opt_ms,
    reqs=st.one_of(st.none(), st.lists(_req, max_size=5)),
)

STEP_FIELDS = ("bs", "mode", "budget", "lag_steps", "num_running_reqs", "num_verify_tokens",
               "verify_tokens_local", "verify_tokens_dp_synced", "verify_tokens_graph_key",
               "predicted_step_ms", "predicted_theta", "step_cpu_ms", "step_gpu_ms", "draft_gpu_ms",
               "target_verify_gpu_ms")
REQ_FIELDS = ("rid", "req_pool_index", "prefix_len", "verify_len", "acc_len", "correct_drafts", "cap_trim",
              "bonus_token", "draft_tokens")


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(_record, min_size=1, max_size=6, unique_by=lambda r: r.forward_ct))
def test_sglang_encoded_records_decode_losslessly(records):
    records = sorted(records, key=lambda r: r.forward_ct)
    payload = {"mode": "compact", "gamma": GAMMA, "verify_num_draft_tokens": GAMMA + 1,
               "components": ["core", "reqs", "step_cpu_time"],
               "records": [msgspec.to_builtins(r) for r in records], "simulate_acc_len": None}
    body = msgspec.json.encode({"internal_states": [{"dspark_info_record": payload}], "startup_time": 1.0})
    info = decode_server_info(body)
    rank = info.ranks[0]
    assert not rank.dead, rank.dead
    steps, reqs = records_to_tables(rank.records, dp_rank=0, segment=0)
    assert steps.column("forward_ct").to_pylist() == [r.forward_ct for r in records]
    for row, rec in zip(steps.to_pylist(), records):
        for name in STEP_FIELDS:
            assert _same(row[name], getattr(rec, name)) or row[name] == getattr(rec, name), (name, row[name])
    expected = [(rec.forward_ct, q) for rec in records for q in (rec.reqs or [])]
    got = reqs.to_pylist()
    assert len(got) == len(expected)
    for row, (fct, q) in zip(got, expected):
        assert row["forward_ct"] == fct
        for name in REQ_FIELDS:
            assert row[name] == getattr(q, name), name
        for name in ("confidence", "survival"):
            want = getattr(q, name)
            assert (row[name] is None) == (want is None)
            if want is not None:  # float32 columns: the values SGLang sends are float32 already
                assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(row[name], want))
