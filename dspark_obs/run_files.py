"""The part files a rid range of a run can hold: what a chunk query opens instead of a table's view.

To plan a query over a view, DuckDB opens every file the view's glob lists, whatever the filter keeps:
about 0.16 ms a file, and twice that with the views' ``union_by_name`` (which reads every file's schema
to unify them).  The estimators query each chunk of a run (about 150k request-steps), so this cost grows
with the run twice over: at 10M request-steps, a 1-rid query over the ``ceiling``'s 67 files took 22 ms of
CPU (1.3 ms over the one file holding the rid); at that rate a compacted day of a server (about 1,000
files a table, :mod:`dspark_obs.compaction`) would pay a third of a second on every chunk query.

:func:`source` names a table's files whose rid statistics (each file's footer, read once per process)
overlap the chunk's ranges, and reads only those, without ``union_by_name`` (which alone took 11 of
those 22 ms).  It falls back to the view where that could read differently: an object store, a file
whose columns are not the table's names and types (the view's union fills the columns it lacks), a file
that cannot be read, or no file at all in the ranges.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dspark_obs import schema
from dspark_obs.sql import root_of
from dspark_obs.store import Store

__all__ = ["FileRids", "rid_stats", "file_rids", "overlapping", "source"]


@dataclass(frozen=True)
class FileRids:
    """A part file's rid statistics: its smallest and largest rid, whether it holds rows without one,
    whether its columns are the table's, in names, order and types (so it reads the same without the
    view's union; the columns' docs may differ), and its rows."""

    path: str
    lo: str | None
    hi: str | None
    nulls: bool
    plain: bool
    rows: int = 0


@functools.lru_cache(maxsize=65_536)
def _footer(path: str, mtime_ns: int, size: int, table: str) -> FileRids:
    """One file's :class:`FileRids` (a part file's name names one content; mtime and size guard a reuse)."""
    pf = pq.ParquetFile(path)
    meta, names = pf.metadata, pf.schema_arrow.names
    target = schema.schema_for(table)
    plain = names == target.names and [f.type for f in pf.schema_arrow] == [f.type for f in target]
    if "rid" not in names:
        return FileRids(path, None, None, True, plain, meta.num_rows)
    col = names.index("rid")
    lo = hi = None
    nulls = False
    for g in range(meta.num_row_groups):
        rows = meta.row_group(g).num_rows
        stats = meta.row_group(g).column(col).statistics
        if rows and (stats is None or not stats.has_null_count or (stats.null_count < rows and not stats.has_min_max)):
            return FileRids(path, "", None, True, plain, meta.num_rows)   # no statistics: any rid, and nulls
        if not rows:
            continue
        nulls = nulls or stats.null_count > 0
        if stats.has_min_max:
            lo = stats.min if lo is None else min(lo, stats.min)
            hi = stats.max if hi is None else max(hi, stats.max)
    return FileRids(path, lo, hi, nulls, plain, meta.num_rows)


def rid_stats(path: str, table: str) -> FileRids:
    """The :class:`FileRids` of one part file of ``table`` (its footer read once per process)."""
    st = os.stat(path)
    return _footer(path, st.st_mtime_ns, st.st_size, table)


def file_rids(root: str | Path, table: str, run_id: str) -> list[FileRids]:
    """Every part file of ``table`` for ``run_id`` that the table's view reads, with its rid statistics (none
    when a file cannot be read: a chunk then reads through the view)."""
    out = []
    for path in Store(root).part_files(table, run_id):
        try:
            out.append(rid_stats(path, table))
        except (OSError, pa.ArrowInvalid):
            return []   # moved aside or damaged: the view's reader deals with it (dspark_obs.quarantine)
    return out


def overlapping(files: list[FileRids], ranges: list[tuple[str, str]] | None, nulls: bool) -> list[str]:
    """The paths of ``files`` that may hold a rid in one of ``ranges`` (inclusive; None: every rid) or, with
    ``nulls``, rows without a rid.  A file without statistics (``lo == ""`` and ``hi`` None) may hold any.

    >>> f = [FileRids("a", "a1", "a9", False, True), FileRids("b", "b1", "b9", True, True)]
    >>> overlapping(f, [("a5", "a7")], False), overlapping(f, [], True), overlapping(f, None, False)
    (['a'], ['b'], ['a', 'b'])
    """
    keep = []
    for f in files:
        unknown = f.lo == "" and f.hi is None
        if ranges is None or unknown or (nulls and f.nulls) or (
                f.lo is not None and any(lo <= f.hi and f.lo <= hi for lo, hi in ranges)):
            keep.append(f.path)
    return keep


def source(con, table: str, run_id: str, ranges: list[tuple[str, str]] | None, nulls: bool,
           param: str) -> tuple[str, dict]:
    """``(FROM text, parameters)`` for ``table``'s rows of ``run_id`` in ``ranges`` (and rows without a rid,
    with ``nulls``): its overlapping files read directly (a ``run_id`` column from the query's ``$run``), the
    list bound as ``$param``; or the view's name and no parameter (see the module docstring)."""
    root = root_of(con)
    if root is None or isinstance(root, str) or ranges is None:
        return table, {}
    files = file_rids(root, table, run_id)
    if not files or not all(f.plain for f in files):
        return table, {}
    keep = overlapping(files, ranges, nulls)
    if not keep:
        return table, {}
    return f"(SELECT *, $run AS run_id FROM read_parquet(${param}, hive_partitioning = false))", {param: keep}
