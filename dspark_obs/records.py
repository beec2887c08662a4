"""SGLang 0.5.23's DSpark record formats, as data contracts: the one declaration of each.

``ReqDetail`` and ``DecodeStepRecord`` mirror
``sglang/srt/speculative/dspark_components/dspark_observability.py`` field for
field, with the same defaults and ``omit_defaults=True``: a field equal to its
default is absent from the JSON.  The emulator speaks them (its engines add the
truth of :class:`EmulatorReqDetail`); the collector decodes with contracts
derived from them (``collectors/sglang/decode.py``: these fields and defaults,
narrowed to the Arrow columns' integer ranges, so a bad value is one dead letter
rather than a failed write).  The fidelity tier checks both against SGLang's own
structs: these field for field, the collector by decoding what SGLang's structs
encode.

``BlockAcceptRow`` and ``BlockAcceptEosRow`` are the rows of SGLang's
block-accept estimator JSONL (``SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH``),
which the emulator writes and ``ingest --estimator-jsonl`` reads.
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


class EmulatorReqDetail(ReqDetail, omit_defaults=True):
    """A ``ReqDetail`` as the emulator sends it: SGLang's fields plus the truth a real server never sends."""

    emu_block_accept: Optional[int] = None  # drafts a full-block verify would accept
    emu_expected_given_window: Optional[float] = None  # E[full-block accepted drafts | what the window showed]


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


class BlockAcceptRow(msgspec.Struct, omit_defaults=True):
    """One request-step of the block-accept estimator JSONL, as ``dspark_block_accept_estimator.py`` writes it.

    ``fct`` the step, ``w`` the drafts verified, ``cl`` those accepted, ``ct``
    cap-accept's accepted drafts beyond the window; a censored step (``cl == w
    < gamma``) adds its ``trimmed_tokens`` and their drafter logprobs ``q_lp``;
    ``pg`` settles open blocks: ``[block_fct, offset, p_lp, token, realized]``.
    """

    rid: str
    fct: int
    w: int
    cl: int
    ct: int
    trimmed_tokens: Optional[list[int]] = None
    q_lp: Optional[list[float]] = None
    pg: Optional[list[tuple[int, int, float, int, int]]] = None


class BlockAcceptEosRow(msgspec.Struct):
    """The marker of a request that stopped at EOS with blocks still open (their ``fct``)."""

    rid: str
    eos_end: list[int]
