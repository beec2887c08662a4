"""Saved ``/server_info`` bodies -> ``steps``, ``step_reqs``, ``gaps`` (``--server-info FILE``).

The file holds successive bodies as ``curl -s URL/server_info >> file`` saves
them: one per line, or run together.  Each body goes as bytes, once, to the
one decoder (no Python-object parse first), one body in memory at a time.  They go through the same decoder and
high-water cursor as live polling, so overlapping bodies are read once, and
deque wraps, clears and restarts between two saved bodies become ``gaps``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pyarrow as pa

from collectors.importers import ImportResult, TableSink, iter_documents, now
from collectors.sglang.cursor import ForwardCursor
from collectors.sglang.decode import PayloadError, decode_server_info, records_to_tables_safe, server_args
from dspark_obs import schema
from dspark_obs.allocation import give_back_freed_heap


def import_server_info(store, run_id: str, path: str | Path) -> ImportResult:
    result = ImportResult("server-info")
    sink = TableSink(store, run_id, result)
    cursor = ForwardCursor()
    source = f"server-info:{Path(path).name}"
    for doc in iter_documents(path, decode=decode_server_info, releasing=True):  # one parse per body, where it is one line
        _import_body(doc, sink, cursor, f"{source}:{doc.line}")
        del doc  # free this body and its records before the next one is read and decoded
        give_back_freed_heap()
    sink.close()
    return result


def _import_body(doc, sink: TableSink, cursor: ForwardCursor, source: str) -> None:
    """One body's new records into ``steps`` and ``step_reqs``, its losses into ``gaps``, its bad parts into
    dead letters; the body's objects are freed when this returns."""
    result, body = sink.result, doc.data
    args = _first_args(doc, result)
    try:
        if doc.error is not None:
            raise PayloadError(doc.error)
        info = doc.decoded if doc.decoded is not None else decode_server_info(body, release=doc.release)
    except (PayloadError, TypeError, ValueError, OverflowError) as exc:
        sink.dead(source, str(exc), doc.text or bytes(body[:65536]).decode("utf-8", "replace"))
        return
    if "args" not in result.meta:
        first = next((r for r in info.ranks if r.gamma or r.mode), None)
        args = server_args(body) if args is None else args   # a body only the decoder reads: as before
        result.meta.update(args=json.dumps(args, default=str)[:1_000_000], dp_size=len(info.ranks),
                           mode=first.mode if first else None, gamma=first.gamma if first else None,
                           version=info.version if isinstance(info.version, str) else None,
                           startup_time=info.startup_time)
    delta = cursor.advance(info)
    for rank in info.ranks:
        for reason, raw in rank.dead:
            sink.dead(source, reason, raw.decode("utf-8", "replace"))
    if delta.gaps:
        result.gaps += len(delta.gaps)
        sink.add_table("gaps", pa.Table.from_pylist([{
            "dp_rank": g.dp_rank, "first_missing_forward_ct": g.first_missing_forward_ct,
            "last_missing_forward_ct": g.last_missing_forward_ct, "reason": g.reason, "segment": g.segment,
            "detected_at": now()} for g in delta.gaps], schema=schema.schema_for("gaps")))
    ranks = {r.dp_rank: r for r in info.ranks}
    for dp_rank, records in delta.new.items():
        rank = ranks[dp_rank]
        offset = len(rank.records) - len(records)
        steps, reqs, dead = records_to_tables_safe(records, rank.raws[offset:], dp_rank=dp_rank,
                                                   segment=cursor.segment)
        for reason, raw in dead:
            sink.dead(source, reason, raw.decode("utf-8", "replace"))
        sink.add_table("steps", steps)
        sink.add_table("step_reqs", reqs)
        result.add_rids(reqs.column("rid"))


def _first_args(doc, result) -> Optional[dict]:
    """The first body's server arguments, read before the body is decoded (the scan faults in the pages the
    decode reads next and gives back as it goes; read after it, they came back in: the first 18 MB body's
    pages resident twice over, the command's peak), or after the reader decoded it (its pages are given back
    again).  None once they are known, and for a body they cannot be read from (the decode says why)."""
    if "args" in result.meta or doc.error is not None:
        return None
    try:
        args = server_args(doc.data)
    except PayloadError:
        return None
    if doc.decoded is not None and doc.release is not None:
        doc.release(len(doc.data))
    return args
