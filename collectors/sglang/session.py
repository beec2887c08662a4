"""One collection run: poll ``/server_info``, optionally drive traffic, write.

``collect()`` ties the pieces together: a ``runs`` row from the first
``/server_info``, a poll loop reading by high-water mark (``ForwardCursor``)
that clears the server's deque only when it grows past ``clear_at`` records,
an optional traffic driver, and a ``BufferedWriter``.  It returns a summary and
records on the run why it ended.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import httpx
import pyarrow as pa

from collectors.sglang.cursor import ForwardCursor
from collectors.sglang.decode import PayloadError, decode_server_info, records_to_tables, server_args
from collectors.sglang.driver import DriveSpec, drive
from collectors.sglang.writer import BufferedWriter
from dspark_obs import schema
from dspark_obs.store import Store

DEBUG_DUMP_HINT = (
    "launch SGLang with SGLANG_DSPARK_DEBUG_DUMP=core,step_cpu_time,step_gpu_time,draft_gpu_time,"
    "target_verify_gpu_time,reqs (or all) and --speculative-algorithm DSPARK"
)


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
    labels: dict[str, str] = field(default_factory=dict)
    companion_of: Optional[str] = None
    request_timeout: float = 600.0


@dataclass
class CollectSummary:
    run_id: str
    mode: str = ""
    gamma: int = 0
    dp_size: int = 0
    polls: int = 0
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
    end_reason: str = "completed"
    elapsed_s: float = 0.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Collector:
    def __init__(self, store: Store, opts: CollectOptions,
                 progress: Callable[[str, int], None] = lambda kind, n: None) -> None:
        self.store, self.opts = store, opts
        self.cursor = ForwardCursor()
        self.writer = BufferedWriter(store, opts.run_id, flush_interval=opts.flush_interval)
        self.summary = CollectSummary(run_id=opts.run_id)
        self.progress = progress
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    def _dead_letter(self, source: str, reason: str, payload: bytes | str | None) -> None:
        text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
        self.summary.dead_letters += 1
        self.writer.add("dead_letters", pa.Table.from_pylist([{
            "received_at": _now(), "source": source, "reason": reason[:2000],
            "payload": None if text is None else text[:65536],
        }], schema=schema.schema_for("dead_letters")))

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
        first = next(r for r in info.ranks if r.gamma)
        env = args.get("env") if isinstance(args.get("env"), dict) else {}
        self.summary.mode = first.mode or env.get("SGLANG_RAGGED_VERIFY_MODE", "")
        self.summary.gamma = first.gamma
        self.summary.dp_size = len(info.ranks)
        labels = dict(self.opts.labels)
        seed = args.get("random_seed")
        if self.opts.drive:
            labels.setdefault("workloads", ",".join(self.opts.drive.workloads))
            labels.setdefault("temperature", str(self.opts.drive.temperature))
            labels.setdefault("concurrency", str(self.opts.drive.concurrency))
        self.store.upsert_run(
            self.opts.run_id, started_at=_now(), source="emulator" if args.get("emulator") else "sglang",
            server_url=self.opts.url, mode=self.summary.mode, gamma=self.summary.gamma,
            dp_size=self.summary.dp_size, labels=labels, companion_of=self.opts.companion_of,
            seed=seed if isinstance(seed, int) else None, server_version=info.version,
            startup_time=info.startup_time, server_info=json.dumps(args, default=str)[:1_000_000],
        )

    async def poll_once(self, client: httpx.AsyncClient) -> None:
        try:
            resp = await client.get("/server_info")
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            self._dead_letter("/server_info", f"poll failed: {exc}", None)
            return
        body = resp.content
        try:
            info = await asyncio.to_thread(decode_server_info, body)
        except PayloadError as exc:
            self._dead_letter("/server_info", str(exc), body)
            return
        self.summary.polls += 1
        delta = self.cursor.advance(info)
        for rank in info.ranks:
            for reason, raw in rank.dead:
                self._dead_letter("/server_info", reason, raw)
        for gap in delta.gaps:
            self.summary.gaps += 1
            if gap.last_missing_forward_ct >= gap.first_missing_forward_ct:
                self.summary.lost_forward_cts += gap.last_missing_forward_ct - gap.first_missing_forward_ct + 1
            self.writer.add("gaps", pa.Table.from_pylist([{
                "dp_rank": gap.dp_rank, "first_missing_forward_ct": gap.first_missing_forward_ct,
                "last_missing_forward_ct": gap.last_missing_forward_ct, "reason": gap.reason,
                "segment": gap.segment, "detected_at": _now()}], schema=schema.schema_for("gaps")))
        for dp_rank, records in delta.new.items():
            steps, reqs = await asyncio.to_thread(records_to_tables, records, dp_rank=dp_rank,
                                                  segment=self.cursor.segment)
            self.writer.add("steps", steps)
            self.writer.add("step_reqs", reqs)
            self.summary.steps += steps.num_rows
            self.summary.step_reqs += reqs.num_rows
            self.progress("steps", steps.num_rows)
        held = max((len(r.records) for r in info.ranks), default=0)
        if self.opts.clear_at and held >= self.opts.clear_at:
            await self._clear(client)

    async def _clear(self, client: httpx.AsyncClient) -> None:
        try:
            resp = await client.post("/set_internal_state",
                                     json={"server_args": {"dspark_clear_info_records": True}})
            resp.raise_for_status()
            if resp.json().get("updated"):
                self.cursor.note_cleared()
                self.summary.clears += 1
        except (httpx.HTTPError, ValueError) as exc:
            self._dead_letter("/set_internal_state", f"clear failed: {exc}", None)

    async def _poll_loop(self, client: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            await self.poll_once(client)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.opts.poll_interval)
            except asyncio.TimeoutError:
                pass

    def _on_result(self, row: dict[str, Any], tokens: pa.Table) -> None:
        self.writer.add("requests", pa.Table.from_pylist([row], schema=schema.schema_for("requests")))
        self.writer.add("tokens", tokens)
        self.summary.requests += 1
        self.summary.tokens += tokens.num_rows
        self.progress("requests", 1)

    async def run(self) -> CollectSummary:
        t0 = time.monotonic()
        limits = httpx.Limits(max_connections=(self.opts.drive.concurrency if self.opts.drive else 1) + 4)
        async with httpx.AsyncClient(base_url=self.opts.url, timeout=self.opts.request_timeout,
                                     limits=limits) as client:
            await self._start_run(client)
            poller = asyncio.create_task(self._poll_loop(client))
            try:
                if self.opts.drive is not None:
                    res = await drive(client, self.opts.drive, self._on_result,
                                      on_error=lambda req, msg: self._dead_letter("/generate", msg, req.rid))
                    self.summary.failed_requests = res.failed
                elif self.opts.duration is not None:
                    try:
                        await asyncio.wait_for(self._stop.wait(), timeout=self.opts.duration)
                    except asyncio.TimeoutError:
                        pass
                else:
                    await self._stop.wait()
                if self._stop.is_set() and self.opts.drive is None and self.opts.duration is None:
                    self.summary.end_reason = "interrupted"
            except asyncio.CancelledError:
                self.summary.end_reason = "interrupted"
            finally:
                self._stop.set()
                await poller
                await self.poll_once(client)  # dump() drains the last pending step
        self.writer.close()
        self.summary.rows_dropped = self.writer.rows_dropped
        self.summary.elapsed_s = time.monotonic() - t0
        self.store.upsert_run(self.opts.run_id, ended_at=_now(), end_reason=self.summary.end_reason)
        return self.summary


def collect(store: Store, opts: CollectOptions,
            progress: Callable[[str, int], None] = lambda kind, n: None) -> CollectSummary:
    """Run a collection to completion (blocking)."""
    return asyncio.run(Collector(store, opts, progress).run())
