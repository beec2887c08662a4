"""Decode ``/server_info`` bodies into ``steps`` and ``step_reqs`` rows.

Typed msgspec decoding of SGLang's payload (``omit_defaults`` records: absent
fields take SGLang's defaults), then column-wise Arrow construction.  Fields a
newer SGLang adds are ignored; a record that does not fit the contract is
handed back as a dead letter with the reason instead of failing the whole poll.

Two paths, one result.  The **fast path** decodes the whole body in one typed
pass in which each request's three lists (``draft_tokens``, ``confidence``,
``survival``) stay raw JSON; per DP rank they are then joined and parsed in
bulk by Arrow's number parser straight into column arrays, so no Python
``float`` or ``int`` is ever made for them (parsing Python floats is most of
the cost of a typed decode).  It takes only what it can prove it reads exactly
as the reference path would: anything else in a body (a record that breaks the
contract, a list with whitespace, ``null`` items or out-of-range values, an
integer ``-0`` among floats) sends the whole body down the **reference path**,
record by record, with its dead letters.  Tests check both agree.  (One
difference in kind: the fast path keeps no raw bytes per record, so a record
the *store* cannot hold — found later, in ``records_to_tables_safe`` — is
dead-lettered as its re-encoded JSON, defaults spelled out, as the reference
path does whenever it has no raws.)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable, Mapping, Optional

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collectors.contract import column_struct, derived_struct, fitting
from dspark_obs import records, schema

# SGLang's records (dspark_obs.records), each integer narrowed to the range of the Arrow column it lands
# in (collectors.contract).  The collector's structs keep every default on encode: a dead letter
# re-encoded from one spells its defaults out.
_Req = column_struct(records.EmulatorReqDetail, "_Req", schema.STEP_REQS, module=__name__, omit_defaults=False)
SglangRecord = column_struct(records.DecodeStepRecord, "SglangRecord", schema.STEPS, module=__name__,
                             types={"reqs": Optional[list[_Req]]}, omit_defaults=False)
SglangRecord.__doc__ = "A ``DecodeStepRecord`` as the collector decodes it (:mod:`collectors.contract`)."
# The payload of one DP rank, each field optional (a rank may send an empty payload); records stay raw
# so that each is decoded, or dead-lettered, on its own.
_Payload = derived_struct(records.InfoRecordPayload, "_Payload", {
    "gamma": fitting(int, pa.int16()), "verify_num_draft_tokens": fitting(int, pa.int32()),
    "records": list[msgspec.Raw]}, module=__name__,
    defaults={"mode": "", "gamma": 0, "verify_num_draft_tokens": 0, "components": [], "records": []})


class _State(msgspec.Struct):
    dspark_info_record: Optional[_Payload] = None
    avg_spec_accept_length: Optional[float] = None


class _ServerInfo(msgspec.Struct):
    internal_states: list[_State] = []
    startup_time: Optional[float] = None
    version: Optional[str] = None


# -- the fast path's contract: the same fields and checks, lists left raw ----------------

_LIST_FIELDS = ("draft_tokens", "confidence", "survival")
_FastReq = derived_struct(_Req, "_FastReq", {n: msgspec.Raw for n in _LIST_FIELDS}, module=__name__, gc=False)
# ``dict=True``: the parsed list columns of a record's rows ride in its ``__dict__``.
_FastRecord = derived_struct(SglangRecord, "_FastRecord", {"reqs": Optional[list[_FastReq]]}, module=__name__,
                             dict=True)
_FastPayload = derived_struct(_Payload, "_FastPayload", {"records": list[_FastRecord]}, module=__name__)
_FastState = derived_struct(_State, "_FastState", {"dspark_info_record": Optional[_FastPayload]}, module=__name__)
_FastServerInfo = derived_struct(_ServerInfo, "_FastServerInfo", {"internal_states": list[_FastState]},
                                 module=__name__)


@dataclass
class RankPayload:
    """One DP rank's decoded records, oldest first, and what could not be decoded."""

    dp_rank: int
    mode: str
    gamma: int
    records: list[SglangRecord]
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
_record_decoder = msgspec.json.Decoder(SglangRecord)
_fast_decoder = msgspec.json.Decoder(_FastServerInfo)


