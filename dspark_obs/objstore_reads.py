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
"""

from __future__ import annotations

import io
import os
import threading

import pyarrow.fs as pafs

__all__ = ["PositionalFile", "duckdb_filesystem"]


class PositionalFile(io.RawIOBase):
    """A read-only file whose position is per thread; reads go to ``read_at`` (no shared cursor)."""

    def __init__(self, raw, path: str) -> None:
        super().__init__()
        self._raw, self.path = raw, path
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
        if not self.closed:
            self._raw.close()
        super().close()


def duckdb_filesystem(fs: pafs.FileSystem, scheme: str):
    """``fs`` as an fsspec filesystem named ``scheme`` whose files :class:`PositionalFile` serves."""
    # at call time: fsspec's wrapper is needed only for object stores
    from fsspec.implementations.arrow import ArrowFSWrapper

    class _Wrapper(ArrowFSWrapper):
        protocol = scheme

        def _open(self, path, mode="rb", block_size=None, seekable=True, **kwargs):
            if mode == "rb" and seekable:
                return PositionalFile(self.fs.open_input_file(path), path)
            return super()._open(path, mode, block_size, seekable, **kwargs)

    return _Wrapper(fs)
