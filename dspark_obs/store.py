"""The Parquet store: one data root, one directory per table, one partition per run.

Layout::

    <root>/<table>/run_id=<id>/part-<utc-timestamp>-<8 hex>.parquet

Why this shape:

* Append-only part files let a collector write while a dashboard reads: a
  reader lists files at query time and every file it can see is complete,
  because a part file only appears under its final name after it was written
  and fsynced under a hidden ``.<name>.tmp`` name (see :meth:`Store.write`).
* ``run_id`` lives in the directory name (hive partitioning), so DuckDB and
  pyarrow can prune runs without opening files.
* Readers only look at ``part-*.parquet``; anything else (a ``.tmp`` left by a
  crash, a stray file) is ignored.  A part file damaged after the fact is moved
  to ``<root>/_quarantine/`` by the first reader that meets it
  (:mod:`dspark_obs.quarantine`), so it never fails the rest of the store.

The ``runs`` table holds one row per run; :meth:`Store.upsert_run` replaces it
by writing a newer part file and deleting the older ones afterwards.  While
both exist, readers keep the row of the newest file (names sort by time).
"""

from __future__ import annotations

import datetime as _dt
import glob
import hashlib
import os
import re
import secrets
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dspark_obs import fleet, schema

__all__ = ["Store", "RUN_ID_PATTERN", "validate_run_id", "PART_GLOB"]

RUN_ID_PATTERN = r"[A-Za-z0-9_.-]+"
"""Allowed run ids: safe as a directory name and as a hive partition value."""
PART_GLOB = "part-*.parquet"
"""The only file names readers consider (``.tmp`` and foreign files are skipped)."""

