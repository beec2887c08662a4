"""The store's layout on an object store (``--out s3://bucket/prefix``, ``gs://...``).

Same layout as :class:`dspark_obs.store.Store`, through pyarrow filesystems::

    <url>/<table>/run_id=<id>/part-<utc-timestamp>-<writer id>-<8 hex>.parquet

* An object appears only when its upload completes, so a reader never sees a
  partial file (the local store gets the same from write-then-rename).
* The writer id (default ``<host>.<pid>``) is in every file name, so many
  sidecars — one per server, DP rank or host — write side by side without
  coordination: no two ever write or delete the same key.  Names still sort
  by time first, so "newest file wins" for ``runs`` holds across writers;
  :meth:`ObjectStore.upsert_run` deletes only its own older ``runs`` files.
* Connection options go in the URL query, as pyarrow reads them, e.g.
  ``s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http``.

:func:`open_store` picks the local store or this one from ``--out``;
:func:`connect_sql` gives DuckDB views over an object store, the same views
``dspark_obs.sql.connect`` gives over a local root (read through pyarrow's
filesystem, so no DuckDB extension is needed).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import secrets
import socket
from pathlib import Path
from typing import Union
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dspark_obs import fleet, schema
from dspark_obs.store import Store, _conform, _read_schema, _staged_dir, validate_run_id

__all__ = ["ObjectStore", "open_store", "is_url", "connect_sql", "default_writer_id"]

_TS_FORMAT = "%Y%m%dT%H%M%S%fZ"
_WRITER_RE = re.compile(r"[A-Za-z0-9_.]+")
_PARTITIONING = ds.partitioning(pa.schema([("run_id", pa.string())]), flavor="hive")



def is_url(out: str) -> bool:
    """True for an object-store URL (``s3://``, ``gs://``, ...); a plain path or ``file://`` is local."""
    scheme = urlsplit(str(out)).scheme
    return len(scheme) > 1 and scheme != "file"


def checked_writer_id(writer_id: str | None) -> str:
    """``writer_id`` (default ``<host>.<pid>``) if it is safe in a file name, else ValueError."""
    writer_id = writer_id or default_writer_id()
    if not _WRITER_RE.fullmatch(writer_id):
        raise ValueError(f"writer id {writer_id!r}: use letters, digits, '_' and '.'")
    return writer_id


def default_writer_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
    return f"{host}.{os.getpid()}"


def open_store(out: Union[str, Path], *, writer_id: str | None = None,
               layout: str = "flat") -> Union[Store, "ObjectStore"]:
    """The store behind ``--out``: local directory or object-store URL; ``layout`` for what it writes."""
    if is_url(str(out)):
        return ObjectStore(str(out), writer_id=writer_id, layout=layout)
    if str(out).startswith("file://"):
        out = urlsplit(str(out)).path
    return Store(out, layout=layout, writer_id=writer_id)


class ObjectStore:
    """Partitioned Parquet tables under an object-store URL (see the module docstring)."""

    def __init__(self, url: str, *, writer_id: str | None = None, filesystem: pafs.FileSystem | None = None,
                 layout: str = "flat") -> None:
        self.url = url
        if filesystem is None:
            filesystem, base = pafs.FileSystem.from_uri(url)
        else:
            base = urlsplit(url).netloc + urlsplit(url).path
        self.fs = filesystem
        self.base = base.rstrip("/")
        self.scheme = urlsplit(url).scheme
        self.writer_id = checked_writer_id(writer_id)
        if layout not in fleet.LAYOUTS:
            raise ValueError(f"layout {layout!r} is not one of {', '.join(fleet.LAYOUTS)}")
        self.layout = layout
        self._fleet = (fleet.FleetWriter(self.fs, self.base, self.writer_id, atomic_rename=False)
                       if layout == "fleet" else None)

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r}, writer_id={self.writer_id!r})"

    @property
    def root(self) -> str:
        return f"{self.scheme}://{self.base}"

    def _part_name(self, now: _dt.datetime | None = None) -> str:
        now = now or _dt.datetime.now(_dt.timezone.utc)
        return f"part-{now.strftime(_TS_FORMAT)}-{self.writer_id}-{secrets.token_hex(4)}.parquet"

    def _partition(self, table: str, run_id: str) -> str:
        return f"{self.base}/{table}/run_id={run_id}"

    def _put(self, path: str, data: pa.Table) -> str:
        with self.fs.open_output_stream(path) as f:
            pq.write_table(data, f, compression="zstd")
        return path

    # -- writing (the same contract as Store) ----------------------------------

    def write(self, table: str, run_id: str, rows: pa.Table | list[dict]) -> str | None:
        validate_run_id(run_id)
        data = _conform(table, run_id, rows)
        if data.num_rows == 0:
            return None
        if self._fleet is not None and table in fleet.FLEET_TABLES:
            return self._fleet.write(table, run_id, data)[0]
        return self._put(f"{self._partition(table, run_id)}/{self._part_name()}", data)

    def upsert_run(self, run_id: str, **fields) -> str:
        validate_run_id(run_id)
        current = self.read("runs", run_id)
        row = current.drop_columns(["run_id"]).to_pylist()[-1] if current.num_rows else {}
        row.update(fields)
        data = _conform("runs", run_id, [row])
        mine = [p for p in self._files("runs", run_id) if f"-{self.writer_id}-" in p.rsplit("/", 1)[-1]]
        path = self._put(f"{self._partition('runs', run_id)}/{self._part_name()}", data)
        for old in mine:
            if old.rsplit("/", 1)[-1] < path.rsplit("/", 1)[-1]:
                try:
                    self.fs.delete_file(old)
                except (FileNotFoundError, OSError):
                    pass
        return path

    def drop_run(self, table: str, run_id: str) -> int:
        """Delete one run's partition of ``table`` (every writer's files); returns the objects deleted."""
        validate_run_id(run_id)
        root = self._partition(table, run_id)
        removed = fleet.forget_table(self.fs, self.base, table, run_id)
        infos = self.fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File]
        for path in files:  # staged batches (``_staged-*/``) stay
            self.fs.delete_file(path)
        return len(files) + removed

    # -- staged writes (Store's contract: invisible until committed) --------------

    def stage(self, table: str, run_id: str, rows: pa.Table | list[dict], batch: str) -> str | None:
        validate_run_id(run_id)
        data = _conform(table, run_id, rows)
        if data.num_rows == 0:
            return None
        return self._put(f"{self._partition(table, run_id)}/{_staged_dir(batch)}/{self._part_name()}", data)

    def commit_staged(self, table: str, run_id: str, batch: str) -> int:
        staged = f"{self._partition(table, run_id)}/{_staged_dir(batch)}"
        infos = self.fs.get_file_info(pafs.FileSelector(staged, allow_not_found=True))
        files = sorted(i.path for i in infos if i.type == pafs.FileType.File)
        for path in files:  # a copy then a delete on S3; each object appears whole
            self.fs.move(path, f"{self._partition(table, run_id)}/{path.rsplit('/', 1)[1]}")
        self.discard_staged(table, run_id, batch)
        return len(files)

    def discard_staged(self, table: str, run_id: str, batch: str) -> None:
        staged = f"{self._partition(table, run_id)}/{_staged_dir(batch)}"
        try:
            self.fs.delete_dir(staged)  # its objects and the directory marker S3 filesystems leave
        except (FileNotFoundError, OSError):
            pass

    # -- reading ---------------------------------------------------------------

    def _files(self, table: str, run_id: str | None) -> list[str]:
        """Part files readers see: the old layout's, then the fleet layout's committed ones."""
        flat = self._flat_files(table, run_id)
        return sorted(flat + fleet.committed_files(self.fs, self.base, table=table, run_id=run_id))

    def _flat_files(self, table: str, run_id: str | None) -> list[str]:
        root = f"{self.base}/{table}" if run_id is None else self._partition(table, run_id)
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        except (FileNotFoundError, OSError):
            return []
        files = sorted(i.path for i in infos if i.type == pafs.FileType.File
                       and re.fullmatch(r"part-.*\.parquet", i.base_name)
                       and re.fullmatch(r"run_id=[^/]+", i.path[len(self.base) + len(table) + 2:].rsplit("/", 1)[0]))
        if table == "runs":
            newest: dict[str, str] = {}
            for p in files:
                part = p.rsplit("/", 1)
                if part[0] not in newest or part[1] > newest[part[0]].rsplit("/", 1)[1]:
                    newest[part[0]] = p
            files = sorted(newest.values())
        return files

    def read(self, table: str, run_id: str | None = None) -> pa.Table:
        read_schema = _read_schema(table)
        if run_id is not None:
            validate_run_id(run_id)
        files = self._files(table, run_id)
        if not files:
            return read_schema.empty_table()
        dataset = ds.dataset(files, schema=read_schema, format="parquet", filesystem=self.fs,
                             partitioning=_PARTITIONING, partition_base_dir=f"{self.base}/{table}")
        return dataset.to_table()

    def runs(self) -> list[str]:
        ids = set()
        for table in schema.TABLES:
            for p in self._files(table, None):
                m = re.search(r"/run_id=([^/]+)/", p)
                if m:
                    ids.add(m.group(1))
        return sorted(ids)


# -- SQL over an object store ----------------------------------------------------

def fsspec_filesystem(store: ObjectStore):
    """The store's pyarrow filesystem as fsspec, for ``duckdb.register_filesystem`` (a read position
    per DuckDB thread: :mod:`dspark_obs.objstore_reads`)."""
    from dspark_obs.objstore_reads import duckdb_filesystem

    return duckdb_filesystem(store.fs, store.scheme)


def connect_sql(url_or_store: Union[str, ObjectStore]):
    """``dspark_obs.sql.connect`` on an object-store URL (kept for callers that hold a store)."""
    from dspark_obs import sql as sqlmod

    return sqlmod.connect(url_or_store.url if isinstance(url_or_store, ObjectStore) else url_or_store)
