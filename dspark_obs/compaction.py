"""Compaction: a run's part files rewritten as few files of disjoint rid ranges.

A collector commits one file per table every few seconds (:mod:`collectors.sglang.writer`), and
every file holds the requests in flight then, so every file spans most of the run's rids (SGLang's
rids are random hex).  The estimators read a run in chunks of rids, and DuckDB opens every file that
a chunk's rid range touches: about 1.5-2 ms of CPU per file per query, whatever the file holds (a
3M-row run in 147 files: ``estimate --jobs 1`` 16.7 CPU s, 12.9 once compacted; ``bench/compact.py``).
Both grow with the run, so a day of collection (some 17k files per table) would cost its chunks more
than its rows.
:func:`compact_run` rewrites a run's request tables once, as files of about :data:`FILE_ROWS` rows
whose rid ranges do not overlap, so each chunk reads the one or two files of its rids.

Nothing is lost on a crash.  The new files are staged and fsynced first (invisible to readers), then
a journal naming the files they replace is written, then the staged files move in and the replaced
ones go.  A compaction that died before its journal leaves only a staged batch, which the next one
discards; one that died after it is finished by the next one (:func:`finish_interrupted`).  While
the files move, a reader may see a request's rows twice for a moment: compact when no estimator
reads the run.  A collector may keep writing: only the files listed at the start are replaced.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dspark_obs import sql
from dspark_obs.run_files import FileRids, rid_stats
from dspark_obs.schema import conform, schema_for
from dspark_obs.store import Store, validate_run_id

__all__ = ["TABLES", "FILE_ROWS", "Compaction", "rid_ranges", "needs_compaction", "ranges_overlap", "compact_run",
           "finish_interrupted", "fragmented_tables", "fragmented_text", "interrupted_tables"]

TABLES = ("step_reqs", "tokens", "requests")
"""The request tables a run's chunks read by rid (results are written per chunk, already in rid ranges)."""

FILE_ROWS = 32 * 65_536
"""Rows per compacted file: 32 row groups, so a chunk's rid range reads a few row groups of one or two files,
and one file's rows (a ``tokens`` file: about 180 MB in Arrow) are what the rewrite holds at a time."""

_JOURNAL_PREFIX = "_compaction-"
_ORDER = "__rid_order"   # a spilled row's rid, as its place among the run's sorted rids
_BATCH_PREFIX = "compact-"


@dataclass(frozen=True)
class Compaction:
    """What :func:`compact_run` did to one table of a run."""

    table: str
    files_before: int
    files_after: int
    rows: int
    bytes_before: int
    bytes_after: int


def rid_ranges(counts: np.ndarray, *, file_rows: int = FILE_ROWS) -> list[tuple[int, int]]:
    """Consecutive groups ``[start, stop)`` of the sorted rids whose ``counts`` (rows per rid) add up to
    about ``file_rows`` each; a rid is never split, so one larger than ``file_rows`` is a group of its own.

    >>> rid_ranges(np.array([3, 2, 4, 1]), file_rows=5)
    [(0, 2), (2, 4)]
    """
    counts = np.asarray(counts, dtype=np.int64)
    ranges, start, size = [], 0, 0
    for i, n in enumerate(counts.tolist()):
        if size and size + n > file_rows:
            ranges.append((start, i))
            start, size = i, 0
        size += n
    if start < len(counts):
        ranges.append((start, len(counts)))
    return ranges


def needs_compaction(files: list[FileRids], *, planned: int) -> bool:
    """Whether these files should be rewritten as ``planned`` files: when there are more of them than that,
    or when their rid ranges overlap (:func:`ranges_overlap`)."""
    return len(files) > planned or ranges_overlap(files)


def ranges_overlap(files: list[FileRids]) -> bool:
    """Whether some of these files' rid ranges overlap (a chunk would open several of them): a file without
    statistics may hold any rid, and rows without a rid sort last, so two files holding them overlap too."""
    if any(f.lo == "" and f.hi is None for f in files) or sum(f.nulls for f in files) > 1:
        return True
    bounds = sorted((f.lo, f.hi) for f in files if f.lo is not None)
    return any(nxt[0] <= cur[1] for cur, nxt in zip(bounds, bounds[1:]))


def _journal(partition: Path, batch: str) -> Path:
    return partition / f"{_JOURNAL_PREFIX}{batch}.json"


