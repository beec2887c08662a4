"""What a report reads: the runs of its window and of its baseline, checked to be readable.

* :func:`select_runs` picks the runs to report on (``--run`` or those started
  within ``--since`` of ``now``) and the baseline (``--baseline`` runs, or those
  started within ``--baseline-since`` before the window); cap-accept companions
  go with their compact run, never on their own.
* :func:`check_readable` opens the footer of every part file of those runs, so
  a truncated or foreign file is named instead of failing deep in a query.
* :func:`ensure_stages` runs the estimator stages a run lacks (estimate,
  calibrate with every label kind available, costmodel), so a store that was
  only collected can be reported on.

Every unusable input raises :class:`InputError` (exit code 2) with the fix.
"""

from __future__ import annotations

import datetime as _dt
import glob
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq

from dspark_obs import pipeline, quarantine
from dspark_obs import sql as sqlmod
from dspark_obs.store import PART_GLOB, Store

__all__ = ["InputError", "RunInfo", "Selection", "parse_duration", "connect", "read_runs", "select_runs",
           "check_readable", "ensure_stages"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class InputError(Exception):
    """The input cannot be reported on (no data in the window, unreadable store, ...); exit code 2."""


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    mode: str | None
    gamma: int | None
    source: str | None
    started_at: _dt.datetime | None
    ended_at: _dt.datetime | None
    companion_of: str | None
    steps: int
    request_steps: int
    requests: int
    server_info: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "mode": self.mode, "gamma": self.gamma, "source": self.source,
                "started_at": _iso(self.started_at), "ended_at": _iso(self.ended_at),
                "steps": self.steps, "request_steps": self.request_steps, "requests": self.requests}


def _iso(t: _dt.datetime | None) -> str | None:
    return None if t is None else t.astimezone(_dt.timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class Selection:
    runs: list[RunInfo]
    baseline: list[RunInfo]
    companions: dict[str, str]  # run -> its cap-accept companion
    window: dict[str, Any]
    baseline_window: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)


def parse_duration(text: str) -> _dt.timedelta:
    """``'24h'`` -> 24 hours; units s, m, h, d, w.

    >>> parse_duration("7d")
    datetime.timedelta(days=7)
    """
    m = _DURATION.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"duration {text!r} is not a positive number with a unit s, m, h, d or w (e.g. 24h, 7d)")
    return _dt.timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})


def _scan_part_files(root: Path, tables: list[str] | None = None, runs: list[str] | None = None) -> None:
    """Open the footer of part files (of ``tables`` x ``runs``; None = all); InputError on the first bad one."""
    patterns = []
    for table in (["*"] if tables is None else tables):
        for run in (["*"] if runs is None else runs):
            patterns.append(os.path.join(glob.escape(str(root)), table, f"run_id={run}", PART_GLOB))
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                pq.ParquetFile(path).metadata  # noqa: B018 - reading the footer is the check
            except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
                raise InputError(f"unreadable part file {path}: {str(exc).rstrip('.')}; rename it so that it no "
                                 "longer matches part-*.parquet (readers skip other names) or re-collect the run"
                                 ) from None


def connect(root: Path):
    """A DuckDB connection over the store (:func:`dspark_obs.sql.connect`); InputError naming a bad file.

    Creating the views reads the footer of every part file, so a truncated file
    fails here; the store is then scanned file by file to name it.
    """
    try:
        con = sqlmod.connect(root)
    except duckdb.Error as exc:
        _scan_part_files(root)
        raise InputError(f"cannot read the store at {root}: {str(exc).splitlines()[0]}") from None
    # readers move an unreadable file aside (dspark_obs.quarantine) and go on; a report gates on the
    # data, so a store that lost a file is an input error naming it, not a quiet pass without it
    moved = quarantine.listing(root).to_pylist()
    if moved:
        m = moved[0]
        original = Path(root) / m["table_name"] / f"run_id={m['run_id']}" / m["file_name"]
        raise InputError(f"unreadable part file {original}: {m['error']}; it was moved to {m['path']} "
                         f"({len(moved)} quarantined in all, see `dspark-obs doctor --data {root}`); restore a "
                         "repaired copy, or delete it from _quarantine to accept the loss, or re-collect the run")
    return con


def read_runs(con, root: Path) -> list[RunInfo]:
    """Every run of the store (query ``report_runs``); InputError when the store cannot be read."""
    _scan_part_files(root, tables=["runs"])
    try:
        rows = sqlmod.query(con, "report_runs", timeout_s=120).to_pylist()
    except duckdb.Error as exc:
        _scan_part_files(root)  # name the bad file if there is one
        raise InputError(f"cannot read the store at {root}: {str(exc).splitlines()[0]}") from None
    out = []
    for r in rows:
        try:
            info = json.loads(r["server_info"]) if r["server_info"] else {}
        except ValueError:
            info = {}
        out.append(RunInfo(r["run_id"], r["mode"], r["gamma"], r["source"], r["started_at"], r["ended_at"],
                           r["companion_of"], int(r["steps"]), int(r["request_steps"]), int(r["requests"]),
                           info if isinstance(info, dict) else {}))
    return out


