"""SGLang 0.5.23's DSpark debug-dump records, as data contracts.

These mirror ``DecodeStepRecord`` and ``ReqDetail`` in
``sglang/srt/speculative/dspark_components/dspark_observability.py`` field for
field, with the same defaults and ``omit_defaults=True``: a field equal to its
default is absent from the JSON.  The emulator encodes with them, so it
speaks exactly what a real server speaks.  The collector decodes with its own
contract of the same fields (``collectors/sglang/decode.py``: the same names and
defaults, plus the Arrow columns' integer ranges, so a bad value is one dead
letter rather than a failed write).  The fidelity tier checks both against
SGLang's own structs: these field for field, the collector by decoding what
SGLang's structs encode.
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec

# SGLang keeps at most this many records server-side (INFO_DUMP_MAX_RECORDS).
INFO_DUMP_MAX_RECORDS = 200_000
# step_cpu_ms is dropped when the gap between decode steps exceeds this.
INFO_DUMP_MAX_STEP_CPU_SECONDS = 1.0
# Components understood by SGLANG_DSPARK_DEBUG_DUMP.
INFO_COMPONENTS = (
    "core",
    "draft_gpu_time",
    "reqs",
    "step_cpu_time",
    "step_gpu_time",
    "target_verify_gpu_time",
)


class ReqDetail(msgspec.Struct, omit_defaults=True):
    """One request's outcome in one decode step (SGLang's ``ReqDetail``)."""

    req_pool_index: int
    prefix_len: int
    verify_len: int
    acc_len: int
    correct_drafts: int
    cap_trim: int
    bonus_token: int
    draft_tokens: list[int]
    rid: Optional[str] = None
    confidence: Optional[list[float]] = None
    survival: Optional[list[float]] = None


class DecodeStepRecord(msgspec.Struct, omit_defaults=True):
    """One decode step on one DP rank (SGLang's ``DecodeStepRecord``)."""

    forward_ct: int
    bs: int = -1
    mode: str = ""
    budget: Optional[int] = None
    lag_steps: Optional[int] = None
    num_running_reqs: int = -1
    num_verify_tokens: int = -1
    verify_tokens_local: int = -1
    verify_tokens_dp_synced: int = -1
    verify_tokens_graph_key: int = -1
    predicted_step_ms: Optional[float] = None
    predicted_theta: Optional[float] = None
    step_cpu_ms: Optional[float] = None
    step_gpu_ms: Optional[float] = None
    draft_gpu_ms: Optional[float] = None
    target_verify_gpu_ms: Optional[float] = None
    reqs: Optional[list[ReqDetail]] = None


class InfoRecordPayload(msgspec.Struct):
    """``internal_states[i]["dspark_info_record"]`` of ``GET /server_info``."""

    mode: str
    gamma: int
    verify_num_draft_tokens: int
    components: list[str]
    records: list[DecodeStepRecord]
    simulate_acc_len: Optional[float] = None


def encode_record(record: DecodeStepRecord) -> dict[str, Any]:
    """The record as SGLang's ``dump()`` emits it: builtins, defaults omitted."""
    return msgspec.to_builtins(record)
