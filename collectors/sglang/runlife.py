"""A run's life across collector processes: refuse or resume an existing run, mark a crash.

Why: ``collect --run-id R`` on a run that already had data used to start over
on top of it — every record the server still held was stored a second time
(364 steps, 5,760 request-steps, 156 requests duplicated in one trial),
``started_at`` was overwritten and the earlier crash erased by ``completed``.
Now an existing run is refused unless ``--resume`` is given, and a resumed run

* keeps its ``started_at`` and says in its labels how often and when it was
  resumed and how each earlier attempt ended (``crashed`` when its collector
  died without closing it: ``ended_at`` null);
* rebuilds the cursor from what the store holds: the high-water mark of each
  DP rank in the newest segment, so no record is stored twice;
* knows the rids it already stored (with their request-steps), so the driver
  never sends one again and the end-of-run accounting counts them.

An unclosed run found on start is closed first as ``crashed`` with the time of
its last committed file, so it never looks unfinished forever.
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pyarrow.compute as pc

from dspark_obs import schema
from dspark_obs.store import part_file_time

__all__ = ["RunExists", "ResumePoint", "existing_run", "check_new_run", "resume_point", "mark_crashed",
           "remove_stale_tmp", "last_commit"]


class RunExists(RuntimeError):
    """``collect --run-id R`` on a run that has data, without ``--resume``."""


@dataclass
class ResumePoint:
    """Where a resumed run goes on from (see the module docstring)."""

    segment: int = 0
    high_water: dict[int, int] = field(default_factory=dict)  # dp_rank -> last stored forward_ct (steps)
    reqs_high_water: dict[int, int] = field(default_factory=dict)  # dp_rank -> the same in step_reqs
    verify_ct: dict[str, int] = field(default_factory=dict)  # rid -> spec_verify_ct of stored requests
    startup_time: Optional[float] = None
    rids: set[str] = field(default_factory=set)  # requests already stored
    request_steps: Counter = field(default_factory=Counter)  # rid -> stored request-steps
    labels: dict[str, str] = field(default_factory=dict)


def existing_run(store, run_id: str) -> Optional[dict[str, Any]]:
    """The run's ``runs`` row, or None when the run has no row and no data in the main tables."""
    rows = store.read("runs", run_id).to_pylist()
    if rows:
        return rows[-1]
    for table in ("steps", "step_reqs", "requests", "gaps"):
        if store.read(table, run_id).num_rows:
            return {"run_id": run_id}
    return None


def last_commit(store, run_id: str) -> Optional[_dt.datetime]:
    """Time of the run's newest part file in any table (from the file names)."""

    newest = None
    for table in schema.TABLES:
        try:
            files = store.part_files(table, run_id)
        except (OSError, ValueError):
            continue
        for f in files:
            t = part_file_time(str(f).rsplit("/", 1)[-1])
            if t is not None and (newest is None or t > newest):
                newest = t
    return newest


def mark_crashed(store, run_id: str, row: dict[str, Any]) -> Optional[str]:
    """Close an unclosed run as crashed at its last committed time; the end_reason written, or None."""
    if row.get("ended_at") is not None or "started_at" not in row:
        return None
    last = last_commit(store, run_id) or row["started_at"]
    reason = f"crashed: the collector ended without closing the run; last file committed {last.isoformat()}"
    store.upsert_run(run_id, ended_at=last, end_reason=reason)
    return reason


def check_new_run(store, run_id: str, *, resume: bool) -> Optional[dict[str, Any]]:
    """Refuse an existing run unless ``resume``; with it, close a crashed attempt and return the row."""
    row = existing_run(store, run_id)
    if row is None:
        return None
    if not resume:
        state = ("unclosed (its collector may have crashed)" if row.get("ended_at") is None and "started_at" in row
                 else f"ended: {row.get('end_reason') or 'unknown'}")
        raise RunExists(f"run {run_id!r} already exists in the store ({state}); collecting into it again would "
                        f"store what it holds twice. Pass --resume to continue it (no record stored twice, the "
                        f"earlier ending kept in its labels), or choose a new --run-id")
    reason = mark_crashed(store, run_id, row)
    if reason is not None:
        row = {**row, "end_reason": reason}
    return row


def resume_point(store, run_id: str, row: dict[str, Any]) -> ResumePoint:
    """The cursor, rids and labels a resumed run goes on from."""
    point = ResumePoint(startup_time=row.get("startup_time"))
    steps = store.read("steps", run_id).select(["dp_rank", "forward_ct", "segment"])
    reqs = store.read("step_reqs", run_id).select(["dp_rank", "forward_ct", "segment", "rid"])
    if steps.num_rows:
        point.segment = int(pc.max(steps.column("segment")).as_py())
    # a kill can fall between the steps and the step_reqs file of one flush: keep a mark per table
    for table, marks in ((steps, point.high_water), (reqs, point.reqs_high_water)):
        last = table.filter(pc.equal(table.column("segment"), point.segment))
        for rank, fct in zip(last.column("dp_rank").to_pylist(), last.column("forward_ct").to_pylist()):
            marks[rank] = max(marks.get(rank, 0), fct)
    point.request_steps.update(r for r in reqs.column("rid").to_pylist() if r is not None)
    stored = store.read("requests", run_id).select(["rid", "spec_verify_ct"]).to_pylist()
    point.rids = {r["rid"] for r in stored if r["rid"] is not None}
    point.verify_ct = {r["rid"]: r["spec_verify_ct"] for r in stored
                       if r["rid"] is not None and r["spec_verify_ct"] is not None}
    labels = dict(row.get("labels") or [])
    n = sum(1 for k in labels if k.startswith("resume_")) // 2 + 1
    labels[f"resume_{n}_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat()
    labels[f"resume_{n}_previous_end"] = str(row.get("end_reason") or "unknown")[:500]
    point.labels = labels
    return point


def remove_stale_tmp(store, run_id: str) -> int:
    """Delete the hidden ``.part-*.tmp`` files a killed collector left in this run's partitions.

    Safe only because the run is being resumed: no other collector writes it
    (an existing run is refused without ``--resume``).  Readers ignore these
    files anyway; this keeps the store tidy.  Local stores only (an object
    store never shows a partial object).
    """
    if not getattr(store, "local", False):
        return 0
    removed = 0
    for tmp in Path(store.root).glob(f"*/run_id={run_id}/.part-*.tmp"):
        try:
            tmp.unlink()
            removed += 1
        except OSError:
            pass
    return removed
