"""The Parquet store: one data root, one directory per table, one partition per run.

Layout, the same on a local directory and on an object store (``s3://bucket/prefix``)::

    <root>/<table>/run_id=<id>/part-<utc-timestamp>[-<writer id>]-<8 hex>.parquet

One :class:`Store` over a pyarrow filesystem (``LocalFileSystem``, ``S3FileSystem``, ...), so
every reader and writer is written once; ``Store(path_or_url)`` picks the filesystem.

Why this shape:

* Append-only part files let a collector write while a dashboard reads: a
  reader lists files at query time and every file it can see is complete.
  Locally a part file only appears under its final name after it was written
  and fsynced under a hidden ``.<name>.tmp`` name (see :meth:`Store.write`); on
  an object store an object appears only when its upload completes.
* On an object store the writer id (default ``<host>.<pid>``) is in every file
  name, so many sidecars write side by side without coordination: no two ever
  write or delete the same key.  Names still sort by time first, so "newest
  file wins" for ``runs`` holds across writers.
* Rows within a part file are clustered by request (:mod:`dspark_obs.clustering`),
  so the estimators' rid-range reads skip the row groups of other requests.
* ``run_id`` lives in the directory name (hive partitioning), so DuckDB and
  pyarrow can prune runs without opening files.
* Readers only look at ``part-*.parquet``; anything else (a ``.tmp`` left by a
  crash, a stray file) is ignored.  A local part file damaged after the fact is
  moved to ``<root>/_quarantine/`` by the first reader that meets it
  (:mod:`dspark_obs.quarantine`), so it never fails the rest of the store.
* Connection options of an object store go in the URL query, as pyarrow reads
  them, e.g. ``s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http``.

The ``runs`` table holds one row per run; :meth:`Store.upsert_run` replaces it
by writing a newer part file and deleting the writer's older ones afterwards.
While both exist, readers keep the row of the newest file (names sort by time).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
import secrets
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dspark_obs import fleet, quarantine, schema
from dspark_obs.clustering import cluster_by_request, write_options
from dspark_obs.schema import conform

__all__ = ["Store", "RUN_ID_PATTERN", "validate_run_id", "PART_GLOB", "is_url", "open_store", "checked_writer_id",
           "default_writer_id"]

RUN_ID_PATTERN = r"[A-Za-z0-9_.-]+"
"""Allowed run ids: safe as a directory name and as a hive partition value."""
PART_GLOB = "part-*.parquet"
"""The only file names readers consider (``.tmp`` and foreign files are skipped)."""

_RUN_ID_RE = re.compile(RUN_ID_PATTERN)
_WRITER_RE = re.compile(r"[A-Za-z0-9_.]+")
_PART_RE = re.compile(r"part-[^/]*\.parquet")
_FLAT_PART_RE = re.compile(r"[^/.][^/]*/run_id=[^/]+/part-[^/]*\.parquet")   # <table>/run_id=<id>/part-*
_TS_FORMAT = "%Y%m%dT%H%M%S%fZ"  # fixed width, so names sort chronologically


def is_url(out: str | Path) -> bool:
    """True for an object-store URL (``s3://``, ``gs://``, ...); a plain path or ``file://`` is local."""
    scheme = urlsplit(str(out)).scheme
    return len(scheme) > 1 and scheme != "file"


def default_writer_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
    return f"{host}.{os.getpid()}"


def checked_writer_id(writer_id: str | None) -> str:
    """``writer_id`` (default ``<host>.<pid>``) if it is safe in a file name, else ValueError."""
    writer_id = writer_id or default_writer_id()
    if not _WRITER_RE.fullmatch(writer_id):
        raise ValueError(f"writer id {writer_id!r}: use letters, digits, '_' and '.'")
    return writer_id


def open_store(out: str | Path, *, writer_id: str | None = None, layout: str = "flat") -> "Store":
    """The store behind ``--out``: a local directory (or ``file://``) or an object-store URL."""
    return Store(out, writer_id=writer_id, layout=layout)


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it matches :data:`RUN_ID_PATTERN`, else raise ValueError."""
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id) or run_id in {".", ".."}:
        raise ValueError(
            f"invalid run_id {run_id!r}: use letters, digits, '_', '.' and '-' "
            f"(pattern {RUN_ID_PATTERN}, not '.' or '..')"
        )
    return run_id


def table_read_schema(table: str) -> pa.Schema:
    """What readers see: the file schema plus the ``run_id`` partition column."""
    return schema.schema_for(table).append(pa.field("run_id", pa.string(), nullable=False))


def _part_name(writer_id: str | None, now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    writer = f"-{writer_id}" if writer_id else ""
    return f"part-{now.strftime(_TS_FORMAT)}{writer}-{secrets.token_hex(4)}.parquet"


def part_file_time(name: str) -> _dt.datetime | None:
    """The UTC time in a part file name; None for a name this module did not make."""
    try:
        stamp = name.split("-")[1]
        return _dt.datetime.strptime(stamp, _TS_FORMAT).replace(tzinfo=_dt.timezone.utc)
    except (IndexError, ValueError):
        return None


def _fsync_dir(path: str | Path) -> None:
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


def _base_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


class Store:
    """Partitioned Parquet tables under one data root: a directory or an object-store URL.

    ``fs`` and ``base`` are the pyarrow filesystem and the root's path on it;
    every method below works through them, so a local store and an object store
    share every reader and writer.  Only the commit differs: locally a
    write-fsync-rename (and readers quarantine a damaged file), on an object
    store one upload (an object appears whole).

    >>> import tempfile
    >>> store = Store(tempfile.mkdtemp())
    >>> store.write("gaps", "r1", []) is None
    True
    >>> store.read("gaps").num_rows
    0
    """

    def __init__(self, root: str | Path, *, layout: str = "flat", writer_id: str | None = None,
                 filesystem: pafs.FileSystem | None = None) -> None:
        if layout not in fleet.LAYOUTS:
            raise ValueError(f"layout {layout!r} is not one of {', '.join(fleet.LAYOUTS)}")
        self.layout = layout
        self.local = not is_url(root)
        if self.local:
            text = str(root)
            self.root = Path(urlsplit(text).path if text.startswith("file://") else root)
            self.fs, self.base = pafs.LocalFileSystem(), self.root.resolve().as_posix()
            # a local flat store's names carry no writer (one writer per directory); the fleet layout's do
            self.writer_id = checked_writer_id(writer_id) if layout == "fleet" else None
        else:
            self.url = str(root)  # only an object store has a URL (callers tell the two apart by it)
            if filesystem is None:
                filesystem, base = pafs.FileSystem.from_uri(self.url)
            else:
                base = urlsplit(self.url).netloc + urlsplit(self.url).path
            self.fs, self.base = filesystem, base.rstrip("/")
            self.scheme = urlsplit(self.url).scheme
            self.root = f"{self.scheme}://{self.base}"
            self.writer_id = checked_writer_id(writer_id)
        self._fleet = (fleet.FleetWriter(self.fs, self.base, self.writer_id, atomic_rename=self.local)
                       if layout == "fleet" else None)

    @property
    def location(self) -> str | Path:
        """What :func:`dspark_obs.sql.connect` takes for this store: its directory, or its URL (with options)."""
        return self.root if self.local else self.url

    def __repr__(self) -> str:
        if self.local:
            return f"Store({str(self.root)!r})"
        return f"Store({self.url!r}, writer_id={self.writer_id!r})"

    def _partition(self, table: str, run_id: str) -> str:
        return f"{self.base}/{table}/run_id={run_id}"

    def _path(self, path: str) -> Path | str:
        """A path on ``fs`` as callers see it: under :attr:`root` locally, the object's path otherwise."""
        return self.root / path[len(self.base) + 1:] if self.local else path

    def _name(self, now: _dt.datetime | None = None) -> str:
        return _part_name(None if self.local else self.writer_id, now)

    # -- writing ---------------------------------------------------------

    def write(self, table: str, run_id: str, rows: pa.Table | list[dict]) -> Path | str | None:
        """Append ``rows`` to ``table`` for ``run_id`` as one new part file.

        Rows are cast to ``schema.schema_for(table)``: missing nullable columns
        become null; an unknown column or a null in a required column is a
        ValueError naming the columns.  Locally the file is written under a
        hidden temporary name, fsynced, renamed into place and the directory
        fsynced, so a concurrent reader sees either no file or the whole file.

        Returns the new file's path, or None when ``rows`` is empty (nothing
        is written).
        """
        validate_run_id(run_id)
        data = conform.rows_for_table(table, run_id, rows)
        if data.num_rows == 0:
            return None
        if self._fleet is not None and table in fleet.FLEET_TABLES:
            return self._path(self._fleet.write(table, run_id, data)[0])
        data = cluster_by_request(data, table)
        return self._path(self._commit(self._partition(table, run_id), data, self._name()))

    def upsert_run(self, run_id: str, **fields) -> Path | str:
        """Insert or update the single ``runs`` row of ``run_id``.

        ``fields`` are merged over the current row (if any), so a collector can
        set ``ended_at`` later without repeating the rest.  The new row goes to
        a new part file; this writer's older part files of the run are deleted
        only after the new one is committed, and readers prefer the newest file,
        so the row is never missing or doubled for a reader.  Not safe against
        two processes updating the same run of a local store at once (last
        writer wins); on an object store each writer only deletes its own files.
        """
        validate_run_id(run_id)
        current = self.read("runs", run_id)
        row = current.drop_columns(["run_id"]).to_pylist()[-1] if current.num_rows else {}
        row.update(fields)
        data = conform.rows_for_table("runs", run_id, [row])
        partition = self._partition("runs", run_id)
        older = [_base_name(p) for p in self._listing(partition) if _PART_RE.fullmatch(_base_name(p))]
        if not self.local:
            older = [n for n in older if f"-{self.writer_id}-" in n]
        now = _dt.datetime.now(_dt.timezone.utc)
        latest = max(filter(None, map(part_file_time, older)), default=None)
        if latest is not None and latest >= now:  # clock went back, or the same microsecond
            now = latest + _dt.timedelta(microseconds=1)
        path = self._commit(partition, data, self._name(now))
        for name in sorted(older):
            if name < _base_name(path):
                try:
                    self.fs.delete_file(f"{partition}/{name}")
                except (FileNotFoundError, OSError):
                    pass
        if self.local:
            _fsync_dir(partition)
        return self._path(path)

    def _commit(self, folder: str, data: pa.Table, name: str) -> str:
        """Write ``data`` as ``folder/name``, whole or not at all; its path on ``fs``."""
        final = f"{folder}/{name}"
        if not self.local:  # an object appears only when its upload completes
            with self.fs.open_output_stream(final) as f:
                pq.write_table(data, f, **write_options(data))
            return final
        created = not os.path.isdir(folder)
        os.makedirs(folder, exist_ok=True)
        tmp = f"{folder}/.{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                pq.write_table(data, f, **write_options(data))
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(folder)
        if created:
            _fsync_dir(os.path.dirname(folder))
            _fsync_dir(self.base)
        return final

    # -- staged writes: many workers write, one driver commits ----------------

    def stage(self, table: str, run_id: str, rows: pa.Table | list[dict], batch: str) -> Path | str | None:
        """Write ``rows`` as a part file of ``batch``, invisible to readers until :meth:`commit_staged`.

        Staged files live in ``<table>/run_id=<id>/_staged-<batch>/``; readers
        only list part files directly in a partition (or in its committed
        sub-partitions), so a worker that dies leaves nothing visible.
        """
        validate_run_id(run_id)
        data = conform.rows_for_table(table, run_id, rows)
        if data.num_rows == 0:
            return None
        folder = f"{self._partition(table, run_id)}/{_staged_dir(batch)}"
        return self._path(self._commit(folder, cluster_by_request(data, table), self._name()))

    def commit_staged(self, table: str, run_id: str, batch: str) -> int:
        """Move ``batch``'s staged part files into the partition (a rename locally; a copy and a delete on S3,
        each object appearing whole); returns their number."""
        partition = self._partition(table, validate_run_id(run_id))
        files = sorted(p for p in self._listing(f"{partition}/{_staged_dir(batch)}")
                       if _PART_RE.fullmatch(_base_name(p)))
        if not files:
            self.discard_staged(table, run_id, batch)
            return 0
        for path in files:
            self.fs.move(path, f"{partition}/{_base_name(path)}")
        if self.local:
            _fsync_dir(partition)
        self.discard_staged(table, run_id, batch)
        return len(files)

    def discard_staged(self, table: str, run_id: str, batch: str) -> None:
        """Remove what ``batch`` staged and did not commit (a failed run)."""
        try:  # its objects and the directory marker S3 filesystems leave
            self.fs.delete_dir(f"{self._partition(table, validate_run_id(run_id))}/{_staged_dir(batch)}")
        except (FileNotFoundError, OSError):
            pass

    # -- reading ---------------------------------------------------------

    def read(self, table: str, run_id: str | None = None) -> pa.Table:
        """All rows of ``table`` (or of one run) with ``run_id`` as a string column.

        Columns follow the schema, then ``run_id``; files written before a
        nullable column existed read it as null.  An absent table or run gives
        an empty table with the same columns.  For ``runs`` only the newest
        part file of each run counts (see :meth:`upsert_run`).
        """
        read_schema = table_read_schema(table)
        if run_id is not None:
            validate_run_id(run_id)
        for attempt in range(3):  # an upsert may delete a file we just listed
            files = self.part_files(table, run_id)
            if not files:
                return read_schema.empty_table()
            try:
                return pa.concat_tables([self._read_file(p, read_schema, len(self.base) + len(table) + 2)
                                         for p in files])
            except (pa.ArrowInvalid, OSError):
                if not self.local or attempt == 2:
                    raise
                if quarantine.sweep(self.root):  # a damaged part file was moved aside: read the rest
                    continue
                if all(os.path.exists(p) for p in files):  # else an upsert deleted a file we listed: list again
                    raise
        raise AssertionError("unreachable")

    def _read_file(self, path: str, read_schema: pa.Schema, prefix: int) -> pa.Table:
        """One part file in ``read_schema``: its columns cast to the schema's types, the columns it predates
        as null, ``run_id`` from its ``run_id=<id>/`` folder.

        ``pyarrow.parquet.ParquetFile`` rather than ``pyarrow.dataset``: the dataset module imports pandas
        (about 0.8 CPU s and 50 MB), which ``ingest`` and the collectors would pay on every start.
        """
        with self.fs.open_input_file(path) as f:
            data = pq.ParquetFile(f).read()
        run_id = path[prefix:].split("/", 1)[0].removeprefix("run_id=")
        return conform.columns_as(data, read_schema,
                                  given={"run_id": pa.repeat(pa.scalar(run_id, pa.string()), data.num_rows)})

    def part_files(self, table: str, run_id: str | None = None, *, fleet_layout: bool = True) -> list[str]:
        """Paths on :attr:`fs` of the part files readers see, sorted: the flat layout's (directly in
        ``run_id=<id>/``), and the fleet layout's committed ones (unless ``fleet_layout=False``); for ``runs``
        the newest per run."""
        root = f"{self.base}/{table}" if run_id is None else self._partition(table, run_id)
        prefix = len(self.base) + len(table) + 2
        files = [p for p in self._listing(root, recursive=True)
                 if _PART_RE.fullmatch(_base_name(p)) and re.fullmatch(r"run_id=[^/]+", p[prefix:].rsplit("/", 1)[0])]
        files = sorted(files + (self._fleet_files(table, run_id) if fleet_layout else []))
        if table == "runs":  # one row per run: the newest file wins
            newest: dict[str, str] = {}
            for p in files:
                folder = p.rsplit("/", 1)[0]
                if folder not in newest or _base_name(p) > _base_name(newest[folder]):
                    newest[folder] = p
            files = sorted(newest.values())
        return files

    def _listing(self, folder: str, *, recursive: bool = False) -> list[str]:
        """Files under ``folder`` (none when it does not exist)."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(folder, recursive=recursive, allow_not_found=True))
        except (FileNotFoundError, OSError):
            return []
        return [i.path for i in infos if i.type == pafs.FileType.File]

    def _fleet_files(self, table: str | None, run_id: str | None) -> list[str]:
        """Committed files of the fleet layout (:mod:`dspark_obs.fleet`); none in a flat local store."""
        if self.local and not os.path.isdir(f"{self.base}/{fleet.MANIFEST_DIR}"):
            return []
        return fleet.committed_files(self.fs, self.base, table=table, run_id=run_id)

    def runs(self) -> list[str]:
        """Run ids that have at least one part file in any table, sorted."""
        return sorted({re.search(r"/run_id=([^/]+)/", p).group(1) for p in self._all_part_files()})

    def tables(self) -> list[str]:
        """Tables that have at least one part file, sorted."""
        return sorted({p[len(self.base) + 1:].split("/", 1)[0] for p in self._all_part_files()})

    def flat_tables(self) -> list[str]:
        """Tables with part files in the flat layout (directly in ``run_id=<id>/``), from one listing of the
        store: on an object store one paginated LIST, where asking per table took a LIST per table."""
        return sorted({p[len(self.base) + 1:].split("/", 1)[0] for p in self._listing(self.base, recursive=True)
                       if _FLAT_PART_RE.fullmatch(p[len(self.base) + 1:])})

    def drop_run_everywhere(self, run_id: str) -> int:
        """Remove ``run_id`` from every table that has its files, results included; returns the files removed.

        For a run collected or imported again under its id: its old estimates,
        calibrations and reports would otherwise describe data that is gone.
        """
        return sum(self.drop_run(table, run_id) for table in self.tables())

    def drop_run(self, table: str, run_id: str) -> int:
        """Remove one run's partition of ``table`` (every writer's files); returns the files removed.

        Used when a run is collected again under the same id (the demo) and by
        estimators that rewrite their result tables.  Staged batches
        (``_staged-*/``) stay.
        """
        partition = self._partition(table, validate_run_id(run_id))
        has_manifests = not self.local or os.path.isdir(f"{self.base}/{fleet.MANIFEST_DIR}")
        removed = fleet.forget_table(self.fs, self.base, table, run_id) if has_manifests else 0
        files = self._listing(partition)
        for path in files:
            try:
                self.fs.delete_file(path)
            except FileNotFoundError:
                pass
        if self.local and os.path.isdir(partition) and not os.listdir(partition):
            os.rmdir(partition)
        return len(files) + removed

    def version(self) -> str:
        """A cheap fingerprint of the store's contents, for cache keys.

        Hashes every part file's relative path, size and mtime: it changes when
        a file is added, replaced or removed, and costs one listing.
        """
        digest = hashlib.blake2b(digest_size=8)
        for info in self.fs.get_file_info(self._all_part_files()):
            if info.type != pafs.FileType.File:  # removed by an upsert meanwhile
                continue
            rel = info.path[len(self.base) + 1:]
            digest.update(f"{rel}\0{info.size}\0{info.mtime_ns}\n".encode())
        return digest.hexdigest()

    def _all_part_files(self) -> list[str]:
        flat = [p for p in self._listing(self.base, recursive=True) if _FLAT_PART_RE.fullmatch(p[len(self.base) + 1:])]
        return sorted(flat + self._fleet_files(None, None))


def _staged_dir(batch: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", batch):
        raise ValueError(f"staged batch {batch!r}: use letters, digits, '_', '.' and '-'")
    return f"_staged-{batch}"
