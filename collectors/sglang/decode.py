"""Decode ``/server_info`` bodies into ``steps`` and ``step_reqs`` rows.

Typed msgspec decoding of SGLang's payload (``omit_defaults`` records: absent
fields take SGLang's defaults), then column-wise Arrow construction.  Fields a
newer SGLang adds are ignored; a record that does not fit the contract is
handed back as a dead letter with the reason instead of failing the whole poll.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Optional

import msgspec
import pyarrow as pa

from dspark_obs import schema

# Integer ranges of the Arrow columns the values land in: a value outside its
# column's range is a contract violation reported per record, never an
# overflow that would fail a whole batch at write time.
I16 = Annotated[int, msgspec.Meta(ge=-(2**15), le=2**15 - 1)]
I32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Req(msgspec.Struct):
    req_pool_index: I32
    prefix_len: I32
    verify_len: I16
    acc_len: I16
    correct_drafts: I16
    cap_trim: I16
    bonus_token: I32
    draft_tokens: list[I32]
    rid: Optional[str] = None
    confidence: Optional[list[float]] = None
    survival: Optional[list[float]] = None
    # Emulator-only truth; a real SGLang server never sends these.
    emu_block_accept: Optional[I16] = None
    emu_expected_block_accept: Optional[float] = None


class _Record(msgspec.Struct):
    forward_ct: I64
    bs: I32 = -1
    mode: str = ""
    budget: Optional[I32] = None
    lag_steps: Optional[I32] = None
    num_running_reqs: I32 = -1
    num_verify_tokens: I32 = -1
    verify_tokens_local: I32 = -1
    verify_tokens_dp_synced: I32 = -1
    verify_tokens_graph_key: I32 = -1
    predicted_step_ms: Optional[float] = None
    predicted_theta: Optional[float] = None
    step_cpu_ms: Optional[float] = None
    step_gpu_ms: Optional[float] = None
    draft_gpu_ms: Optional[float] = None
    target_verify_gpu_ms: Optional[float] = None
    reqs: Optional[list[_Req]] = None


class _Payload(msgspec.Struct):
    mode: str = ""
    gamma: I16 = 0
    verify_num_draft_tokens: I32 = 0
    components: list[str] = []
    records: list[msgspec.Raw] = []
    simulate_acc_len: Optional[float] = None


class _State(msgspec.Struct):
    dspark_info_record: Optional[_Payload] = None
    avg_spec_accept_length: Optional[float] = None


class _ServerInfo(msgspec.Struct):
    internal_states: list[_State] = []
    startup_time: Optional[float] = None
    version: Optional[str] = None


@dataclass
class RankPayload:
    """One DP rank's decoded records, oldest first, and what could not be decoded."""

    dp_rank: int
    mode: str
    gamma: int
    records: list[_Record]
    dead: list[tuple[str, bytes]] = field(default_factory=list)  # (reason, raw record)
    components: tuple[str, ...] = ()
    raws: list[bytes] = field(default_factory=list)  # raw JSON of each good record, same order


@dataclass
class ServerInfoPayload:
    startup_time: Optional[float]
    version: Optional[str]
    ranks: list[RankPayload]
    has_dspark: bool


_info_decoder = msgspec.json.Decoder(_ServerInfo)
_record_decoder = msgspec.json.Decoder(_Record)


class PayloadError(ValueError):
    """The body is not a ``/server_info`` response at all."""