class PayloadError(ValueError):
    """The body is not a ``/server_info`` response at all."""


def decode_server_info(body: bytes, read_through: Optional[Mapping[int, int]] = None, *,
                       release: Optional[Callable[[int], None]] = None) -> ServerInfoPayload:
    """Decode a ``/server_info`` body; raise ``PayloadError`` if it is unusable.

    ``read_through`` maps a DP rank to the last ``forward_ct`` already stored:
    each poll returns the whole deque, so most records were read before, and
    the fast path then skips parsing their lists (their scalars are decoded as
    usual; :func:`lists_skipped` tells such a record, which must not be turned
    into rows — decode the body again without the hint if one is needed).
    ``release(n)``: the body's first ``n`` bytes are read and their memory may go
    (a mapped file's pages: :attr:`collectors.importers.documents.Document.release`);
    the fast path calls it as its list parse moves through the body.
    """
    fast = _decode_fast(body, read_through, release)
    if fast is not None:
        return fast
    return _decode_reference(body)


def lists_skipped(record: Any) -> bool:
    """True for a record whose lists :func:`decode_server_info` skipped under ``read_through``."""
    state = getattr(record, "__dict__", None)
    return state is not None and state.get("_lists", ()) is None


def _decode_fast(body: bytes, read_through: Optional[Mapping[int, int]] = None,
                 release: Optional[Callable[[int], None]] = None) -> Optional[ServerInfoPayload]:
    """The whole body in one pass, or None when only the reference path may read it."""
    try:
        info = _fast_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    read = None if release is None else _read_up_to(body, release)

    def rank_of(i: int, payload: Any) -> Optional[RankPayload]:
        if not _attach_lists(payload.records, read_through.get(i) if read_through else None, read):
            return None
        return RankPayload(i, payload.mode, payload.gamma, payload.records, [], tuple(payload.components), [])

    return _payload(info, rank_of)


def _payload(info: Any, rank_of: Callable[[int, Any], Optional[RankPayload]]) -> Optional[ServerInfoPayload]:
    """The body's ranks, in order: an empty one for a rank without a DSpark record, else
    ``rank_of(dp_rank, record payload)``; None as soon as ``rank_of`` gives None."""
    ranks: list[RankPayload] = []
    for i, state in enumerate(info.internal_states):
        payload = state.dspark_info_record
        rank = RankPayload(i, "", 0, []) if payload is None else rank_of(i, payload)
        if rank is None:
            return None
        ranks.append(rank)
    has_dspark = any(state.dspark_info_record is not None for state in info.internal_states)
    return ServerInfoPayload(info.startup_time, info.version, ranks, has_dspark)


_LIST_CHARS = b"0123456789-+.eE,[]"
_INT_CHARS = b"0123456789-,[]"
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]")
_CLOSE_TO_COMMA = bytes.maketrans(b"]", b",")
_OPEN, _CLOSE, _COMMA = ord("["), ord("]"), ord(",")
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_F32_MAX = float(np.finfo(np.float32).max)