_RUN_ID_RE = re.compile(RUN_ID_PATTERN)
_PARTITIONING = ds.partitioning(pa.schema([("run_id", pa.string())]), flavor="hive")
_TS_FORMAT = "%Y%m%dT%H%M%S%fZ"  # fixed width, so names sort chronologically


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it matches :data:`RUN_ID_PATTERN`, else raise ValueError."""
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id) or run_id in {".", ".."}:
        raise ValueError(
            f"invalid run_id {run_id!r}: use letters, digits, '_', '.' and '-' "
            f"(pattern {RUN_ID_PATTERN}, not '.' or '..')"
        )
    return run_id


def _read_schema(table: str) -> pa.Schema:
    """What readers see: the file schema plus the ``run_id`` partition column."""
    return schema.schema_for(table).append(pa.field("run_id", pa.string(), nullable=False))


def _part_name(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"part-{now.strftime(_TS_FORMAT)}-{secrets.token_hex(4)}.parquet"


def _name_time(name: str) -> _dt.datetime | None:
    """The UTC time in a part file name; None for a name this module did not make."""
    try:
        stamp = name.split("-")[1]
        return _dt.datetime.strptime(stamp, _TS_FORMAT).replace(tzinfo=_dt.timezone.utc)
    except (IndexError, ValueError):
        return None


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Store:
    """Partitioned Parquet tables under one data root.

    >>> import tempfile
    >>> store = Store(tempfile.mkdtemp())
    >>> store.write("gaps", "r1", []) is None
    True
    >>> store.read("gaps").num_rows
    0
    """

    def __init__(self, root: str | Path, *, layout: str = "flat", writer_id: str | None = None) -> None:
        self.root = Path(root)
        if layout not in fleet.LAYOUTS:
            raise ValueError(f"layout {layout!r} is not one of {', '.join(fleet.LAYOUTS)}")
        self.layout = layout
        self._fleet = None
        if layout == "fleet":
            from dspark_obs.objstore import checked_writer_id

            self._fleet = fleet.FleetWriter(pafs.LocalFileSystem(), str(self.root.resolve()),
                                            checked_writer_id(writer_id), atomic_rename=True)

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # -- writing ---------------------------------------------------------

    def write(self, table: str, run_id: str, rows: pa.Table | list[dict]) -> Path | None:
        """Append ``rows`` to ``table`` for ``run_id`` as one new part file.

        Rows are cast to ``schema.schema_for(table)``: missing nullable columns
        become null; an unknown column or a null in a required column is a
        ValueError naming the columns.  The file is written under a hidden
        temporary name, fsynced, renamed into place and the directory fsynced,
        so a concurrent reader sees either no file or the whole file.

        Returns the new file's path, or None when ``rows`` is empty (nothing
        is written).
        """
        validate_run_id(run_id)
        data = _conform(table, run_id, rows)
        if data.num_rows == 0:
            return None
        if self._fleet is not None and table in fleet.FLEET_TABLES:
            return Path(self._fleet.write(table, run_id, data)[0])
        return self._commit(table, run_id, data, _part_name())

    def upsert_run(self, run_id: str, **fields) -> Path:
        """Insert or update the single ``runs`` row of ``run_id``.

        ``fields`` are merged over the current row (if any), so a collector can
        set ``ended_at`` later without repeating the rest.  The new row goes to
        a new part file; older part files of this run are deleted only after
        the new one is committed, and readers prefer the newest file, so the
        row is never missing or doubled for a reader.  Not safe against two
        processes updating the same run at once (last writer wins).
        """
        validate_run_id(run_id)
        partition = self.root / "runs" / f"run_id={run_id}"
        current = self.read("runs", run_id)
        row = current.drop_columns(["run_id"]).to_pylist()[-1] if current.num_rows else {}
        row.update(fields)
        data = _conform("runs", run_id, [row])
        older = sorted(p.name for p in partition.glob(PART_GLOB)) if partition.is_dir() else []
        now = _dt.datetime.now(_dt.timezone.utc)
        latest = max(filter(None, map(_name_time, older)), default=None)
        if latest is not None and latest >= now:  # clock went back, or the same microsecond
            now = latest + _dt.timedelta(microseconds=1)
        path = self._commit("runs", run_id, data, _part_name(now))
        for name in older:
            if name < path.name:
                (partition / name).unlink(missing_ok=True)
        _fsync_dir(partition)
        return path

    def _commit(self, table: str, run_id: str, data: pa.Table, name: str, *, subdir: str | None = None) -> Path:
        partition = self.root / table / f"run_id={run_id}"
        if subdir is not None:
            partition = partition / subdir
        created = not partition.is_dir()
        partition.mkdir(parents=True, exist_ok=True)
        final = partition / name
        tmp = partition / f".{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                pq.write_table(data, f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(partition)
        if created:
            _fsync_dir(partition.parent)
            _fsync_dir(self.root)
        return final

    # -- staged writes: many workers write, one driver commits ----------------

    def stage(self, table: str, run_id: str, rows: pa.Table | list[dict], batch: str) -> Path | None:
        """Write ``rows`` as a part file of ``batch``, invisible to readers until :meth:`commit_staged`.

        Staged files live in ``<table>/run_id=<id>/_staged-<batch>/``; readers
        only list part files directly in a partition (or in its committed
        sub-partitions), so a worker that dies leaves nothing visible.
        """
        validate_run_id(run_id)
        data = _conform(table, run_id, rows)
        if data.num_rows == 0:
            return None
        return self._commit(table, run_id, data, _part_name(), subdir=_staged_dir(batch))

    def commit_staged(self, table: str, run_id: str, batch: str) -> int:
        """Move ``batch``'s staged part files into the partition (each a rename); returns their number."""
        partition = self.root / table / f"run_id={validate_run_id(run_id)}"
        staged = partition / _staged_dir(batch)
        if not staged.is_dir():
            return 0
        partition.mkdir(parents=True, exist_ok=True)
        files = sorted(staged.glob(PART_GLOB))
        for path in files:
            os.rename(path, partition / path.name)
        _fsync_dir(partition)
        self.discard_staged(table, run_id, batch)
        return len(files)

    def discard_staged(self, table: str, run_id: str, batch: str) -> None:
        """Remove what ``batch`` staged and did not commit (a failed run)."""
        staged = self.root / table / f"run_id={validate_run_id(run_id)}" / _staged_dir(batch)
        if staged.is_dir():
            for path in staged.iterdir():
                path.unlink(missing_ok=True)
            staged.rmdir()

    # -- reading ---------------------------------------------------------

    def read(self, table: str, run_id: str | None = None) -> pa.Table:
        """All rows of ``table`` (or of one run) with ``run_id`` as a string column.

        Columns follow the schema, then ``run_id``; files written before a
        nullable column existed read it as null.  An absent table or run gives
        an empty table with the same columns.  For ``runs`` only the newest
        part file of each run counts (see :meth:`upsert_run`).
        """
        read_schema = _read_schema(table)
        if run_id is not None:
            validate_run_id(run_id)
        for attempt in range(3):  # an upsert may delete a file we just listed
            files = self._part_files(table, run_id)
            if not files:
                return read_schema.empty_table()
            dataset = ds.dataset(
                [str(p) for p in files], schema=read_schema, format="parquet",
                partitioning=_PARTITIONING, partition_base_dir=str(self.root / table),
                ignore_prefixes=[".", "_"],
            )
            try:
                return dataset.to_table()
            except (pa.ArrowInvalid, OSError):
                from dspark_obs import quarantine

                if attempt == 2:
                    raise
                if quarantine.sweep(self.root):  # a damaged part file was moved aside: read the rest
                    continue
                if all(p.exists() for p in files):  # else an upsert deleted a file we listed: list again
                    raise
        raise AssertionError("unreachable")

    def _part_files(self, table: str, run_id: str | None) -> list[Path]:
        partition = f"run_id={run_id}" if run_id is not None else "run_id=*"
        pattern = os.path.join(glob.escape(str(self.root / table)), partition, PART_GLOB)
        files = sorted(Path(p) for p in glob.glob(pattern)) + self._fleet_files(table, run_id)
        if table == "runs":  # one row per run: the newest file wins
            newest = {p.parent: p for p in files}
            files = sorted(newest.values())
        return files

    def _fleet_files(self, table: str | None, run_id: str | None) -> list[Path]:
        """Committed files of the fleet layout (:mod:`dspark_obs.fleet`); none in a flat store."""
        if not (self.root / fleet.MANIFEST_DIR).is_dir():
            return []
        base = str(self.root.resolve())
        found = fleet.committed_files(pafs.LocalFileSystem(), base, table=table, run_id=run_id)
        return [self.root / Path(p).relative_to(base) for p in found]

    def runs(self) -> list[str]:
        """Run ids that have at least one part file in any table, sorted."""
        ids = {_partition_value(p, "run_id") for p in self._all_part_files()}
        return sorted(ids)

    def tables(self) -> list[str]:
        """Tables that have at least one part file, sorted."""
        return sorted({p.relative_to(self.root).parts[0] for p in self._all_part_files()})

    def drop_run(self, table: str, run_id: str) -> int:
        """Remove one run's partition of ``table``; returns the files removed.

        Used when a run is collected again under the same id (the demo) and by
        estimators that rewrite their result tables.
        """
        validate_run_id(run_id)
        partition = self.root / table / f"run_id={run_id}"
        removed = 0
        if (self.root / fleet.MANIFEST_DIR).is_dir():
            removed = fleet.forget_table(pafs.LocalFileSystem(), str(self.root.resolve()), table, run_id)
        if not partition.is_dir():
            return removed
        files = [p for p in partition.iterdir() if not p.is_dir()]  # staged batches (``_staged-*/``) stay
        for path in files:
            path.unlink(missing_ok=True)
        if next(partition.iterdir(), None) is None:
            partition.rmdir()
        return len(files) + removed

    def version(self) -> str:
        """A cheap fingerprint of the store's contents, for cache keys.

        Hashes every part file's relative path, size and mtime: it changes when
        a file is added, replaced or removed, and costs one ``stat`` per file.
        """
        digest = hashlib.blake2b(digest_size=8)
        for path in self._all_part_files():
            try:
                st = path.stat()
            except FileNotFoundError:  # removed by an upsert meanwhile
                continue
            rel = path.relative_to(self.root).as_posix()
            digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return digest.hexdigest()

    def _all_part_files(self) -> list[Path]:
        pattern = os.path.join(glob.escape(str(self.root)), "*", "run_id=*", PART_GLOB)
        return sorted([Path(p) for p in glob.glob(pattern)] + self._fleet_files(None, None))