def decode_server_info(body: bytes) -> ServerInfoPayload:
    """Decode a ``/server_info`` body; raise ``PayloadError`` if it is unusable."""
    try:
        info = _info_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PayloadError(f"not a /server_info body: {exc}") from exc
    ranks: list[RankPayload] = []
    has_dspark = False
    for i, state in enumerate(info.internal_states):
        payload = state.dspark_info_record
        if payload is None:
            ranks.append(RankPayload(i, "", 0, []))
            continue
        has_dspark = True
        good: list[_Record] = []
        raws: list[bytes] = []
        dead: list[tuple[str, bytes]] = []
        for raw in payload.records:
            try:
                good.append(_record_decoder.decode(raw))
                raws.append(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                dead.append((f"dp_rank {i}: record does not match DecodeStepRecord: {exc}", bytes(raw)))
        ranks.append(RankPayload(i, payload.mode, payload.gamma, good, dead, tuple(payload.components), raws))
    return ServerInfoPayload(info.startup_time, info.version, ranks, has_dspark)


def server_args(body: bytes) -> dict[str, Any]:
    """The body's top-level server arguments, without the bulky record payloads."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise PayloadError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PayloadError("a /server_info body must be a JSON object")
    states = data.get("internal_states")
    if isinstance(states, list):
        data["internal_states"] = [
            {k: v for k, v in s.items() if k != "dspark_info_record"} if isinstance(s, dict) else s
            for s in states
        ]
    return data


def records_to_tables(records: list[_Record], *, dp_rank: int, segment: int) -> tuple[pa.Table, pa.Table]:
    """``steps`` and ``step_reqs`` Arrow tables for one rank's records."""
    n = len(records)
    steps = {
        "dp_rank": [dp_rank] * n,
        "forward_ct": [r.forward_ct for r in records],
        "segment": [segment] * n,
    }
    for name in ("bs", "num_running_reqs", "mode", "budget", "lag_steps", "num_verify_tokens",
                 "verify_tokens_local", "verify_tokens_dp_synced", "verify_tokens_graph_key",
                 "predicted_step_ms", "predicted_theta", "step_cpu_ms", "step_gpu_ms",
                 "draft_gpu_ms", "target_verify_gpu_ms"):
        steps[name] = [getattr(r, name) for r in records]
    steps_table = pa.Table.from_pydict(steps, schema=schema.schema_for("steps"))

    cols: dict[str, list] = {name: [] for name in schema.STEP_REQS.names}
    for r in records:
        if not r.reqs:
            continue
        reqs = r.reqs
        k = len(reqs)
        cols["dp_rank"].extend([dp_rank] * k)
        cols["forward_ct"].extend([r.forward_ct] * k)
        cols["segment"].extend([segment] * k)
        for q in reqs:
            cols["rid"].append(q.rid)
            cols["req_pool_index"].append(q.req_pool_index)
            cols["prefix_len"].append(q.prefix_len)
            cols["verify_len"].append(q.verify_len)
            cols["acc_len"].append(q.acc_len)
            cols["correct_drafts"].append(q.correct_drafts)
            cols["cap_trim"].append(q.cap_trim)
            cols["bonus_token"].append(q.bonus_token)
            cols["draft_tokens"].append(q.draft_tokens)
            cols["confidence"].append(q.confidence)
            cols["survival"].append(q.survival)
            cols["emu_block_accept"].append(q.emu_block_accept)
            cols["emu_expected_block_accept"].append(q.emu_expected_block_accept)
    reqs_table = pa.Table.from_pydict(cols, schema=schema.schema_for("step_reqs"))
    return steps_table, reqs_table


_CONVERSION_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError, UnicodeError)


def records_to_tables_safe(records: list[_Record], raws: Optional[list[bytes]] = None, *, dp_rank: int,
                           segment: int) -> tuple[pa.Table, pa.Table, list[tuple[str, bytes]]]:
    """Like :func:`records_to_tables`, but a record Arrow cannot hold is returned as a dead letter.

    The whole batch is converted at once; only when that fails is it split to
    find the offending records (e.g. a rid that is not valid UTF-8), so the
    good records of the batch are kept.  Returns ``(steps, step_reqs, dead)``
    with ``dead`` a list of ``(reason, raw record)``.
    """
    try:
        steps, reqs = records_to_tables(records, dp_rank=dp_rank, segment=segment)
        return steps, reqs, []
    except _CONVERSION_ERRORS:
        pass
    good: list[_Record] = []
    dead: list[tuple[str, bytes]] = []
    for i, rec in enumerate(records):
        try:
            records_to_tables([rec], dp_rank=dp_rank, segment=segment)
            good.append(rec)
        except _CONVERSION_ERRORS as exc:
            raw = raws[i] if raws is not None and i < len(raws) else msgspec.json.encode(rec)
            dead.append((f"dp_rank {dp_rank}: forward_ct {rec.forward_ct} does not fit the store: "
                         f"{type(exc).__name__}: {exc}", bytes(raw)))
    steps, reqs = records_to_tables(good, dp_rank=dp_rank, segment=segment)
    return steps, reqs, dead