def _parse_lists(raws: list[msgspec.Raw], *, integers: bool) -> Optional[tuple[np.ndarray, pa.Array, Optional[np.ndarray]]]:
    """Raw JSON lists (or ``null``) -> ``(offsets [n+1] int32, values, valid or None)``.

    None when a list is anything but compact numbers the reference decoder reads
    to the same values (``list[I32]`` for ``integers``, else ``Optional[list[float]]``
    stored as float32).  msgspec has already checked that each raw value is valid JSON.
    """
    n = len(raws)
    joined = b"".join(raws)
    nulls = joined.count(b"null") if joined.find(b"n") >= 0 else 0  # find is memchr: most bodies have none
    if nulls:
        if integers:
            return None
        joined = joined.replace(b"null", b"")
    if joined.translate(None, _INT_CHARS if integers else _LIST_CHARS):
        return None  # whitespace, strings, objects, null items, or floats where ints belong
    lists = n - nulls
    if joined.translate(None, _NOT_BRACKETS) != b"[]" * lists:
        return None  # nested lists (valid JSON, so brackets balance)
    buf = np.frombuffer(joined, dtype=np.uint8)
    closes = np.flatnonzero(buf == _CLOSE)
    commas = np.flatnonzero(buf == _COMMA)
    before = np.searchsorted(commas, closes)
    counts = np.diff(before, prepend=0) + 1
    counts[buf[closes - 1] == _OPEN] = 0  # "[]"
    if nulls:
        valid = np.fromiter((memoryview(r) != b"null" for r in raws), dtype=bool, count=n)  # Raw: not bytes
        if int(valid.sum()) != lists:
            return None
        per_row = np.zeros(n, dtype=np.int64)
        per_row[valid] = counts
    else:
        valid, per_row = None, counts
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(per_row, out=offsets[1:])
    total = int(offsets[-1])
    if not total:
        return offsets, pa.array([], pa.int32() if integers else pa.float32()), valid
    if joined.find(b"[]") >= 0:
        joined = joined.replace(b"[]", b"")
    text = joined.translate(_CLOSE_TO_COMMA, b"[")[:-1]  # "[a,b][c]" -> "a,b,c"
    if integers:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = np.fromstring(text, dtype=np.int64, sep=",")  # C strtoll; stops early on bad input
        if parsed.size != total or parsed.min() < _I32_MIN or parsed.max() > _I32_MAX:
            return None  # clamped (too many digits) or out of the column's range
        return offsets, pa.array(parsed.astype(np.int32)), valid
    try:
        tokens = pc.split_pattern(pa.array([text], pa.large_binary()), b",").flatten()
        parsed = _numpy(pc.cast(tokens.cast(pa.large_string()), pa.float64()), np.float64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if parsed.size != total or np.abs(parsed).max() > _F32_MAX or np.signbit(parsed[parsed == 0]).any():
        return None  # overflow to inf, or a -0 whose JSON spelling decides its sign: the reference knows
    return offsets, pa.array(parsed.astype(np.float32)), valid


def _numpy(array: pa.Array, dtype) -> np.ndarray:
    """The values of a null-free primitive Arrow array as numpy, zero-copy (``to_numpy`` would import pandas)."""
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * np.dtype(dtype).itemsize)


def _read_up_to(body, release: Callable[[int], None]) -> Callable[[Any], None]:
    """``read(req)``: ``release`` the body up to the end of request ``req``'s lists.  A Raw is a view of the
    body, so where it ends tells how far the parse has read (one outside the body releases nothing)."""
    base, size = np.frombuffer(body, dtype=np.uint8).ctypes.data, len(body)

    def read(req: Any) -> None:
        ends = [np.frombuffer(raw, dtype=np.uint8).ctypes.data - base + len(raw)
                for raw in (req.draft_tokens, req.confidence, req.survival)]
        if all(0 < end <= size for end in ends):
            release(max(ends))
    return read


def _attach_lists(records: list[_FastRecord], read_through: Optional[int] = None,
                  read: Optional[Callable[[Any], None]] = None) -> bool:
    """Parse every list of a rank in bulk and hand each record its rows' slices.

    Records at or below ``read_through`` (already stored) get ``None`` instead.  The requests go in
    blocks, a block's three lists together, and ``read`` hears of each block's last request: a mapped
    body's pages can go as the parse leaves them (:func:`_read_up_to`).
    """
    if read_through is not None:
        for rec in records:
            if rec.forward_ct <= read_through:
                rec.__dict__["_lists"] = None
        records = [r for r in records if r.forward_ct > read_through]
    rows = [len(r.reqs) if r.reqs else 0 for r in records]
    reqs = [q for r in records if r.reqs for q in r.reqs]
    blocks: dict[str, list] = {name: [] for name in _LIST_FIELDS}
    for lo in range(0, len(reqs), _BLOCK_ROWS):
        part = reqs[lo:lo + _BLOCK_ROWS]
        for name in _LIST_FIELDS:
            blocks[name].append(_parse_lists(list(map(attrgetter(name), part)), integers=name == "draft_tokens"))
            if blocks[name][-1] is None:
                return False
        if read is not None:
            read(part[-1])
    parsed = {name: _joined_blocks(b) if b else _parse_lists([], integers=name == "draft_tokens")
              for name, b in blocks.items()}
    start = 0
    for rec, k in zip(records, rows):
        rec.__dict__["_lists"] = (parsed, start, start + k)
        start += k
    return True