def _named_runs(flag: str, names: list[str], all_runs: list[RunInfo]) -> list[RunInfo]:
    """The runs ``flag`` names, each once in the order given; InputError naming any the store lacks."""
    by_id = {r.run_id: r for r in all_runs}
    missing = [r for r in names if r not in by_id]
    if missing:
        raise InputError(f"{flag} {', '.join(missing)}: no such run in the store; runs: {_listing(all_runs)}")
    return [by_id[r] for r in dict.fromkeys(names)]


def select_runs(all_runs: list[RunInfo], *, runs: list[str] | None = None, since: str | None = None,
                baseline: list[str] | None = None, baseline_since: str | None = None,
                now: _dt.datetime) -> Selection:
    """The runs to report on and the baseline (see the module docstring); InputError when there are none."""
    by_id = {r.run_id: r for r in all_runs}
    if not all_runs:
        raise InputError("the store holds no runs: collect one first (dspark-obs collect or dspark-obs demo)")
    companions = {r.companion_of: r.run_id for r in sorted(all_runs, key=lambda r: _key(r.started_at))
                  if r.companion_of}
    notes: list[str] = []
    if runs:
        current = _named_runs("--run", runs, all_runs)
        window = {"kind": "runs", "since": None, "start": _iso(_min_start(current)), "end": _iso(now)}
    else:
        span = parse_duration(since or "24h")
        start = now - span
        current = [r for r in all_runs if r.started_at is not None and start <= r.started_at <= now
                   and not r.companion_of]
        window = {"kind": "since", "since": since or "24h", "start": _iso(start), "end": _iso(now)}
        if not current:
            newest = max((r for r in all_runs if r.started_at is not None and not r.companion_of),
                         key=lambda r: r.started_at, default=None)
            hint = (f"; the newest run is {newest.run_id}, started {_iso(newest.started_at)}" if newest
                    else "")
            raise InputError(f"no runs started in the last {since or '24h'} (since {_iso(start)}){hint}; "
                             "widen --since or name one with --run")
    empty = [r.run_id for r in current if r.request_steps == 0]
    current = [r for r in current if r.request_steps > 0]
    if empty:
        notes.append(f"no request-steps, left out: {', '.join(empty)}")
    if not current:
        raise InputError(f"no data in the window: run(s) {', '.join(empty)} recorded no request-steps "
                         "(collect with SGLANG_DSPARK_DEBUG_DUMP including reqs)")
    chosen = {r.run_id for r in current}
    base, base_window = [], None
    if baseline:
        base = _named_runs("--baseline", baseline, all_runs)
        base_window = {"kind": "runs", "since": None, "start": None, "end": None}
    elif baseline_since:
        end = _min_start(current) or now
        start = end - parse_duration(baseline_since)
        base = [r for r in all_runs if r.started_at is not None and start <= r.started_at < end
                and not r.companion_of and r.run_id not in chosen and r.request_steps > 0]
        base_window = {"kind": "since", "since": baseline_since, "start": _iso(start), "end": _iso(end)}
        if not base:
            notes.append(f"no baseline runs started in the {baseline_since} before {_iso(end)}: drift not tested")
    overlap = [b.run_id for b in base if b.run_id in chosen]
    if overlap:
        raise InputError(f"--baseline {', '.join(overlap)} is also reported on; a run cannot be its own baseline")
    return Selection(current, base, {r: c for r, c in companions.items() if r in by_id}, window, base_window, notes)


def _key(t: _dt.datetime | None) -> _dt.datetime:
    return t or _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)


def _min_start(runs: list[RunInfo]) -> _dt.datetime | None:
    starts = [r.started_at for r in runs if r.started_at is not None]
    return min(starts) if starts else None


def _listing(runs: list[RunInfo], limit: int = 8) -> str:
    names = [r.run_id for r in runs if not r.companion_of][-limit:]
    return ", ".join(names) or "none"


def check_readable(root: Path, runs: list[str]) -> None:
    """Open the footer of every part file of ``runs`` in every table; InputError naming a bad file."""
    _scan_part_files(root, runs=runs)


def ensure_stages(store: Store, run: RunInfo, *, companion: str | None, n_bootstrap: int, seed: int,
                  force: bool = False, engine=None) -> list[str]:
    """Run the estimator stages ``run`` lacks (all of them with ``force``); notes of what ran or failed.

    The pipeline's estimate, calibrate and costmodel stages (:mod:`dspark_obs.pipeline`). Stage errors
    (e.g. too few steps for a cost-model fit) become notes: the report shows that section as unavailable
    instead of failing.  ``engine`` (a RayEngine) runs the ceiling and calibration stages on Ray.
    """
    plan = pipeline.Plan(run.run_id, companion=companion, mode=run.mode, stages=("estimate", "calibrate", "costmodel"),
                         n_bootstrap=n_bootstrap, seed=seed, only_missing=not force, tolerate_errors=True,
                         engine=engine)
    return pipeline.run_plan(store, plan)
