"""Buffered, non-blocking writes to the store.

The poll loop hands Arrow tables to ``BufferedWriter.add`` and never waits on
disk: a background thread commits a file per table every ``flush_interval``
seconds (and on ``close``).  If the thread falls behind by more than
``max_pending_rows``, new batches are dropped and counted, so a slow disk shows
up as a reported loss instead of a stalled collector.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Optional

import pyarrow as pa

from dspark_obs.store import Store


class BufferedWriter:
    def __init__(self, store: Store, run_id: str, *, flush_interval: float = 5.0,
                 max_pending_rows: int = 5_000_000) -> None:
        self.store, self.run_id = store, run_id
        self.flush_interval = flush_interval
        self.max_pending_rows = max_pending_rows
        self._buffers: dict[str, list[pa.Table]] = defaultdict(list)
        self._pending_rows = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self.rows_written: dict[str, int] = defaultdict(int)
        self.rows_dropped = 0
        self.files_written = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="dspark-obs-writer", daemon=True)
        self._thread.start()

    def add(self, table: str, data: pa.Table) -> bool:
        """Queue rows; False (and counted) when the writer is too far behind."""
        if data.num_rows == 0:
            return True
        with self._lock:
            if self._pending_rows + data.num_rows > self.max_pending_rows:
                self.rows_dropped += data.num_rows
                return False
            self._buffers[table].append(data)
            self._pending_rows += data.num_rows
        return True

    def flush(self) -> None:
        """Commit everything buffered so far (called by the thread and by close)."""
        with self._lock:
            buffers, self._buffers = self._buffers, defaultdict(list)
            self._pending_rows = 0
        for table, parts in buffers.items():
            data = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
            try:
                if self.store.write(table, self.run_id, data) is not None:
                    self.files_written += 1
                self.rows_written[table] += data.num_rows
            except Exception as exc:  # a failing disk must not kill collection
                self.errors.append(f"{table}: {exc}")

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval
        while not self._closed:
            self._wake.wait(timeout=max(0.0, next_flush - time.monotonic()))
            self._wake.clear()
            if time.monotonic() >= next_flush:
                self.flush()
                next_flush = time.monotonic() + self.flush_interval

    def close(self, timeout: Optional[float] = 60.0) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=timeout)
        self.flush()