_BLOCK_ROWS = 8192
"""Requests whose lists are parsed at a time: the parse's copies of the text (about six) stay a few MB
however large the body (a 51,200-row body's ``confidence`` text alone is 2.1 MB)."""


def _joined_blocks(blocks: list[tuple]) -> tuple[np.ndarray, pa.Array, Optional[np.ndarray]]:
    """:func:`_parse_lists` of consecutive blocks of lists as one."""
    if len(blocks) == 1:
        return blocks[0]
    ends = np.cumsum([int(o[-1]) for o, _, _ in blocks])
    offsets = np.concatenate([np.zeros(1, np.int32)] + [o[1:] + np.int32(base) for (o, _, _), base
                                                         in zip(blocks, np.concatenate([[0], ends[:-1]]))])
    valid = (None if all(v is None for _, _, v in blocks) else
             np.concatenate([np.ones(len(o) - 1, bool) if v is None else v for o, _, v in blocks]))
    return offsets, pa.concat_arrays([a for _, a, _ in blocks]), valid


def _decode_reference(body: bytes) -> ServerInfoPayload:
    """Record by record: every record that breaks the contract becomes a dead letter."""
    try:
        info = _info_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PayloadError(f"not a /server_info body: {exc}") from exc

    def rank_of(i: int, payload: Any) -> RankPayload:
        good: list[SglangRecord] = []
        raws: list[bytes] = []
        dead: list[tuple[str, bytes]] = []
        for raw in payload.records:
            try:
                good.append(_record_decoder.decode(raw))
                raws.append(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                dead.append((f"dp_rank {i}: record does not match DecodeStepRecord: {exc}", bytes(raw)))
        return RankPayload(i, payload.mode, payload.gamma, good, dead, tuple(payload.components), raws)

    return _payload(info, rank_of)  # never None: this rank_of always gives a rank


def server_args(body: bytes) -> dict[str, Any]:
    """The body's top-level server arguments, without the bulky record payloads.

    The records are skipped as raw JSON (validated, never built as Python
    values): this runs on bodies of tens of MB.

    >>> server_args(b'{"tp_size": 2, "internal_states": [{"dspark_info_record": {"records": [1]}, "x": 1}]}')
    {'tp_size': 2, 'internal_states': [{'x': 1}]}
    """
    try:
        fields = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError as exc:
        raise PayloadError("a /server_info body must be a JSON object") from exc
    except msgspec.DecodeError as exc:
        raise PayloadError(f"not JSON: {exc}") from exc
    return {k: _states_args(v) if k == "internal_states" else msgspec.json.decode(v) for k, v in fields.items()}


def _states_args(raw: msgspec.Raw) -> Any:
    try:
        states = msgspec.json.decode(raw, type=list[msgspec.Raw])
    except msgspec.ValidationError:
        return msgspec.json.decode(raw)
    return [_state_args(s) for s in states]


def _state_args(raw: msgspec.Raw) -> Any:
    try:
        state = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError:
        return msgspec.json.decode(raw)
    return {k: msgspec.json.decode(v) for k, v in state.items() if k != "dspark_info_record"}


def records_to_tables(records: list[SglangRecord], *, dp_rank: int, segment: int) -> tuple[pa.Table, pa.Table]:
    """``steps`` and ``step_reqs`` Arrow tables for one rank's records."""
    if records and all(isinstance(r, _FastRecord) for r in records):
        return _steps_table(records, dp_rank, segment), _fast_reqs_table(records, dp_rank, segment)
    return _steps_table(records, dp_rank, segment), _reqs_table(records, dp_rank, segment)


_STEP_FIELDS = tuple(n for n in SglangRecord.__struct_fields__ if n not in ("forward_ct", "reqs"))
_REQ_SCALARS = tuple(n for n in _Req.__struct_fields__ if n not in _LIST_FIELDS)  # with the emulator's truth


def _fast_reqs_table(records: list[_FastRecord], dp_rank: int, segment: int) -> pa.Table:
    """``step_reqs`` from records of the fast path: scalars by attribute, lists from the parsed columns."""
    target = schema.schema_for("step_reqs")
    reqs = [q for r in records if r.reqs for q in r.reqs]
    n = len(reqs)
    per_step = np.fromiter((len(r.reqs) if r.reqs else 0 for r in records), np.int64, len(records))
    cols: dict[str, Any] = {
        "dp_rank": pa.array(np.full(n, dp_rank, dtype=np.int64)).cast(pa.int16()),
        "forward_ct": pa.array(np.repeat(np.fromiter((r.forward_ct for r in records), np.int64, len(records)),
                                         per_step)),
        "segment": pa.array(np.full(n, segment, dtype=np.int64)).cast(pa.int32()),
        "batch_index": pa.array(_positions_in_step(per_step)),
    }
    for name in _REQ_SCALARS:
        cols[name] = pa.array(list(map(attrgetter(name), reqs)), type=target.field(name).type)
    for name in _LIST_FIELDS:
        cols[name] = _list_column([r.__dict__["_lists"] for r in records], name, target.field(name).type)
    return pa.Table.from_pydict({f.name: cols[f.name] for f in target}, schema=target)


def _positions_in_step(per_step: np.ndarray) -> np.ndarray:
    """Each row's position in its record's ``reqs`` (rows of ``per_step[i]`` requests per record, in order)."""
    starts = np.cumsum(per_step) - per_step
    return (np.arange(int(per_step.sum()), dtype=np.int64) - np.repeat(starts, per_step)).astype(np.int32)


def _list_column(slices: list[tuple], name: str, type_: pa.DataType) -> pa.Array:
    """The records' rows of one parsed list column (records may be any subset of the rank's, in order)."""
    parts = []
    for parsed, lo, hi in slices:
        if hi > lo:
            offsets, values, valid = parsed[name]
            parts.append((offsets, values, valid, lo, hi))
    if not parts:
        return pa.array([], type_)
    if len(parts) > 1 and all(p[0] is parts[0][0] for p in parts) and \
            all(a[4] == b[3] for a, b in zip(parts, parts[1:])):
        offsets, values, valid, lo, hi = parts[0][0], parts[0][1], parts[0][2], parts[0][3], parts[-1][4]
        parts = [(offsets, values, valid, lo, hi)]  # contiguous rows of one rank: one slice
    offs, vals, masks, base = [np.zeros(1, dtype=np.int32)], [], [], 0
    for offsets, values, valid, lo, hi in parts:
        o = offsets[lo:hi + 1]
        vals.append(values.slice(int(o[0]), int(o[-1] - o[0])))
        offs.append((o[1:] - o[0] + base).astype(np.int32))
        base += int(o[-1] - o[0])
        masks.append(np.ones(hi - lo, dtype=bool) if valid is None else valid[lo:hi])
    values = pa.concat_arrays(vals) if len(vals) > 1 else vals[0]
    mask = np.concatenate(masks)
    out = pa.ListArray.from_arrays(pa.array(np.concatenate(offs)), values,
                                   mask=None if mask.all() else pa.array(~mask))
    return out.cast(type_)


def _steps_table(records: list, dp_rank: int, segment: int) -> pa.Table:
    n = len(records)
    steps = {
        "dp_rank": [dp_rank] * n,
        "forward_ct": [r.forward_ct for r in records],
        "segment": [segment] * n,
    }
    for name in _STEP_FIELDS:
        steps[name] = list(map(attrgetter(name), records))
    return pa.Table.from_pydict(steps, schema=schema.schema_for("steps"))


def _reqs_table(records: list[SglangRecord], dp_rank: int, segment: int) -> pa.Table:
    """``step_reqs`` of the reference path, row by row."""
    cols: dict[str, list] = {name: [] for name in schema.STEP_REQS.names}
    for r in records:
        if not r.reqs:
            continue
        reqs = r.reqs
        k = len(reqs)
        cols["dp_rank"].extend([dp_rank] * k)
        cols["forward_ct"].extend([r.forward_ct] * k)
        cols["segment"].extend([segment] * k)
        cols["batch_index"].extend(range(k))
        for q in reqs:
            for name in _REQ_SCALARS + _LIST_FIELDS:
                cols[name].append(getattr(q, name))
    return pa.Table.from_pydict(cols, schema=schema.schema_for("step_reqs"))


_CONVERSION_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError, UnicodeError)


def records_to_tables_safe(records: list[SglangRecord], raws: Optional[list[bytes]] = None, *, dp_rank: int,
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
    good: list[SglangRecord] = []
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
