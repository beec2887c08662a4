"""One collection run: poll ``/server_info``, optionally drive traffic, write.

``Collector.run()`` ties the pieces together: a ``runs`` row from the first
``/server_info``, a poll loop reading by high-water mark (``ForwardCursor``)
that clears the server's deque only when it grows past ``clear_at`` records,
an optional traffic driver, and a ``BufferedWriter``.  It returns a summary and
records on the run why it ended (``end_reason``).

Nothing the server sends can crash the loop: an unusable body, a record that
breaks the contract or does not fit the store, a failed request — each becomes
a ``dead_letters`` row with the reason, counted in the summary.  Rows the
writer cannot take because it fell behind are counted and their forward_ct
range is written as a ``write_backlog`` gap; the poll loop never waits on disk.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

import httpx
import pyarrow as pa

from collectors.sglang.cursor import ForwardCursor, Gap
from collectors.sglang.decode import (PayloadError, decode_server_info, lists_skipped, records_to_tables_safe,
                                      server_args)
from collectors.sglang.driver import DriveSpec, PlannedRequest, drive
from collectors.sglang.metrics import SidecarMetrics
from collectors.sglang.writer import BufferedWriter
from dspark_obs import schema

DEBUG_DUMP_HINT = (
    "launch SGLang with SGLANG_DSPARK_DEBUG_DUMP=core,step_cpu_time,step_gpu_time,draft_gpu_time,"
    "target_verify_gpu_time,reqs (or all) and --speculative-algorithm DSPARK"
)
# Sources whose payloads may carry prompt or output text (dropped under --redact-text).
_TEXT_SOURCES = ("/generate", "/v1/", "request-log", "generate-file")


class CollectError(RuntimeError):
    """Collection cannot start or go on; the message says how to fix it."""


@dataclass
class CollectOptions:
    url: str
    run_id: str
    poll_interval: float = 1.0
    clear_at: int = 2000  # clear the server's deque once it holds this many records (0: never)
    flush_interval: float = 5.0
    duration: Optional[float] = None  # attach mode: stop after this many seconds
    drive: Optional[DriveSpec] = None
    # Replay these requests (in order) instead of drive's planned traffic; needs drive for
    # the concurrency and the endpoint (collectors.sglang.companion builds both).
    planned: Optional[list[PlannedRequest]] = None
    labels: dict[str, str] = field(default_factory=dict)
    companion_of: Optional[str] = None
    request_timeout: float = 600.0
    max_buffer_bytes: int = 256 << 20  # writer backlog before batches are dropped (and reported)
    redact_text: bool = False
    mode: Optional[str] = None  # launch mode: SGLANG_RAGGED_VERIFY_MODE given to the server
    source: Optional[str] = None  # runs.source override


@dataclass
class CollectSummary:
    run_id: str
    mode: str = ""
    gamma: int = 0
    dp_size: int = 0
    polls: int = 0
    poll_errors: int = 0
    steps: int = 0
    step_reqs: int = 0
    requests: int = 0
    failed_requests: int = 0
    tokens: int = 0
    gaps: int = 0
    lost_forward_cts: int = 0
    clears: int = 0
    dead_letters: int = 0
    rows_dropped: int = 0
    rows_failed: int = 0
    write_errors: list[str] = field(default_factory=list)
    end_reason: str = "completed"
    elapsed_s: float = 0.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _text(payload: bytes | str | None) -> Optional[str]:
    if payload is None:
        return None
    if isinstance(payload, bytes):
        return payload[:65536].decode("utf-8", "replace")
    return payload[:65536].encode("utf-8", "replace").decode("utf-8")


class Collector:
    def __init__(self, store, opts: CollectOptions,
                 progress: Callable[[str, int], None] = lambda kind, n: None,
                 metrics: Optional[SidecarMetrics] = None) -> None:
        self.store, self.opts = store, opts
        self.cursor = ForwardCursor()
        self.metrics = metrics or SidecarMetrics()
        self.writer = BufferedWriter(store, opts.run_id, flush_interval=opts.flush_interval,
                                     max_pending_bytes=opts.max_buffer_bytes,
                                     on_written=lambda t, n: self.metrics.rows_written.labels(t).inc(n))
        self.metrics.backlog_bytes.set_function(lambda: self.writer.pending_bytes)
        self.metrics.backlog_rows.set_function(lambda: self.writer.pending_rows)
        self.summary = CollectSummary(run_id=opts.run_id)
        self.progress = progress
        self._stop = asyncio.Event()
        self.stop_reason: Optional[str] = None

    def stop(self, reason: Optional[str] = None) -> None:
        """Ask the run to end (signal handlers call this; safe to call more than once)."""
        if self.stop_reason is None and reason:
            self.stop_reason = reason
        self._stop.set()

    # -- rows --------------------------------------------------------------------

    def _add(self, table: str, data: pa.Table) -> bool:
        ok = self.writer.add(table, data)
        (self.metrics.rows if ok else self.metrics.rows_dropped).labels(table).inc(data.num_rows)
        return ok

    def _dead_letter(self, source: str, reason: str, payload: bytes | str | None) -> None:
        self.summary.dead_letters += 1
        self.metrics.dead_letters.labels(source.split("?")[0][:64]).inc()
        if self.opts.redact_text and any(source.startswith(s) for s in _TEXT_SOURCES):
            payload = None
        self._add("dead_letters", pa.Table.from_pylist([{
            "received_at": _now(), "source": source, "reason": _text(reason)[:2000],
            "payload": _text(payload),
        }], schema=schema.schema_for("dead_letters")))

    def _gap(self, gap: Gap) -> None:
        self.summary.gaps += 1
        lost = 0
        if gap.last_missing_forward_ct >= gap.first_missing_forward_ct:
            lost = gap.last_missing_forward_ct - gap.first_missing_forward_ct + 1
            self.summary.lost_forward_cts += lost
        self.metrics.gaps.labels(gap.reason).inc()
        self.metrics.lost.labels(gap.reason).inc(lost)
        self._add("gaps", pa.Table.from_pylist([{
            "dp_rank": gap.dp_rank, "first_missing_forward_ct": gap.first_missing_forward_ct,
            "last_missing_forward_ct": gap.last_missing_forward_ct, "reason": gap.reason,
            "segment": gap.segment, "detected_at": _now()}], schema=schema.schema_for("gaps")))

    # -- the run row -------------------------------------------------------------

    async def _start_run(self, client: httpx.AsyncClient) -> None:
        try:
            resp = await client.get("/server_info")
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise CollectError(f"cannot read {self.opts.url}/server_info: {exc}. Is the server up "
                               "(GET /health) and is --url right?") from exc
        body = resp.content
        try:
            info = decode_server_info(body)
            args = server_args(body)
        except PayloadError as exc:
            raise CollectError(f"{self.opts.url}/server_info is not an SGLang server_info body: {exc}") from exc
        if not info.has_dspark:
            raise CollectError(f"{self.opts.url} exposes no dspark_info_record: {DEBUG_DUMP_HINT}")
        first = next(r for r in info.ranks if r.gamma or r.mode)
        self.cursor.note_start(info)
        capacity = args.get("emulator_max_records")
        if isinstance(capacity, int) and capacity > 0:
            self.cursor.capacity = capacity
        env = args.get("env") if isinstance(args.get("env"), dict) else {}
        payload_mode = first.mode or env.get("SGLANG_RAGGED_VERIFY_MODE", "")
        self.summary.mode = self.opts.mode or payload_mode
        self.summary.gamma = first.gamma
        self.summary.dp_size = len(info.ranks)
        labels = dict(self.opts.labels)
        if self.opts.mode and payload_mode and payload_mode != self.opts.mode:
            labels["payload_mode"] = payload_mode
        seed = args.get("random_seed")
        if self.opts.drive:
            labels.setdefault("workloads", ",".join(self.opts.drive.workloads))
            labels.setdefault("temperature", str(self.opts.drive.temperature))
            labels.setdefault("concurrency", str(self.opts.drive.concurrency))
            labels.setdefault("api", self.opts.drive.api)
            if self.opts.drive.model is None:
                model = args.get("served_model_name") or args.get("model_path")
                self.opts.drive.model = model if isinstance(model, str) else "default"
        if self.opts.redact_text:
            labels["redact_text"] = "true"
        self.metrics.on_run(run_id=self.opts.run_id, mode=self.summary.mode, gamma=self.summary.gamma,
                            dp_size=self.summary.dp_size, server_url=self.opts.url)
        source = self.opts.source or ("emulator" if args.get("emulator") else "sglang")
        self.store.upsert_run(
            self.opts.run_id, started_at=_now(), source=source,
            server_url=self.opts.url, mode=self.summary.mode, gamma=self.summary.gamma,
            dp_size=self.summary.dp_size, labels=labels, companion_of=self.opts.companion_of,
            seed=seed if isinstance(seed, int) and abs(seed) < 2**63 else None,
            server_version=info.version if isinstance(info.version, str) else None,
            startup_time=info.startup_time, server_info=json.dumps(args, default=str)[:1_000_000],
        )
        # The first body is a poll too: an empty deque now means nothing predates us,
        # so a wrap before the next poll is reported from forward_ct 1 on.
        self.summary.polls += 1
        self.metrics.on_poll(0.0)
        await self._process(info)

    # -- polling -----------------------------------------------------------------

    async def poll_once(self, client: httpx.AsyncClient) -> None:
        """One poll; never raises for anything the server sends."""
        t0 = time.monotonic()
        try:
            resp = await client.get("/server_info")
            resp.raise_for_status()
            body = resp.content
        except (httpx.HTTPError, OSError) as exc:
            self.summary.poll_errors += 1
            self.metrics.poll_errors.inc()
            self._dead_letter("/server_info", f"poll failed: {type(exc).__name__}: {exc}", None)
            return
        read_through = {dp: cur.high_water for dp, cur in self.cursor.ranks.items() if cur.high_water > 0}
        try:
            info = await asyncio.to_thread(decode_server_info, body, read_through)
        except PayloadError as exc:
            self.summary.poll_errors += 1
            self.metrics.poll_errors.inc()
            self._dead_letter("/server_info", str(exc), body)
            return
        self.summary.polls += 1
        self.metrics.on_poll(time.monotonic() - t0)
        await self._process(info, body)
        held = max((len(r.records) + len(r.dead) for r in info.ranks), default=0)
        if self.opts.clear_at and held >= self.opts.clear_at:
            await self._clear(client)

    async def _process(self, info, body: Optional[bytes] = None) -> None:
        """Advance the cursor over one decoded body and queue its new rows, gaps and dead letters."""
        delta = self.cursor.advance(info)
        if body is not None and any(lists_skipped(r) for recs in delta.new.values() for r in recs):
            # a restart made already-read forward_cts new again: read the body in full
            info = await asyncio.to_thread(decode_server_info, body)
            by_rank = {rank.dp_rank: rank for rank in info.ranks}
            for dp_rank, recs in delta.new.items():
                wanted = {r.forward_ct for r in recs}
                delta.new[dp_rank] = [r for r in by_rank[dp_rank].records if r.forward_ct in wanted]
        for rank in info.ranks:
            for reason, raw in rank.dead:
                self._dead_letter("/server_info", reason, raw)
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
                self._dead_letter("/server_info", reason, raw)
            if self.writer.add_group([("steps", steps), ("step_reqs", reqs)]):
                self.metrics.rows.labels("steps").inc(steps.num_rows)
                self.metrics.rows.labels("step_reqs").inc(reqs.num_rows)
                self.summary.steps += steps.num_rows
                self.summary.step_reqs += reqs.num_rows
                self.metrics.on_step_reqs(reqs)
                self.progress("steps", steps.num_rows)
            elif steps.num_rows:
                self.metrics.rows_dropped.labels("steps").inc(steps.num_rows)
                self.metrics.rows_dropped.labels("step_reqs").inc(reqs.num_rows)
                fcts = steps.column("forward_ct")
                self._gap(Gap(dp_rank, fcts[0].as_py(), fcts[-1].as_py(), "write_backlog", self.cursor.segment))
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

    async def _clear(self, client: httpx.AsyncClient) -> None:
        try:
            resp = await client.post("/set_internal_state",
                                     json={"server_args": {"dspark_clear_info_records": True}})
            resp.raise_for_status()
            body = resp.json()
            if isinstance(body, dict) and body.get("updated"):
                self.cursor.note_cleared()
                self.summary.clears += 1
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self._dead_letter("/set_internal_state", f"clear failed: {exc}", None)

    async def _poll_loop(self, client: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            try:
                await self.poll_once(client)
            except Exception as exc:  # a bug of ours must not end collection silently either
                self._dead_letter("collector", f"poll raised {type(exc).__name__}: {exc}", None)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.opts.poll_interval)
            except asyncio.TimeoutError:
                pass

    # -- traffic -----------------------------------------------------------------

    def _on_result(self, row: dict[str, Any], tokens: pa.Table) -> None:
        self._add("requests", pa.Table.from_pylist([row], schema=schema.schema_for("requests")))
        self._add("tokens", tokens)
        self.summary.requests += 1
        self.summary.tokens += tokens.num_rows
        self.progress("requests", 1)

    # -- the run -----------------------------------------------------------------

    async def run(self, *, server_exit: Optional[asyncio.Future] = None,
                  before_close: Optional[Callable[[], Awaitable[Optional[dict]]]] = None) -> CollectSummary:
        """Collect until the traffic is done, the duration passes, ``stop()`` or the server exits.

        ``server_exit`` (launch mode) resolves to the child's exit code;
        ``before_close`` runs after the last poll and before the final flush
        (launch mode stops the child there) and may return labels for the run.
        """
        t0 = time.monotonic()
        limits = httpx.Limits(max_connections=(self.opts.drive.concurrency if self.opts.drive else 1) + 4)
        extra_labels: dict = {}
        try:
            async with httpx.AsyncClient(base_url=self.opts.url, timeout=self.opts.request_timeout,
                                         limits=limits) as client:
                await self._start_run(client)
                poller = asyncio.create_task(self._poll_loop(client))
                if self.opts.drive is not None:
                    main = asyncio.create_task(drive(
                        client, self.opts.drive, self._on_result,
                        on_error=lambda req, msg: self._dead_letter(self.opts.drive.endpoint, msg, req.rid),
                        planned=self.opts.planned))
                elif self.opts.duration is not None:
                    main = asyncio.create_task(asyncio.sleep(self.opts.duration))
                else:
                    main = asyncio.create_task(self._stop.wait())
                stopper = asyncio.create_task(self._stop.wait())
                waiters = {main, stopper} | ({server_exit} if server_exit is not None else set())
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    self.stop("cancelled")
                server_dead = server_exit is not None and server_exit.done()
                if server_dead:
                    self.summary.end_reason = f"server_exited: code {server_exit.result()}"
                elif self.stop_reason is not None or (self._stop.is_set() and not main.done()):
                    self.summary.end_reason = f"interrupted: {self.stop_reason or 'stop requested'}"
                elif self.opts.drive is None and self.opts.duration is None:
                    self.summary.end_reason = "interrupted: stop requested"
                if main.done() and not main.cancelled() and self.opts.drive is not None:
                    exc = main.exception()
                    if exc is None:
                        self.summary.failed_requests = main.result().failed
                    else:
                        self.summary.end_reason = f"error: traffic driver: {exc}"
                for task in (main, stopper):
                    if not task.done():
                        task.cancel()
                self._stop.set()
                await poller
                if not server_dead:
                    await self.poll_once(client)  # dump() drains the last pending step
                    self._report_trailing_clears()
                if before_close is not None:
                    extra_labels = await before_close() or {}
        except CollectError:
            self.writer.close()
            raise
        except Exception as exc:
            self.summary.end_reason = f"error: {type(exc).__name__}: {exc}"
            if before_close is not None:
                extra_labels = await before_close() or {}
        self.writer.close()
        self.summary.rows_dropped = self.writer.rows_dropped
        self.summary.rows_failed = self.writer.rows_failed
        self.summary.write_errors = list(self.writer.errors)
        self.summary.elapsed_s = time.monotonic() - t0
        fields: dict[str, Any] = {"ended_at": _now(), "end_reason": self.summary.end_reason}
        if extra_labels:
            current = self.store.read("runs", self.opts.run_id).to_pylist()
            labels = dict(current[-1]["labels"] or []) if current else {}
            labels.update({k: str(v) for k, v in extra_labels.items()})
            fields["labels"] = labels
        try:
            self.store.upsert_run(self.opts.run_id, **fields)
        except Exception as exc:
            self.summary.write_errors.append(f"runs: {exc}")
        return self.summary


def collect(store, opts: CollectOptions,
            progress: Callable[[str, int], None] = lambda kind, n: None) -> CollectSummary:
    """Run a collection to completion (blocking)."""
    return asyncio.run(Collector(store, opts, progress).run())
