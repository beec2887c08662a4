"""``collect --request-log FILE``: follow SGLang's request log and store each finished request.

In attach mode on production traffic the sidecar sends no requests, so it
never sees the responses: without them the ceiling estimator has no realised
tokens to compare trimmed drafts with.  SGLang logs them when started with
``--log-requests --log-requests-format json --log-requests-level 3`` (level 3
keeps every ``output_ids`` entry and the logprobs); this module follows that
log file as it grows and hands each ``request.finished`` event over as a
``requests`` row and ``tokens`` rows, which join the run's ``step_reqs`` by
``rid``.

:class:`LogTail` starts where the file ends when it is opened (earlier
requests are not this run's), returns only complete lines, and survives
rotation: when the path names a new file (another inode) it finishes the old
one and continues at the start of the new one; when the file shrinks below
where it was (copytruncate) it starts again at its beginning.  A missing
file is waited for.  (A rotated file written to after it was left is not read
again.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from collectors.sglang.responses import finished_rows, parse_log_line

__all__ = ["LogTail", "RequestLogFollower"]


class LogTail:
    """Complete new lines of a growing, possibly rotated file (see the module docstring)."""

    def __init__(self, path: str, *, from_start: bool = False) -> None:
        self.path = path
        self._fh = None
        self._inode: Optional[int] = None
        self._pos = 0
        self._partial = b""
        self.rotations = 0
        self._open(at_end=not from_start)

    def _open(self, *, at_end: bool) -> bool:
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return False
        st = os.fstat(fh.fileno())
        self._fh, self._inode = fh, st.st_ino
        self._pos = st.st_size if at_end else 0
        self._partial = b""
        return True

    def _drain(self) -> list[bytes]:
        self._fh.seek(self._pos)
        data = self._fh.read()
        self._pos += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        return chunks

    def read(self) -> list[str]:
        """Lines completed since the last call (a rotated file's tail included)."""
        if self._fh is None:
            if not self._open(at_end=False):  # created after we started: all of it is new
                return []
        lines = self._drain()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None  # moved away, the new one not there yet: keep reading the old one
        if st is not None and st.st_ino != self._inode:
            if self._partial:
                lines.append(self._partial)
            self._fh.close()
            self.rotations += 1
            self._open(at_end=False)
            lines += self._drain()
        elif st is not None and st.st_size < self._pos:  # truncated in place
            self.rotations += 1
            self._pos, self._partial = 0, b""
            lines += self._drain()
        return [ln.decode("utf-8", "replace").rstrip("\r") for ln in lines if ln.strip()]

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class RequestLogFollower:
    """Turns new request-log lines into ``(row, tokens)`` for the collector; bad lines into dead letters."""

    path: str
    workload: Callable[[str], Any]
    redact: bool = False
    finished: int = 0
    skipped: int = 0
    dead: list[tuple[str, str]] = field(default_factory=list)  # (reason, raw) since the last take
    _tail: Optional[LogTail] = None

    def __post_init__(self) -> None:
        self._tail = LogTail(self.path)

    def poll(self) -> list[tuple[dict, Any]]:
        out = []
        for raw in self._tail.read():
            try:
                entry = parse_log_line(raw)
                if entry is None:
                    self.skipped += 1
                    continue
                out.append(finished_rows(entry["body"], rid=entry["rid"], workload=self.workload, api="log",
                                         sampling=entry["sampling"], prompt=entry["prompt"], redact=self.redact))
                self.finished += 1
            except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
                self.dead.append((str(exc), raw))
        return out

    @property
    def rotations(self) -> int:
        return self._tail.rotations

    def close(self) -> None:
        self._tail.close()
