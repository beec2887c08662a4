"""The poll side of a collection run: read ``/server_info``, clear, decode, validate, hand rows on.

Why a module of its own: this is the part that talks to a server that may be
slow, down, restarted, two servers at once, or sending records that are
wrong — each case has a rule (see ``collectors.sglang.session`` for the
whole and ``collectors.sglang.cursor`` / ``validate`` / ``losses`` for the
pieces).  :class:`PollingMixin` is mixed into ``Collector``; it uses the
collector's store-facing helpers (``_add``, ``_gap``, ``_dead_letter``...).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

import httpx
import msgspec
import pyarrow.compute as pc

from collectors.sglang import validate
from collectors.sglang.cursor import Gap, RankCursor
from collectors.sglang.decode import (
    PayloadError, ServerInfoPayload, decode_server_info, lists_skipped, records_to_tables_safe, server_args)

DEBUG_DUMP_HINT = (
    "launch SGLang with SGLANG_DSPARK_DEBUG_DUMP=core,step_cpu_time,step_gpu_time,draft_gpu_time,"
    "target_verify_gpu_time,reqs (or all) and --speculative-algorithm DSPARK"
)


def first_server_info(url: str, body: bytes, error: type[Exception], *,
                      hint: str = "") -> tuple[ServerInfoPayload, dict[str, Any]]:
    """A run's first ``/server_info`` body: its records and server args, refused with ``error`` (the
    caller's own) when it is not an SGLang body or has no DSpark records (``hint``: what else to set)."""
    try:
        info = decode_server_info(body)
        args = server_args(body)
    except PayloadError as exc:
        raise error(f"{url}/server_info is not an SGLang server_info body: {exc}") from exc
    if not info.has_dspark:
        raise error(f"{url} exposes no dspark_info_record: {DEBUG_DUMP_HINT}{hint}")
    return info, args


