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

Every loss is a row of its own in ``gaps`` (see ``collectors.sglang.losses``):
an outage of ``/server_info`` is one ``poll_error`` (or ``poll_stall``, a poll
that timed out) row with its duration; a request the driver finally could not
send is a ``request_failed`` row; at the end of a run each finished request
whose ``spec_verify_ct`` differs from its stored request-steps is a
``request_steps_missing`` row; rows of any table the writer dropped are
``write_backlog`` / ``write_failed`` rows with the table and the count.

The deque is cleared right after a body arrives, before it is decoded, so the
records lost to a clear are only those the server made during one round trip.
Polling lives in ``collectors.sglang.polling``. Polls are bounded by ``poll_timeout``; a stop (SIGTERM) ends the run within
about ``flush_interval`` plus ``poll_timeout`` whatever the server does.
A new run starts after the records the server already holds (unless
``include_held``); an existing run is refused unless ``resume``
(``collectors.sglang.runlife``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

import httpx
import pyarrow as pa

from collectors.sglang import losses, runlife, validate
from collectors.sglang.cursor import ForwardCursor, Gap, RankCursor
from collectors.sglang.driver import DriveSpec, PlannedRequest, drive, plan_requests
from collectors.sglang.metrics import SidecarMetrics
from collectors.sglang.polling import PollingMixin, first_server_info
from collectors.sglang.request_log import RequestLogFollower
from collectors.sglang.writer import BufferedWriter
from collectors.workloads import WorkloadResolver
from dspark_obs import schema
from dspark_obs.health import ServerState

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
    poll_timeout: float = 10.0  # one /server_info poll (or clear) at most this long; then a poll_stall
    resume: bool = False  # continue an existing run (else it is refused)
    include_held: bool = False  # also store the records the server held before the run started
    keep_token_ids: bool = False  # with redact_text: still store the tokens table (ids, logprobs, top-k)
    request_log: Optional[str] = None  # follow SGLang's JSON request log for finished requests (attach mode)
    sweep_id: Optional[str] = None  # dspark-obs sweep: the sweep this run is a point of
    method: Optional[str] = None  # sweep: no-spec | fixed-window | compact | no-trim


@dataclass
class CollectSummary:
    run_id: str
    mode: str = ""
    gamma: int = 0
    dp_size: int = 0
    polls: int = 0
    poll_errors: int = 0
    observation_requests: int = 0  # polls and clears sent and timed
    observation_server_s: float = 0.0  # the server's time answering them (the observation's own cost)
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
    requests_missing_steps: int = 0
    open_gaps: int = 0  # forward_ct gaps whose end is unknown (last_missing_forward_ct = -1)
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


class Collector(PollingMixin):
    def __init__(self, store, opts: CollectOptions,
                 progress: Callable[[str, int], None] = lambda kind, n: None,
                 metrics: Optional[SidecarMetrics] = None) -> None:
        self.store, self.opts = store, opts
        self.cursor = ForwardCursor()
        self.metrics = metrics or SidecarMetrics(health=False)  # nobody can scrape a registry made here
        self.writer = BufferedWriter(store, opts.run_id, flush_interval=opts.flush_interval,
                                     max_pending_bytes=opts.max_buffer_bytes,
                                     on_written=lambda t, n: self.metrics.rows_written.labels(t).inc(n))
        self.metrics.backlog_bytes.set_function(lambda: self.writer.pending_bytes)
        self.metrics.backlog_rows.set_function(lambda: self.writer.pending_rows)
        self.summary = CollectSummary(run_id=opts.run_id)
        self.progress = progress
        self._stop = asyncio.Event()
        self.stop_reason: Optional[str] = None
        self.outage = losses.Outage()
        self.accounting = losses.RequestAccounting()
        self.resumed: Optional[runlife.ResumePoint] = None
        self._clear_due = False
        self._gap_reasons: set[str] = set()
        self._seen_dead = validate.SeenOnce()
        self._payload_mode = ""

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

    def _dead_letter_once(self, reason: str, payload: bytes) -> None:
        """A bad record still in the deque is seen at every poll: dead-letter it the first time only."""
        if self._seen_dead.first(reason, payload):
            self._dead_letter("/server_info", reason, payload)

    def _dead_letter(self, source: str, reason: str, payload: bytes | str | None) -> None:
        self.summary.dead_letters += 1
        self.metrics.dead_letters.labels(source.split("?")[0][:64]).inc()
        if self.opts.redact_text and any(source.startswith(s) for s in _TEXT_SOURCES):
            payload = None
        self._add("dead_letters", pa.Table.from_pylist([{
            "received_at": _now(), "source": source, "reason": _text(reason)[:2000],
            "payload": _text(payload),
        }], schema=schema.schema_for("dead_letters")))

    def _gap(self, gap: Gap, **extra: Any) -> None:
        """One ``gaps`` row; ``extra`` fills table_name, rows_lost, duration_s, rid, detail."""
        self.summary.gaps += 1
        self._gap_reasons.add(gap.reason)
        self.summary.open_gaps += int(gap.last_missing_forward_ct == -1)
        lost = 0
        if gap.last_missing_forward_ct >= gap.first_missing_forward_ct:
            lost = gap.last_missing_forward_ct - gap.first_missing_forward_ct + 1
            self.summary.lost_forward_cts += lost
        self.metrics.gaps.labels(gap.reason).inc()
        self.metrics.lost.labels(gap.reason).inc(lost)
        self._add("gaps", pa.Table.from_pylist([{
            "dp_rank": gap.dp_rank, "first_missing_forward_ct": gap.first_missing_forward_ct,
            "last_missing_forward_ct": gap.last_missing_forward_ct, "reason": gap.reason,
            "segment": gap.segment, "detected_at": _now(), **extra}], schema=schema.schema_for("gaps")))

    def _period_gap(self, reason: str, **extra: Any) -> None:
        """A loss that is not a forward_ct range (an outage, a request): the range is empty (last < first)."""
        hw = max((c.high_water for c in self.cursor.ranks.values()), default=0)
        self._gap(Gap(-1, hw + 1, hw, reason, self.cursor.segment), **extra)

    # -- the run row -------------------------------------------------------------

    async def _start_run(self, client: httpx.AsyncClient) -> None:
        """Check the first ``/server_info``, start the cursor, open the run's row. Long: one row from one body."""
        try:
            resp = await client.get("/server_info")
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise CollectError(f"cannot read {self.opts.url}/server_info: {exc}. Is the server up "
                               "(GET /health) and is --url right?") from exc
        body = resp.content
        info, args = first_server_info(self.opts.url, body, CollectError)
        first = next(r for r in info.ranks if r.gamma or r.mode)
        self.cursor.note_start(info)
        held = {r.dp_rank: r.records[-1].forward_ct for r in info.ranks if r.records}
        if self.resumed is not None:
            self._resume_cursor(info)
        elif held and not self.opts.include_held:  # earlier traffic is not this run's
            for dp_rank, fct in held.items():
                self.cursor.ranks[dp_rank] = RankCursor(high_water=fct)
        capacity = args.get("emulator_max_records")
        if isinstance(capacity, int) and capacity > 0:
            self.cursor.capacity = capacity
        env = args.get("env") if isinstance(args.get("env"), dict) else {}
        payload_mode = first.mode or env.get("SGLANG_RAGGED_VERIFY_MODE", "")
        self._payload_mode = payload_mode if payload_mode in ("static", "compact", "cap-accept") else ""
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
        if held and self.resumed is None:
            labels["skipped_held_records" if not self.opts.include_held else "included_held_records"] = \
                ",".join(f"dp{r}<={f}" for r, f in sorted(held.items()))
        run_fields: dict[str, Any] = {"started_at": _now(), "ended_at": None, "end_reason": None}
        if self.resumed is not None:
            labels = {**self.resumed.labels, **labels}
            run_fields = {"ended_at": None, "end_reason": None}
        self.metrics.on_run(run_id=self.opts.run_id, mode=self.summary.mode, gamma=self.summary.gamma,
                            dp_size=self.summary.dp_size, server_url=self.opts.url)
        self.metrics.health.on_run(ServerState.from_args(args, mode=self.summary.mode, gamma=self.summary.gamma),
                                   dp_size=self.summary.dp_size or 1)
        source = self.opts.source or ("emulator" if args.get("emulator") else "sglang")
        self.store.upsert_run(
            self.opts.run_id, **run_fields, source=source,
            server_url=self.opts.url, mode=self.summary.mode, gamma=self.summary.gamma,
            dp_size=self.summary.dp_size, labels=labels, companion_of=self.opts.companion_of,
            seed=seed if isinstance(seed, int) and abs(seed) < 2**63 else None,
            server_version=info.version if isinstance(info.version, str) else None,
            startup_time=info.startup_time, server_info=json.dumps(args, default=str)[:1_000_000],
            **self._run_axes(args, labels),
        )
        # The first body is a poll too: an empty deque now means nothing predates us,
        # so a wrap before the next poll is reported from forward_ct 1 on.
        self.summary.polls += 1
        self.metrics.on_poll(0.0)
        await self._process(info)

    def _run_axes(self, args: dict, labels: dict) -> dict[str, Any]:
        """The run's clock, driver concurrency, sweep and method (the axes a sweep's figures read)."""
        drive = self.opts.drive
        # The emulator's /generate latency is on its cost-table clock; OpenAI latencies are measured here.
        virtual = args.get("emulator_clock") == "virtual" and (drive is None or drive.api == "generate")
        return {"clock": "virtual" if virtual else "wall",
                "concurrency": drive.concurrency if drive else None,
                "sweep_id": self.opts.sweep_id, "method": self.opts.method or labels.get("method")}

    # -- traffic -----------------------------------------------------------------

    def _on_result(self, row: dict[str, Any], tokens: pa.Table) -> None:
        self._add("requests", pa.Table.from_pylist([row], schema=schema.schema_for("requests")))
        if not self.opts.redact_text or self.opts.keep_token_ids:  # token ids spell the output text
            self._add("tokens", tokens)
        self.accounting.finished(row["rid"], row.get("spec_verify_ct"))
        self.metrics.on_request(row, tokens)
        self.summary.requests += 1
        self.summary.tokens += tokens.num_rows if not self.opts.redact_text or self.opts.keep_token_ids else 0
        self.progress("requests", 1)

    def _on_request_error(self, req: PlannedRequest, message: str) -> None:
        """A request finally lost (retries spent, or cancelled at stop): a dead letter and a gap row."""
        self.summary.failed_requests += 1
        self._dead_letter(self.opts.drive.endpoint, message, req.rid)
        self._period_gap("request_failed", rid=req.rid, detail=message[:2000])

    def _planned(self) -> Optional[list[PlannedRequest]]:
        """What to send: the given replay, or the planned traffic less what a resumed run finished."""
        if self.opts.planned is not None or self.resumed is None:
            return self.opts.planned

        done = {r.rsplit("@", 1)[0] for r in self.resumed.rids}
        return [req for req in plan_requests(self.opts.drive) if req.rid.rsplit("@", 1)[0] not in done]

    def _prepare(self) -> None:
        """Refuse an existing run (or resume it), and scope the driver's rids to this run (attempt)."""
        try:
            row = runlife.check_new_run(self.store, self.opts.run_id, resume=self.opts.resume)
        except runlife.RunExists as exc:
            raise CollectError(str(exc)) from None
        if row is not None:
            self.resumed = runlife.resume_point(self.store, self.opts.run_id, row)
            runlife.remove_stale_tmp(self.store, self.opts.run_id)
        drive_spec = self.opts.drive
        if drive_spec is not None and self.opts.planned is None and drive_spec.rid_scope is None:
            attempt = sum(1 for k in (self.resumed.labels if self.resumed else {}) if k.endswith("_previous_end"))
            # A companion replays its original's requests: the same rids pair its steps with the original's.
            scope = self.opts.companion_of or (self.opts.run_id + (f".r{attempt}" if attempt else ""))
            self.opts.drive = dataclasses.replace(drive_spec, rid_scope=scope)  # the caller's spec stays as given

    def _final_losses(self) -> None:
        """Rows for what the run lost that no poll saw: outage, request accounting, dropped rows."""
        self._close_outage()
        if self.opts.drive is not None:
            reasons = set(self._gap_reasons)
            for fields in self.accounting.mismatches(reasons):
                self.summary.requests_missing_steps += 1
                self._period_gap(fields.pop("reason"), **fields)
        # steps refused by the backlog already have their forward_ct-range rows (table_name steps)
        others = {t: n for t, n in self.writer.dropped.items() if t != "steps"}
        for fields in losses.dropped_rows(others, {}):
            self._period_gap(fields.pop("reason"), **fields)

    async def _follow_request_log(self) -> None:

        self._log_follower = RequestLogFollower(self.opts.request_log, WorkloadResolver(), redact=self.opts.redact_text)
        while not self._stop.is_set():
            self._take_request_log()
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.opts.poll_interval)
            except asyncio.TimeoutError:
                pass

    def _take_request_log(self) -> None:
        follower = getattr(self, "_log_follower", None)
        if follower is None:
            return
        for row, tokens in follower.poll():
            row["finished_at"] = _now()
            self._on_result(row, tokens)
        for reason, raw in follower.dead:
            self._dead_letter(f"request-log:{self.opts.request_log.rsplit('/', 1)[-1]}", reason, raw)
        follower.dead.clear()

    # -- the run -----------------------------------------------------------------

    async def run(self, *, server_exit: Optional[asyncio.Future] = None,
                  before_close: Optional[Callable[[], Awaitable[Optional[dict]]]] = None) -> CollectSummary:
        """Collect until the traffic is done, the duration passes, ``stop()`` or the server exits.

        ``server_exit`` (launch mode) resolves to the child's exit code;
        ``before_close`` runs after the last poll and before the final flush
        (launch mode stops the child there) and may return labels for the run.
        Long: its tasks start and stop in one frame, so every exit path closes the run the same way.
        """
        t0 = time.monotonic()
        self.metrics.health.on_collect_start(t0)
        limits = httpx.Limits(max_connections=(self.opts.drive.concurrency if self.opts.drive else 1) + 4)
        extra_labels: dict = {}
        try:
            self._prepare()
        except CollectError:
            self.writer.close()
            raise
        try:
            async with httpx.AsyncClient(base_url=self.opts.url, timeout=self.opts.request_timeout,
                                         limits=limits) as client:
                await self._start_run(client)
                poller = asyncio.create_task(self._poll_loop(client))
                follower = asyncio.create_task(self._follow_request_log()) if self.opts.request_log else None
                if self.opts.drive is not None:
                    main = asyncio.create_task(drive(
                        client, self.opts.drive, self._on_result,
                        on_error=self._on_request_error, planned=self._planned()))
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
                    if exc is not None:
                        self.summary.end_reason = f"error: traffic driver: {exc}"
                for task in (main, stopper):
                    if not task.done():
                        task.cancel()
                if not main.done():  # let cancelled requests report themselves (request_failed rows)
                    await asyncio.wait({main}, timeout=5.0)
                self._stop.set()
                # the poller ends after its current poll, which is bounded by poll_timeout
                await asyncio.wait({poller}, timeout=self.opts.poll_timeout + 1.0)
                if not poller.done():
                    poller.cancel()
                if not server_dead:
                    # dump() drains the last pending step; a signal asks for a short last look
                    last = min(self.opts.poll_timeout, 2.0) if self.stop_reason else self.opts.poll_timeout
                    await self.poll_once(client, timeout=last)
                    self._report_trailing_clears()
                if follower is not None:
                    await asyncio.wait({follower}, timeout=self.opts.poll_timeout)
                    self._take_request_log()  # what the server logged up to the last poll
                if before_close is not None:
                    extra_labels = await before_close() or {}
        except CollectError:
            self.writer.close()
            raise
        except Exception as exc:
            self.summary.end_reason = f"error: {type(exc).__name__}: {exc}"
            if before_close is not None:
                extra_labels = await before_close() or {}
        if self.summary.failed_requests and not self.summary.requests \
                and not self.summary.end_reason.startswith(("error", "interrupted", "server_exited")):
            self.summary.end_reason = f"error: all {self.summary.failed_requests} requests failed"
        self._final_losses()
        self.writer.close(timeout=max(10.0, 2 * self.opts.flush_interval))
        self.summary.rows_dropped = self.writer.rows_dropped
        self.summary.rows_failed = self.writer.rows_failed
        self.summary.write_errors = list(self.writer.errors)
        failed = losses.dropped_rows({}, dict(self.writer.failed))
        if failed:  # the writer could not commit these: try once more, directly, to leave a trace
            hw = max((c.high_water for c in self.cursor.ranks.values()), default=0)
            try:
                self.store.write("gaps", self.opts.run_id, [
                    {"dp_rank": -1, "first_missing_forward_ct": hw + 1, "last_missing_forward_ct": hw,
                     "segment": self.cursor.segment, "detected_at": _now(), **f} for f in failed])
            except Exception as exc:
                self.summary.write_errors.append(f"gaps: the write_failed rows could not be written either: {exc}")
            if not self.summary.end_reason.startswith("error"):
                self.summary.end_reason = f"error: {self.summary.rows_failed} rows could not be written"
        self.summary.elapsed_s = time.monotonic() - t0
        fields: dict[str, Any] = {"ended_at": _now(), "end_reason": self.summary.end_reason,
                                  **self._observation_fields()}
        if self.cursor.segment and self.cursor.startup_time is not None:
            fields["startup_time"] = self.cursor.startup_time  # the server now, so a --resume follows it
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


    def _observation_fields(self) -> dict[str, Any]:
        """The runs row's observation_requests, observation_server_s, collect_s: this attempt's plus earlier ones'."""
        self.metrics.health.on_collect_end(self.summary.elapsed_s)
        ours = {"observation_requests": self.summary.observation_requests,
                "observation_server_s": self.summary.observation_server_s, "collect_s": self.summary.elapsed_s}
        if self.resumed is None:
            return ours
        try:
            rows = self.store.read("runs", self.opts.run_id).to_pylist()
        except Exception:  # the write below reports a store that cannot be read
            return ours
        before = rows[-1] if rows else {}
        return {k: v + (before.get(k) or 0) for k, v in ours.items()}


def collect(store, opts: CollectOptions,
            progress: Callable[[str, int], None] = lambda kind, n: None) -> CollectSummary:
    """Run a collection to completion (blocking)."""
    return asyncio.run(Collector(store, opts, progress).run())
