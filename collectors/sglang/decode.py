"""Decode ``/server_info`` bodies into ``steps`` and ``step_reqs`` rows.

Typed msgspec decoding of SGLang's payload (``omit_defaults`` records: absent
fields take SGLang's defaults), then column-wise Arrow construction.  Fields a
newer SGLang adds are ignored; a record that does not fit the contract is
handed back as a dead letter with the reason instead of failing the whole poll.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import msgspec
import pyarrow as pa

from dspark_obs import schema


class _Req(msgspec.Struct):
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
    # Emulator-only truth; a real SGLang server never sends these.
    emu_block_accept: Optional[int] = None
    emu_expected_block_accept: Optional[float] = None


class _Record(msgspec.Struct):
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
    reqs: Optional[list[_Req]] = None


class _Payload(msgspec.Struct):
    mode: str = ""
    gamma: int = 0
    verify_num_draft_tokens: int = 0
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
        dead: list[tuple[str, bytes]] = []
        for raw in payload.records:
            try:
                good.append(_record_decoder.decode(raw))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                dead.append((f"dp_rank {i}: record does not match DecodeStepRecord: {exc}", bytes(raw)))
        ranks.append(RankPayload(i, payload.mode, payload.gamma, good, dead, tuple(payload.components)))
    return ServerInfoPayload(info.startup_time, info.version, ranks, has_dspark)


def server_args(body: bytes) -> dict[str, Any]:
    """The body's top-level server arguments, without the bulky record payloads."""
    data = msgspec.json.decode(body)
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