class PollingMixin:
    """Polling methods of ``Collector`` (state lives on the collector)."""

    def _resume_cursor(self, info) -> None:
        """A resumed run goes on after what the store holds: its segment and high-water marks."""
        point = self.resumed
        self.cursor.segment = point.segment
        if point.startup_time is not None:
            self.cursor.startup_time = point.startup_time
        for dp_rank in point.high_water.keys() | point.reqs_high_water.keys():
            # re-read from the lower mark; rows a table already holds are dropped in _process
            marks = [m[dp_rank] for m in (point.high_water, point.reqs_high_water) if dp_rank in m]
            self.cursor.ranks[dp_rank] = RankCursor(high_water=min(marks))
        self.accounting.stored.update(point.request_steps)
        for rid, n in point.verify_ct.items():
            self.accounting.finished(rid, n)  # requests an earlier attempt finished are checked too

    def _not_yet_stored(self, dp_rank: int, steps, reqs):
        """On a resumed run, drop the re-read rows a table already holds (its mark is above the cursor's)."""
        point = self.resumed
        if point is None or self.cursor.segment != point.segment:
            return steps, reqs

        for name, marks in (("steps", point.high_water), ("reqs", point.reqs_high_water)):
            mark = marks.get(dp_rank)
            table = steps if name == "steps" else reqs
            if mark is not None and table.num_rows:
                table = table.filter(pc.greater(table.column("forward_ct"), mark))
                steps, reqs = (table, reqs) if name == "steps" else (steps, table)
        return steps, reqs

    # -- polling -----------------------------------------------------------------

    def _poll_failed(self, error: str, payload: Optional[bytes], *, timeout: bool) -> None:
        self.summary.poll_errors += 1
        self.metrics.poll_errors.inc()
        if self.outage.failed(error, timeout=timeout):  # once per outage, not every poll
            self._dead_letter("/server_info", error, payload)

    def _close_outage(self) -> None:
        fields = self.outage.close()
        if fields is not None:
            self._period_gap(fields.pop("reason"), **fields)

    async def _get_server_info(self, client: httpx.AsyncClient, timeout: float, abandon_on_stop: bool):
        """The GET, given up (None) when a stop arrives first: nothing was consumed yet."""
        t0 = time.monotonic()
        get = asyncio.ensure_future(client.get("/server_info", timeout=timeout))
        get.add_done_callback(lambda done: self._served(time.monotonic() - t0)
                              if not done.cancelled() and done.exception() is None else None)
        if not abandon_on_stop:
            return await get
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({get, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not get.done():
            get.cancel()
            await asyncio.gather(get, return_exceptions=True)
            waited = time.monotonic() - t0
            if waited >= 1.0:  # the server was not answering when the stop came: that is a stall too
                self._poll_failed(f"poll abandoned at stop after {waited:.1f} s without an answer", None,
                                  timeout=True)
            return None
        return get.result()

    async def poll_once(self, client: httpx.AsyncClient, *, timeout: Optional[float] = None,
                        abandon_on_stop: bool = False) -> None:
        """One poll, at most ``timeout`` (default ``poll_timeout``) s; never raises for anything the server sends.

        A clear that is due (the last body held ``clear_at`` records or more, or
        this one does by a byte count) is sent as soon as the body has arrived,
        before it is decoded: what the server makes in between is lost to it.
        """
        t0 = time.monotonic()
        timeout = self.opts.poll_timeout if timeout is None else timeout
        try:
            resp = await self._get_server_info(client, timeout, abandon_on_stop)
            if resp is None:  # stopped while waiting on the server: the last poll reads what is left
                return
            resp.raise_for_status()
            body = resp.content
        except httpx.TimeoutException as exc:
            self._poll_failed(f"poll timed out after {timeout:g} s: {type(exc).__name__}", None, timeout=True)
            return
        except (httpx.HTTPError, OSError) as exc:
            self._poll_failed(f"poll failed: {type(exc).__name__}: {exc}", None, timeout=False)
            return
        cleared = False
        if self.opts.clear_at and (self._clear_due or body.count(b'"forward_ct"') >= self.opts.clear_at):
            cleared = await self._clear(client, timeout=timeout)
        read_through = {dp: cur.high_water for dp, cur in self.cursor.ranks.items() if cur.high_water > 0}
        recovered: list[tuple[str, bytes]] = []
        try:
            info = await asyncio.to_thread(decode_server_info, body, read_through)
        except PayloadError as exc:
            fixed, recovered = await asyncio.to_thread(validate.recover_body, body)
            try:
                if fixed is None:
                    raise exc
                info = await asyncio.to_thread(decode_server_info, fixed, read_through)
                body = fixed
            except PayloadError as exc2:
                self._poll_failed(str(exc2), body, timeout=False)
                return
        if not info.has_dspark:
            self._poll_failed("the body has no dspark_info_record: was the server restarted without "
                              f"records? {DEBUG_DUMP_HINT}", body[:4096], timeout=False)
            return
        for reason, raw in recovered:
            self._dead_letter_once(reason, raw)
        self._close_outage()
        self.summary.polls += 1
        self.metrics.on_poll(time.monotonic() - t0)
        await self._process(info, body)
        if cleared:
            self.cursor.note_cleared()
        held = max((len(r.records) + len(r.dead) for r in info.ranks), default=0)
        self._clear_due = bool(self.opts.clear_at) and not cleared and held >= self.opts.clear_at

    async def _process(self, info, body: Optional[bytes] = None) -> None:
        """Advance the cursor over one decoded body and queue its new rows, gaps and dead letters."""
        for rank in info.ranks:  # duplicates, out-of-order and absurd forward_cts never reach the cursor
            for reason, raw in validate.order_records(rank):
                self._dead_letter_once(reason, raw)
        delta = self.cursor.advance(info)
        if delta.note:
            self._dead_letter_once(delta.note, b"")
        if body is not None and any(lists_skipped(r) for recs in delta.new.values() for r in recs):
            # a restart made already-read forward_cts new again: read the body in full
            info = await asyncio.to_thread(decode_server_info, body)
            by_rank = {rank.dp_rank: rank for rank in info.ranks}
            for dp_rank, recs in delta.new.items():
                wanted = {r.forward_ct for r in recs}
                delta.new[dp_rank] = [r for r in by_rank[dp_rank].records if r.forward_ct in wanted]
        for rank in info.ranks:
            for reason, raw in rank.dead:
                self._dead_letter_once(reason, raw)
        for gap in delta.gaps:
            self._gap(gap)
        raws = {rank.dp_rank: rank for rank in info.ranks}
        for dp_rank, records in delta.new.items():
            rank = raws[dp_rank]
            offset = len(rank.records) - len(records)  # fresh records are the deque's tail
            steps, reqs, dead = await asyncio.to_thread(
                records_to_tables_safe, records, rank.raws[offset:] if rank.raws else None,
                dp_rank=dp_rank, segment=self.cursor.segment)
            for reason, raw in dead:
                self._dead_letter_once(reason, raw)
            steps, reqs = self._not_yet_stored(dp_rank, steps, reqs)
            steps, reqs, bad = validate.check_tables(steps, reqs, gamma=self.summary.gamma, mode=self._payload_mode)
            if bad:
                by_fct = {r.forward_ct: r for r in records}
                for fct, reasons in sorted(bad.items()):
                    rec = by_fct.get(fct)
                    raw = msgspec.json.encode(rec) if rec is not None else b""
                    self._dead_letter_once(f"dp_rank {dp_rank}: forward_ct {fct} is not a possible record for "
                                           f"gamma {self.summary.gamma}, mode {self._payload_mode or '?'}: "
                                           + "; ".join(reasons), raw)
            if self.writer.add_group([("steps", steps), ("step_reqs", reqs)]):
                self.accounting.add_steps(reqs.column("rid").to_pylist())
                self.metrics.rows.labels("steps").inc(steps.num_rows)
                self.metrics.rows.labels("step_reqs").inc(reqs.num_rows)
                self.summary.steps += steps.num_rows
                self.summary.step_reqs += reqs.num_rows
                self.metrics.on_batch(steps, reqs, gamma=self.summary.gamma or None)
                self.progress("steps", steps.num_rows)
            elif steps.num_rows:
                self.metrics.rows_dropped.labels("steps").inc(steps.num_rows)
                self.metrics.rows_dropped.labels("step_reqs").inc(reqs.num_rows)
                fcts = steps.column("forward_ct")
                self._gap(Gap(dp_rank, fcts[0].as_py(), fcts[-1].as_py(), "write_backlog", self.cursor.segment),
                          table_name="steps", rows_lost=steps.num_rows,
                          detail=f"{steps.num_rows} steps and {reqs.num_rows} step_reqs rows refused: the write "
                                 "backlog was full (--max-buffer-mb)")
        for rank in info.ranks:
            cur = self.cursor.ranks.get(rank.dp_rank)
            self.metrics.on_rank(rank.dp_rank, len(rank.records) + len(rank.dead), cur.high_water if cur else 0)

    def _report_trailing_clears(self) -> None:
        """A clear with no record after it may have dropped the server's pending step.

        A loss is normally seen when the next record arrives; a clear that was the
        last thing before the run ended has no next record, so say so: a ``clear``
        gap from the high-water mark with an unknown end (-1).
        """
        for dp_rank, cur in sorted(self.cursor.ranks.items()):
            if cur.cleared and cur.high_water > 0:
                self._gap(Gap(dp_rank, cur.high_water + 1, -1, "clear", self.cursor.segment))
                cur.cleared = False

    def _served(self, seconds: float) -> None:
        """Seconds the server spent answering one of our requests: the observation's own cost to it."""
        self.summary.observation_requests += 1
        self.summary.observation_server_s += seconds
        self.metrics.health.on_served(seconds)

    async def _clear(self, client: httpx.AsyncClient, *, timeout: Optional[float] = None) -> bool:
        """Ask the server to clear its deque; True when it did (the caller tells the cursor after decoding)."""
        try:
            t0 = time.monotonic()
            resp = await client.post("/set_internal_state", timeout=timeout or self.opts.poll_timeout,
                                     json={"server_args": {"dspark_clear_info_records": True}})
            self._served(time.monotonic() - t0)
            resp.raise_for_status()
            body = resp.json()
            if isinstance(body, dict) and body.get("updated"):
                self.summary.clears += 1
                return True
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self._dead_letter("/set_internal_state", f"clear failed: {type(exc).__name__}: {exc}", None)
        return False

    async def _poll_loop(self, client: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            try:
                await self.poll_once(client, abandon_on_stop=True)
            except Exception as exc:  # a bug of ours must not end collection silently either
                self._dead_letter("collector", f"poll raised {type(exc).__name__}: {exc}", None)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.opts.poll_interval)
            except asyncio.TimeoutError:
                pass
