"""Buffered, non-blocking writes to the store.

The poll loop hands Arrow tables to ``BufferedWriter.add`` (or several that
belong together to ``add_group``) and never waits on disk: a background thread
commits one file per table every ``flush_interval`` seconds (and on
``close``).  Memory is bounded by ``max_pending_bytes``: when the thread falls
behind, new batches are refused and counted per table (``rows_dropped``), so a
slow disk shows up as a reported loss instead of a stalled collector — the
caller records the refused range as a ``write_backlog`` gap.  ``gaps`` rows
are never refused: they are how a loss is reported.

A batch that fails to commit with an I/O error stays buffered and is retried
at the next flush (its bytes keep counting against the budget); one that can
never be written (it does not fit the schema) is dropped and counted in
``rows_failed`` with the error.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Callable, Optional, Protocol

import pyarrow as pa

ALWAYS_ACCEPTED = frozenset({"gaps"})


class Sink(Protocol):
    def write(self, table: str, run_id: str, rows: pa.Table) -> object: ...


class BufferedWriter:
    def __init__(self, store: Sink, run_id: str, *, flush_interval: float = 5.0,
                 max_pending_bytes: int = 256 << 20,
                 on_written: Callable[[str, int], None] = lambda table, rows: None) -> None:
        self.store, self.run_id = store, run_id
        self.flush_interval = flush_interval
        self.max_pending_bytes = max_pending_bytes
        self.on_written = on_written
        self._buffers: dict[str, list[pa.Table]] = defaultdict(list)
        self._pending_bytes = 0
        self._pending_rows = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self.rows_written: dict[str, int] = defaultdict(int)
        self.dropped: dict[str, int] = defaultdict(int)
        self.failed: dict[str, int] = defaultdict(int)  # per table: rows that could not be committed
        self.files_written = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="dspark-obs-writer", daemon=True)
        self._thread.start()

    # -- the poll loop's side: never blocks on I/O ---------------------------

    @property
    def rows_dropped(self) -> int:
        return sum(self.dropped.values())

    @property
    def rows_failed(self) -> int:
        return sum(self.failed.values())

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def pending_rows(self) -> int:
        return self._pending_rows

    def add(self, table: str, data: pa.Table) -> bool:
        """Queue rows; False (and counted in ``dropped``) when the writer is too far behind."""
        return self.add_group([(table, data)])

    def add_group(self, parts: list[tuple[str, pa.Table]]) -> bool:
        """Queue tables that belong together (a step and its requests): all or none."""
        parts = [(t, d) for t, d in parts if d.num_rows]
        if not parts:
            return True
        size = sum(d.nbytes for _, d in parts)
        rows = sum(d.num_rows for _, d in parts)
        forced = all(t in ALWAYS_ACCEPTED for t, _ in parts)
        with self._lock:
            if not forced and self._pending_bytes + size > self.max_pending_bytes:
                for t, d in parts:
                    self.dropped[t] += d.num_rows
                return False
            for t, d in parts:
                self._buffers[t].append(d)
            self._pending_bytes += size
            self._pending_rows += rows
        return True

    # -- the writer thread's side --------------------------------------------

    def flush(self) -> None:
        """Commit everything buffered so far (called by the thread and by close)."""
        with self._flush_lock:
            with self._lock:
                buffers, self._buffers = self._buffers, defaultdict(list)
            for table, parts in buffers.items():
                size = sum(p.nbytes for p in parts)
                rows = sum(p.num_rows for p in parts)
                try:
                    data = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
                    if self.store.write(table, self.run_id, data) is not None:
                        self.files_written += 1
                except (ValueError, TypeError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                    self.failed[table] += rows  # can never be written: do not retry forever
                    with self._lock:
                        self._pending_bytes -= size
                        self._pending_rows -= rows
                    self.errors.append(f"{table}: {rows} rows cannot be written: {exc}")
                    continue
                except Exception as exc:  # I/O: keep the rows and retry at the next flush
                    self.errors.append(f"{table}: write failed, will retry: {exc}")
                    with self._lock:
                        self._buffers[table][:0] = parts
                    continue
                with self._lock:
                    self._pending_bytes -= size
                    self._pending_rows -= rows
                self.rows_written[table] += rows
                self.on_written(table, rows)

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval
        while not self._closed:
            self._wake.wait(timeout=max(0.0, next_flush - time.monotonic()))
            self._wake.clear()
            if self._closed:
                break
            if time.monotonic() >= next_flush:
                self.flush()
                # Fixed rate: a slow commit does not push the next one back.
                next_flush = max(next_flush + self.flush_interval, time.monotonic())

    def close(self, timeout: Optional[float] = 60.0) -> None:
        """Stop the thread and commit what is left; rows that still fail are counted as failed."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=timeout)
        self.flush()
        with self._lock:
            left = {t: sum(d.num_rows for d in parts) for t, parts in self._buffers.items()}
            self._buffers.clear()
            self._pending_bytes = self._pending_rows = 0
        for table, n in left.items():
            if n:
                self.failed[table] += n
                self.errors.append(f"{table}: {n} rows could not be written before exit")
