"""High-water marks over ``forward_ct``: what is new, and what was lost.

A pure state machine, fed one decoded ``/server_info`` at a time.  Each DP rank
keeps the last ``forward_ct`` written.  A poll keeps only records above it.
When the deque no longer holds the mark, records between the mark and the
oldest survivor are reported lost: to our own clear (``clear``) or to the
server's bounded deque wrapping before we polled (``deque_wrap``).  A new
``startup_time`` or a ``forward_ct`` going backwards is a restart: a new
segment begins, and the unread tail of the old one is reported
(``server_restart``, ``last_missing_forward_ct = -1``: its length is unknown).
Ranges are upper bounds: prefill batches also advance ``forward_ct``.  To tell
a lost decode step from a prefill, the oldest surviving record is consulted:
``step_cpu_ms`` is set only when the forward before it was a decode step, so a
jump followed by a record *with* ``step_cpu_ms`` certainly lost records.  A
jump followed by one without it is reported only after our own clear or when
the server does not send ``step_cpu_ms`` at all (then every jump is reported),
or when the deque's head moved since the last poll without a clear: a deque
only loses its oldest records by wrapping, so that loss is certain.  Nor can a
deque wrap without being full, so a jump seen in a full deque (``capacity``
records: SGLang's fixed ``INFO_DUMP_MAX_RECORDS``) is reported too.
A rank first seen with an empty deque (at the poll or at ``note_start``) is
followed from ``forward_ct`` 0.

A restart is recognised only from evidence one odd record cannot fake: a new
``startup_time`` together with counters that start again (the deque's oldest
record at or below the mark, or an empty deque), or the same new
``startup_time`` in two bodies running; without a new
``startup_time``, a rank whose records *all* lie below the mark, at least two
of them.  A body that shows neither is consumed as usual (its old records are
below the mark anyway).  A ``startup_time`` seen before coming back after a
restart means two servers answer behind one URL: the cursor stays with the
current one, ignores the other's bodies and says so once (``PollDelta.note``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from collectors.sglang.decode import ServerInfoPayload, SglangRecord


@dataclass
class Gap:
    dp_rank: int
    first_missing_forward_ct: int
    last_missing_forward_ct: int
    reason: str
    segment: int


@dataclass
class RankCursor:
    high_water: int = 0
    cleared: bool = False  # we cleared since the last records were read
    seen_empty: bool = False  # the deque was empty when first seen: nothing predates us
    oldest: Optional[int] = None  # oldest forward_ct in the deque at the last non-empty poll


@dataclass
class PollDelta:
    """New records per rank (oldest first) and the gaps noticed by this poll."""

    new: dict[int, list[SglangRecord]] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    restarted: bool = False
    note: str = ""  # something the collector should report once (two servers behind one URL)


# SGLang's dspark_observability.INFO_DUMP_MAX_RECORDS: the record deque's fixed maxlen.
DEQUE_CAPACITY = 200_000


class ForwardCursor:
    def __init__(self, capacity: int = DEQUE_CAPACITY) -> None:
        self.capacity = capacity
        self.segment = 0
        self.startup_time: Optional[float] = None
        self.ranks: dict[int, RankCursor] = {}
        self._pending_startup: Optional[float] = None  # a new startup_time seen once, not yet confirmed
        self._former_startups: set[float] = set()  # servers we moved on from
        self.other_servers: set[float] = set()  # startup_times of servers answering beside ours

    def note_start(self, info: ServerInfoPayload) -> None:
        """Take the body read when the run starts as the baseline, consuming nothing.

        A rank whose deque is empty then is followed from ``forward_ct`` 0, so a
        wrap before the first poll is still reported; records already there are
        read by the first poll as usual.
        """
        if info.startup_time is not None:
            self.startup_time = info.startup_time
        for rank in info.ranks:
            if not rank.records and rank.dp_rank not in self.ranks:
                self.ranks[rank.dp_rank] = RankCursor(seen_empty=True)

    def note_cleared(self) -> None:
        """Call after a successful clear request."""
        for cursor in self.ranks.values():
            cursor.cleared = True

    def _went_back(self, info: ServerInfoPayload, *, min_records: int) -> bool:
        """Every rank we follow shows counters below its mark (or an empty deque), one at least records."""
        seen = False
        for rank in info.ranks:
            cur = self.ranks.get(rank.dp_rank)
            if cur is None or cur.high_water == 0:
                continue
            if rank.records:
                if rank.records[-1].forward_ct >= cur.high_water or len(rank.records) < min_records:
                    return False
                seen = True
        return seen or (min_records == 0 and all(not r.records for r in info.ranks))

    def _counter_reset(self, info: ServerInfoPayload) -> bool:
        """With a new startup_time: every deque empty, or a followed rank's oldest record at or below its mark."""
        if all(not r.records for r in info.ranks):
            return True
        for rank in info.ranks:
            cur = self.ranks.get(rank.dp_rank)
            if cur is not None and rank.records and rank.records[0].forward_ct <= cur.high_water:
                return True
        return False

    def _restart_confirmed(self, info: ServerInfoPayload, delta: PollDelta) -> Optional[bool]:
        """True: a restart; False: none; None: ignore this body (another server, or unconfirmed)."""
        new_time = info.startup_time
        if self.startup_time is None or new_time is None or new_time == self.startup_time:
            self._pending_startup = None
            return self._went_back(info, min_records=2)
        if new_time in self._former_startups or new_time in self.other_servers:
            if new_time not in self.other_servers:
                self.other_servers.add(new_time)
                delta.note = (f"two servers answer behind one URL: startup_time {self.startup_time} and {new_time} "
                              "alternate; following the first, ignoring the other's bodies — give each its own "
                              "collector and --url")
            return None
        if self._counter_reset(info) or self._pending_startup == new_time:
            return True
        self._pending_startup = new_time  # one body only: wait for a second before believing it
        return None

    def advance(self, info: ServerInfoPayload) -> PollDelta:
        delta = PollDelta()
        restarted = self._restart_confirmed(info, delta)
        if restarted is None:
            return delta
        if restarted:
            if self.startup_time is not None:
                self._former_startups.add(self.startup_time)
            self._pending_startup = None
            self.segment += 1
            for dp_rank, cur in sorted(self.ranks.items()):
                delta.gaps.append(Gap(dp_rank, cur.high_water + 1, -1, "server_restart", self.segment))
            self.ranks = {}
            delta.restarted = True
        if info.startup_time is not None and (restarted or self.startup_time is None):
            self.startup_time = info.startup_time

        for rank in info.ranks:
            fresh_rank = rank.dp_rank not in self.ranks
            cur = self.ranks.setdefault(rank.dp_rank, RankCursor())
            records = rank.records
            if not records:
                cur.seen_empty = cur.seen_empty or fresh_rank or delta.restarted
                continue
            oldest = records[0]
            following = cur.high_water > 0 or cur.seen_empty
            head_moved = cur.oldest is not None and oldest.forward_ct > cur.oldest
            cur.oldest = oldest.forward_ct
            if following and oldest.forward_ct > cur.high_water + 1:
                timed = "step_cpu_time" in rank.components
                after_decode = oldest.step_cpu_ms is not None
                full = len(records) + len(rank.dead) >= self.capacity
                if cur.cleared or after_decode or not timed or head_moved or full:
                    reason = "clear" if cur.cleared else "deque_wrap"
                    delta.gaps.append(Gap(rank.dp_rank, cur.high_water + 1, oldest.forward_ct - 1,
                                          reason, self.segment))
            fresh = [r for r in records if r.forward_ct > cur.high_water]
            if fresh:
                delta.new[rank.dp_rank] = fresh
                cur.high_water = fresh[-1].forward_ct
                cur.cleared = False
        return delta