def _partition_value(path: Path, key: str) -> str:
    """The value of hive partition ``key`` in ``path`` (``run_id=a/...`` -> ``a``)."""
    return next(part.removeprefix(f"{key}=") for part in path.parts if part.startswith(f"{key}="))


def _staged_dir(batch: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", batch):
        raise ValueError(f"staged batch {batch!r}: use letters, digits, '_', '.' and '-'")
    return f"_staged-{batch}"


def _conform(table: str, run_id: str, rows: pa.Table | list[dict]) -> pa.Table:
    """Cast ``rows`` to the file schema of ``table``; raise ValueError on a mismatch."""
    target = schema.schema_for(table)
    if isinstance(rows, pa.Table):
        columns = rows.column_names
    elif isinstance(rows, list):
        if not all(isinstance(r, dict) for r in rows):
            raise TypeError(f"{table}: rows must be a pyarrow.Table or a list of dicts")
        columns = list(dict.fromkeys(k for r in rows for k in r))
    else:
        raise TypeError(f"{table}: rows must be a pyarrow.Table or a list of dicts, got {type(rows).__name__}")
    if "run_id" in columns:
        values = rows.column("run_id").to_pylist() if isinstance(rows, pa.Table) else [r.get("run_id") for r in rows]
        if any(v != run_id for v in values):
            raise ValueError(f"{table}: column run_id disagrees with run_id={run_id!r}; drop the column or fix it")
        columns.remove("run_id")
        rows = rows.drop_columns(["run_id"]) if isinstance(rows, pa.Table) else [
            {k: v for k, v in r.items() if k != "run_id"} for r in rows]
    extra = [c for c in columns if c not in target.names]
    if extra:
        raise ValueError(f"{table}: unknown columns {extra}; allowed: {', '.join(target.names)}")
    missing = [f.name for f in target if not f.nullable and f.name not in columns]
    if missing and len(rows):
        raise ValueError(f"{table}: missing required columns {missing}")
    try:
        if isinstance(rows, list):
            data = pa.Table.from_pylist(rows, schema=target)
        else:
            arrays = []
            for field in target:
                if field.name in columns:
                    column = rows.column(field.name)
                    arrays.append(column if column.type == field.type else column.cast(field.type))
                else:
                    arrays.append(pa.nulls(rows.num_rows, field.type))
            data = pa.Table.from_arrays(arrays, schema=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
        raise ValueError(f"{table}: rows do not fit the schema: {exc}") from exc
    nulls = [f"{f.name} ({data.column(f.name).null_count})" for f in target
             if not f.nullable and data.column(f.name).null_count]
    if nulls:
        raise ValueError(f"{table}: required columns hold nulls: {', '.join(nulls)}")
    return data
