"""Quarantine of unreadable part files: one bad file must not break every command on the store.

A part file only appears under its final name after it was written and
fsynced, so the store's own writers never leave a truncated one; a file can
still be damaged afterwards (a copy cut short, a disk fault, a hand edit).
Before this module, one such file failed every query on its table — even
``select count(*) from runs`` — and ``estimate``/``calibrate`` ended in a
traceback.  Now every reader sweeps first: a ``part-*.parquet`` whose footer
does not parse is **moved aside** to ``<root>/_quarantine/<table>/run_id=<id>/``
with a ``<name>.reason.json`` beside it (what failed, when, the size), and the
rest of the store reads as before.  Nothing is deleted: put a repaired file
back under its table to restore it.

The sweep costs one ``stat`` per part file; a footer is read once per
(path, size, mtime) per process.  Quarantined files are listed by
:func:`listing`, which the SQL views expose as ``quarantined_files`` and
``dspark-obs doctor`` prints.
"""

from __future__ import annotations

import datetime as _dt
import glob
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["QUARANTINE_DIR", "sweep", "listing", "LISTING_SCHEMA"]

QUARANTINE_DIR = "_quarantine"
"""Directory under the data root that holds moved-aside files (readers skip ``_`` names)."""

LISTING_SCHEMA = pa.schema([
    ("table_name", pa.string()),
    ("run_id", pa.string()),
    ("file_name", pa.string()),
    ("size_bytes", pa.int64()),
    ("error", pa.string()),
    ("quarantined_at", pa.timestamp("us", tz="UTC")),
    ("path", pa.string()),
])

_CHECKED: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) whose footer parsed


def _footer_error(path: str) -> str | None:
    """None when the Parquet footer parses, else the reader's error."""
    try:
        pq.read_metadata(path)
    except (pa.ArrowInvalid, pa.ArrowException, OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def sweep(root: str | Path) -> list[dict]:
    """Move every unreadable part file of a local store aside; the rows of what was moved now.

    Safe while collectors write: they only ever rename complete files into
    place, and a file is moved only when its footer fails to parse.
    """
    root = Path(root)
    moved = []
    pattern = os.path.join(glob.escape(str(root)), "*", "run_id=*", "part-*.parquet")
    for name in glob.glob(pattern):
        try:
            st = os.stat(name)
        except FileNotFoundError:  # replaced by an upsert meanwhile
            continue
        if _CHECKED.get(name) == (st.st_size, st.st_mtime_ns):
            continue
        error = _footer_error(name)
        if error is None:
            _CHECKED[name] = (st.st_size, st.st_mtime_ns)
            continue
        if not os.path.exists(name):
            continue
        moved.append(_move(root, Path(name), error, st.st_size))
    return moved


def _move(root: Path, path: Path, error: str, size: int) -> dict:
    table, partition = path.parent.parent.name, path.parent.name
    target_dir = root / QUARANTINE_DIR / table / partition
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / path.name
    now = _dt.datetime.now(_dt.timezone.utc)
    reason = {"table": table, "run_id": partition.removeprefix("run_id="), "file": path.name,
              "size_bytes": size, "error": error, "quarantined_at": now.isoformat(),
              "restore": f"repair the file and move it back to {path}"}
    (target_dir / f"{path.name}.reason.json").write_text(json.dumps(reason, indent=1))
    try:
        os.replace(path, target)
    except FileNotFoundError:
        pass
    return _row(reason, target)


def _row(reason: dict, target: Path) -> dict:
    at = reason.get("quarantined_at")
    return {"table_name": reason.get("table"), "run_id": reason.get("run_id"), "file_name": reason.get("file"),
            "size_bytes": reason.get("size_bytes"), "error": reason.get("error"),
            "quarantined_at": _dt.datetime.fromisoformat(at) if at else None, "path": str(target)}


def listing(root: str | Path) -> pa.Table:
    """Every quarantined file under ``root`` (an empty table when none), newest last."""
    rows = []
    base = Path(root) / QUARANTINE_DIR
    for note in sorted(base.glob("*/run_id=*/*.reason.json")):
        try:
            reason = json.loads(note.read_text())
        except (OSError, ValueError):
            reason = {"table": note.parent.parent.name, "run_id": note.parent.name.removeprefix("run_id="),
                      "file": note.name.removesuffix(".reason.json"), "error": "reason file unreadable"}
        rows.append(_row(reason, note.with_name(note.name.removesuffix(".reason.json"))))
    rows.sort(key=lambda r: (r["quarantined_at"] is None, r["quarantined_at"] or 0, r["path"]))
    return pa.Table.from_pylist(rows, schema=LISTING_SCHEMA)
