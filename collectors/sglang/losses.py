"""Loss bookkeeping that is not a forward_ct range: outages, requests, dropped rows.

Why a module: the cursor (``collectors.sglang.cursor``) reports records lost
between two bodies it read; what it cannot see needs its own rows, or a loss
leaves no trace.  In one trial a 1–3 s server outage made 321 of 800 requests
fail and 65 finished requests had no steps (3,099 request-steps) while the run
said ``completed`` with no gap.  These pure helpers say what to report; the
collector writes the ``gaps`` rows:

* :class:`Outage` — consecutive failed polls are one ``poll_error`` row (or
  ``poll_stall`` when every failure was a timeout) with its duration and the
  number of failed polls, written when a poll succeeds again or the run ends.
* :class:`RequestAccounting` — stored request-steps per rid against each
  finished request's ``spec_verify_ct``: a mismatch is a
  ``request_steps_missing`` row with both numbers and the reasons of the
  run's forward_ct gaps (the likely cause) when there were any.
* :func:`dropped_rows` — rows of each table the writer refused (backlog) or
  could not commit (``write_failed``), one row per table with the count.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

__all__ = ["Outage", "RequestAccounting", "dropped_rows"]


@dataclass
class Outage:
    """Consecutive failed polls, as one period (times from an injectable monotonic clock)."""

    clock: Callable[[], float] = time.monotonic
    started: Optional[float] = None
    polls: int = 0
    timeouts: int = 0
    first_error: str = ""

    def failed(self, error: str, *, timeout: bool) -> bool:
        """Note a failed poll; True when it opens a new outage (dead-letter it then, not every poll)."""
        opened = self.started is None
        if opened:
            self.started, self.first_error = self.clock(), error
        self.polls += 1
        self.timeouts += int(timeout)
        return opened

    def close(self) -> Optional[dict]:
        """End the outage (a poll succeeded, or the run ends): the gap fields, or None if none was open."""
        if self.started is None:
            return None
        reason = "poll_stall" if self.timeouts == self.polls else "poll_error"
        fields = {"reason": reason, "duration_s": max(0.0, self.clock() - self.started),
                  "detail": f"{self.polls} failed polls ({self.timeouts} timed out); first: {self.first_error}"[:2000]}
        self.started, self.polls, self.timeouts, self.first_error = None, 0, 0, ""
        return fields


@dataclass
class RequestAccounting:
    """Stored request-steps per rid and the finished requests' ``spec_verify_ct``."""

    stored: Counter = field(default_factory=Counter)
    verify_ct: dict[str, int] = field(default_factory=dict)

    def add_steps(self, rids: Iterable[Optional[str]]) -> None:
        self.stored.update(r for r in rids if r is not None)

    def finished(self, rid: str, spec_verify_ct: Optional[int]) -> None:
        if spec_verify_ct is not None:
            self.verify_ct[rid] = int(spec_verify_ct)

    def mismatches(self, gap_reasons: Iterable[str] = ()) -> list[dict]:
        """One ``request_steps_missing`` gap's fields per finished request whose counts differ.

        ``rows_lost`` is ``spec_verify_ct - stored`` (negative when more steps
        were stored than the server counted: rows from another request under
        the same rid).
        """
        causes = sorted(set(gap_reasons) - {"request_failed", "request_steps_missing"})
        known = f"; the run's gaps: {', '.join(causes)}" if causes else "; no forward_ct gap explains it"
        out = []
        for rid, expected in sorted(self.verify_ct.items()):
            got = self.stored.get(rid, 0)
            if got != expected:
                out.append({"reason": "request_steps_missing", "rid": rid, "rows_lost": expected - got,
                            "detail": f"spec_verify_ct {expected}, stored request-steps {got}{known}"})
        return out


def dropped_rows(dropped: dict[str, int], failed: dict[str, int]) -> list[dict]:
    """One gap's fields per table with rows the writer dropped (backlog) or could not commit."""
    out = []
    for table, n in sorted(dropped.items()):
        if n:
            out.append({"reason": "write_backlog", "table_name": table, "rows_lost": int(n),
                        "detail": f"{n} {table} rows refused: the write backlog was full (--max-buffer-mb)"})
    for table, n in sorted(failed.items()):
        if n:
            out.append({"reason": "write_failed", "table_name": table, "rows_lost": int(n),
                        "detail": f"{n} {table} rows could not be committed (disk full or not writable)"})
    return out
