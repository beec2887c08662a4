"""Files of an object store that DuckDB's threads may read at once: a position per thread.

DuckDB reads a filesystem registered from Python (``register_filesystem``) by
calling ``seek(offset)`` and then ``read(n)`` on **one** file object shared by
its scan threads.  fsspec's ``ArrowFSWrapper`` hands out a pyarrow stream with
one position, so two threads reading row groups of the same file interleave
their seeks and reads and get each other's bytes: a large Parquet file (several
row groups) read over ``s3://`` then fails as "ZSTD Decompression failure",
"Invalid string encoding" or a short read, more often the slower the reads
(an object store under load).  Here each thread keeps its own position and every
read is a positional ``read_at`` of pyarrow's random-access file, which is safe
to call concurrently.

Each file DuckDB touches costs requests: it asks the file's size and
modification time (``info``, ``modified``) and opens it (pyarrow's
``open_input_file``: one HEAD) on every query, and each of the views a
query reads re-globs its table.  A report on a small store over S3 made about
44,000 HEADs that way (one per file per question, per query).  Part files are
written once under a unique name, so the wrapper answers ``info`` and
``modified`` from what the newest listing (or a first HEAD) said, and keeps an
opened file per path (``read_at`` needs no cursor, so every DuckDB file object
of that path shares it); a listing that shows a path with another size or time
drops what was kept of it.
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict

import pyarrow.fs as pafs

__all__ = ["PositionalFile", "duckdb_filesystem"]


class PositionalFile(io.RawIOBase):
    """A read-only file whose position is per thread; reads go to ``read_at`` (no shared cursor)."""

    def __init__(self, raw, path: str, *, shared: bool = False) -> None:
        super().__init__()
        self._raw, self.path, self._shared = raw, path, shared   # shared: the raw file outlives this one
        self._size = raw.size()
        self._where = threading.local()

    @property
    def size(self) -> int:
        return self._size

    def _pos(self) -> int:
        return getattr(self._where, "pos", 0)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos(), os.SEEK_END: self._size}[whence]
        self._where.pos = max(0, base + int(offset))
        return self._where.pos

    def read(self, n: int = -1) -> bytes:
        pos = self._pos()
        n = self._size - pos if n is None or n < 0 else min(int(n), self._size - pos)
        if n <= 0:
            return b""
        data = self._raw.read_at(n, pos)
        self._where.pos = pos + len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed and not self._shared:
            self._raw.close()
        super().close()


OPEN_FILES_KEPT = 4096
"""Opened files a wrapper keeps (least recently used dropped): a handle holds no connection, only its size."""


def duckdb_filesystem(fs: pafs.FileSystem, scheme: str):
    """``fs`` as an fsspec filesystem named ``scheme`` whose files :class:`PositionalFile` serves, sizes and
    times from its listings, opened files kept per path (see the module docstring)."""
    # at call time: fsspec's wrapper is needed only for object stores
    from fsspec.implementations.arrow import ArrowFSWrapper

    class _Wrapper(ArrowFSWrapper):
        protocol = scheme

        def __init__(self, inner):
            super().__init__(inner)
            self._lock = threading.Lock()
            self._infos: dict[str, dict] = {}          # path -> fsspec entry (size, mtime)
            self._raws: OrderedDict = OrderedDict()    # path -> (entry, pyarrow random-access file)

        def _learn(self, entry: dict) -> None:
            with self._lock:
                old = self._infos.get(entry["name"])
                if old is not None and (old["size"], old["mtime"]) != (entry["size"], entry["mtime"]):
                    self._raws.pop(entry["name"], None)   # rewritten since: open it again
                self._infos[entry["name"]] = entry

        def ls(self, path, detail=False, **kwargs):
            entries = super().ls(path, detail=True, **kwargs)
            for entry in entries:
                self._learn(entry)
            return entries if detail else [e["name"] for e in entries]

        def info(self, path, **kwargs):
            key = self._strip_protocol(path)
            entry = self._infos.get(key)
            if entry is None:
                entry = super().info(key)
                self._learn(entry)
            return entry

        def modified(self, path):
            return self.info(path)["mtime"]

        def _raw(self, path: str):
            with self._lock:
                kept = self._raws.get(path)
                if kept is not None:
                    self._raws.move_to_end(path)
                    return kept[1]
            raw = self.fs.open_input_file(path)
            with self._lock:
                self._raws[path] = (self._infos.get(path), raw)
                while len(self._raws) > OPEN_FILES_KEPT:
                    self._raws.popitem(last=False)
            return raw

        def _open(self, path, mode="rb", block_size=None, seekable=True, **kwargs):
            if mode == "rb" and seekable:
                return PositionalFile(self._raw(path), path, shared=True)
            return super()._open(path, mode, block_size, seekable, **kwargs)

    return _Wrapper(fs)
