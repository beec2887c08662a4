"""``collect``'s progress: requests sent and done, rows stored, gaps.

On a terminal a live bar; elsewhere (pipes, CI logs) one plain line every
``every_s`` seconds, so a driven run that takes minutes is never silent.  The
collector is read, never changed: ``summary.gaps`` and ``writer.rows_written``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional


class CollectProgress:
    """The ``on_progress`` callback of a :class:`collectors.sglang.session.Collector`, and its display.

    ``total_requests``/``concurrency`` are the driven run's (``None`` when only observing);
    requests sent are inferred from the closed loop: done + in flight, at most the total.
    """

    def __init__(self, run_id: str, *, total_requests: Optional[int], concurrency: int,
                 emit: Callable[[str], None], every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_id, self.total, self.concurrency = run_id, total_requests, concurrency
        self.emit, self.every_s, self.clock = emit, every_s, clock
        self.steps = self.done = 0
        self.collector: Any = None  # set once the Collector exists
        self.bar: Any = None  # (progress, task) on a terminal
        self._start = self._last = clock()

    @property
    def sent(self) -> int:
        return min(self.total, self.done + self.concurrency) if self.total else 0

    @property
    def rows_stored(self) -> int:
        writer = getattr(self.collector, "writer", None)
        return sum(writer.rows_written.values()) if writer is not None else 0

    @property
    def gaps(self) -> int:
        summary = getattr(self.collector, "summary", None)
        return summary.gaps if summary is not None else 0

    def line(self) -> str:
        parts = [f"requests {self.sent}/{self.total} sent, {self.done} done"] if self.total else []
        parts += [f"{self.steps} steps collected", f"{self.rows_stored} rows stored", f"{self.gaps} gaps"]
        return f"collecting {self.run_id}: {'; '.join(parts)}; {self.clock() - self._start:.0f}s"

    def __call__(self, kind: str, n: int) -> None:
        if kind == "steps":
            self.steps += n
        else:
            self.done += n
        if self.bar is not None:
            progress, task = self.bar
            progress.update(task, completed=self.done, steps=self.steps, rows=self.rows_stored, gaps=self.gaps)
        elif self.clock() - self._last >= self.every_s:
            self._last = self.clock()
            self.emit(self.line())