def _write_journal(partition: Path, batch: str, replaced: list[str]) -> Path:
    path = _journal(partition, batch)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps({"batch": batch, "replaces": [Path(p).name for p in replaced]}))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(partition, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def _partition(store: Store, table: str, run_id: str) -> Path:
    """The folder of a run's part files of ``table`` (a local store's)."""
    return Path(store.root) / table / f"run_id={validate_run_id(run_id)}"


def _finish(store: Store, table: str, run_id: str, journal: Path) -> None:
    """Complete a journalled replacement: the staged files in (the rest of them), the replaced files out."""
    entry = json.loads(journal.read_text())
    store.commit_staged(table, run_id, entry["batch"])
    for name in entry["replaces"]:
        (journal.parent / name).unlink(missing_ok=True)
    journal.unlink()


def finish_interrupted(store: Store, table: str, run_id: str) -> int:
    """Finish the compactions of ``table`` that died after their journal, discard the ones that died before
    it (their staged files only); returns how many were finished."""
    partition = _partition(store, table, run_id)
    if not partition.is_dir():
        return 0
    journals = sorted(partition.glob(f"{_JOURNAL_PREFIX}*.json"))
    for journal in journals:
        _finish(store, table, run_id, journal)
    for staged in partition.glob(f"_staged-{_BATCH_PREFIX}*"):
        store.discard_staged(table, run_id, staged.name.removeprefix("_staged-"))
    return len(journals)


def fragmented_tables(store: Store, run_id: str, *, file_rows: int = FILE_ROWS) -> dict[str, tuple[int, int]]:
    """``{table: (files, files once compacted)}`` for each of :data:`TABLES` of ``run_id`` whose files'
    rid ranges overlap (read from their footers only): what makes every chunk open them all.  Files of
    disjoint ranges are left out however small, as a chunk opens only its own."""
    out = {}
    for table in TABLES:
        stats = [rid_stats(p, table) for p in store.part_files(table, run_id, fleet_layout=False)]
        if ranges_overlap(stats):
            out[table] = (len(stats), max(1, -(-sum(f.rows for f in stats) // file_rows)))
    return out


def fragmented_text(spread: dict[str, tuple[int, int]]) -> str:
    """:func:`fragmented_tables` in words, as ``doctor`` and ``estimate`` say it."""
    files = ", ".join(f"{t} {n} files ({k} once compacted)" for t, (n, k) in spread.items())
    return f"{files}, their rid ranges overlapping: each estimator chunk opens them all"


def interrupted_tables(store: Store, run_id: str) -> list[str]:
    """The tables of ``run_id`` where a compaction was interrupted (the next :func:`compact_run` finishes it)."""
    out = []
    for table in TABLES:
        partition = _partition(store, table, run_id)
        if any(partition.glob(f"{_JOURNAL_PREFIX}*.json")) or any(partition.glob(f"_staged-{_BATCH_PREFIX}*")):
            out.append(table)
    return out


_COUNTS_SQL = ("SELECT rid, count(*) AS n FROM read_parquet({files}, hive_partitioning = false) "
               "GROUP BY rid ORDER BY rid NULLS LAST")


def compact_run(store: Store, run_id: str, tables=TABLES, *, file_rows: int = FILE_ROWS,
                progress: Callable[[str, int, int], None] = lambda table, done, total: None) -> list[Compaction]:
    """Rewrite each of ``tables`` of ``run_id`` as files of disjoint rid ranges, about ``file_rows`` rows
    each, where its files are more than that or overlap (:func:`needs_compaction`); tables already so are
    left alone.  Rows keep their order within a request.  Local stores only.  ``progress(table, done,
    total)`` hears of each step: every file read, then every file written.
    """
    if not store.local:
        raise ValueError("compaction rewrites a local store; an object store's files are left as they are")
    if store.layout != "flat":
        raise ValueError("compaction works on the flat layout; a fleet store's files are committed per writer")
    validate_run_id(run_id)
    done = []
    for table in tables:
        finish_interrupted(store, table, run_id)
        files = store.part_files(table, run_id, fleet_layout=False)
        if not files:
            continue
        sizes = sum(os.path.getsize(p) for p in files)
        stats = [rid_stats(p, table) for p in files]
        rows = sum(f.rows for f in stats)
        if not needs_compaction(stats, planned=-(-rows // file_rows)):   # no plan gives fewer: skip the counts
            done.append(Compaction(table, len(files), len(files), rows, sizes, sizes))
            continue
        con = sql.open_database()
        try:
            listed = "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in files) + "]"
            counts = con.sql(_COUNTS_SQL.format(files=listed)).to_arrow_table()
        finally:
            con.close()
        ranges = rid_ranges(counts.column("n").to_numpy(), file_rows=file_rows)
        if not needs_compaction(stats, planned=len(ranges)):   # a plan keeps whole requests: more files
            done.append(Compaction(table, len(files), len(files), rows, sizes, sizes))
            continue
        batch = f"{_BATCH_PREFIX}{secrets.token_hex(4)}"
        try:
            written = _rewrite(store, table, run_id, batch, files, counts.column("rid").combine_chunks(), ranges,
                               lambda i, n: progress(table, i, n))
        except BaseException:
            store.discard_staged(table, run_id, batch)
            raise
        partition = Path(files[0]).parent
        _finish(store, table, run_id, _write_journal(partition, batch, files))
        after = [partition / Path(p).name for p in written]
        done.append(Compaction(table, len(files), len(after), rows, sizes, sum(os.path.getsize(p) for p in after)))
    return done


_READ_ROWS = 1 << 20
"""Rows of an input file split at a time (a 10M-row store's ``tokens`` files hold 4.4M rows each: read whole,
one took 380 MB and the compaction peaked at 1.7 GB)."""


def _split(data: pa.Table, at: np.ndarray, starts: np.ndarray):
    """``(range, rows)`` for each range of rids (``starts``: each range's first rid's place) that ``data``'s
    rows (``at``: each row's rid's place) fall in, the rows in their order."""
    part = np.searchsorted(starts, at, side="right") - 1
    order = None if bool((part[1:] >= part[:-1]).all()) else np.argsort(part, kind="stable")
    bounds = np.searchsorted(part if order is None else part[order], np.arange(len(starts) + 1))
    for r in np.flatnonzero(np.diff(bounds)):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        yield int(r), data.slice(lo, hi - lo) if order is None else data.take(order[lo:hi])


def _rewrite(store: Store, table: str, run_id: str, batch: str, files: list[str], rids: pa.Array,
             ranges: list[tuple[int, int]], progress: Callable[[int, int], None]) -> list[str]:
    """Stage ``files``' rows as one file per rid range, in two passes that each read a row once: every file
    split by range into spill files (Arrow IPC, beside the staged files), then every spill sorted and staged.
    Memory: :data:`_READ_ROWS` rows of an input file, then one output file."""
    target = schema_for(table)
    spilled = target.append(pa.field(_ORDER, pa.int64()))
    starts = np.array([lo for lo, _ in ranges], dtype=np.int64)
    spill_dir = Path(files[0]).parent / f"_staged-{batch}"
    spill_dir.mkdir(parents=True, exist_ok=True)
    spills = [spill_dir / f".spill-{i:05d}.arrow" for i in range(len(ranges))]
    writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    steps, step = len(files) + len(ranges), 0
    try:
        for path in files:
            for part in pq.ParquetFile(path).iter_batches(batch_size=_READ_ROWS):
                data = conform.columns_as(pa.Table.from_batches([part]), target)
                at = pc.index_in(data.column("rid"), value_set=rids, skip_nulls=False).to_numpy(zero_copy_only=False)
                for r, rows in _split(data.append_column(_ORDER, pa.array(at.astype(np.int64))), at, starts):
                    if r not in writers:
                        writers[r] = pa.ipc.new_stream(str(spills[r]), spilled)
                    writers[r].write_table(rows)
            step += 1
            progress(step, steps)
    finally:
        for w in writers.values():
            w.close()
    written = []
    for r, spill in enumerate(spills):
        if r in writers:
            with pa.memory_map(str(spill)) as source:
                data = pa.ipc.open_stream(source).read_all()
            at = data.column(_ORDER).to_numpy()
            if not bool((at[1:] >= at[:-1]).all()):   # a request's rows keep their order: a stable sort
                data = data.take(np.argsort(at, kind="stable"))
            written.append(store.stage(table, run_id, data.drop_columns([_ORDER]), batch))
            del data
            spill.unlink()
        step += 1
        progress(step, steps)
    return [p for p in written if p is not None]
