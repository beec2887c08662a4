"""Live Prometheus metrics of the sidecar itself, in the ``dspark_obs:`` namespace.

Two kinds:

* **Health of collection**: rows queued, written and dropped per table, gaps
  and the forward_cts they may have lost per reason, dead letters per source,
  polls, poll errors and duration, poll lag (seconds since the last good
  poll), the write backlog, and per DP rank the server's deque size and our
  high-water mark.
* **Censoring-aware DSpark gauges** over the last ``window_rows`` request-steps:
  ``verified_window_acceptance{position=k}`` is the acceptance of draft k
  *among request-steps that verified it* (``window >= k``) and had accepted
  drafts 1..k-1 — a trimmed draft is neither a success nor a failure, so the
  estimate is not biased down by trimming.  ``verified_window_confidence`` is
  the mean reported confidence ``c_k`` over the same request-steps (the
  calibration target of ``c_k``), ``censored_step_share`` the share of
  request-steps whose whole window was accepted with ``window < gamma`` (their
  ceiling is unknown), and ``mean_window`` the mean ``verify_len - 1``.
* **Trimming health counters** (``collectors.sglang.health_metrics``): the
  sums behind every figure of ``dspark_obs.health``, so ``rate()`` works, and
  the ``trimming_active`` / ``cost_table_loaded`` gauges; and the live ceiling
  (``collectors.sglang.live_ceiling``): tokens lost to trimming, exact for greedy requests, and for
  sampled ones with ``ceiling_fit`` (``collect --ceiling-fit``).

Each collector owns its registry, so several can run in one process (tests).
``serve`` exposes it on 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections import deque
from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from collectors.sglang.health_metrics import HealthCounters
from collectors.sglang.live_ceiling import LiveCeiling
from dspark_obs.acceptance import censored
from dspark_obs.estimators.ceiling.fit import CeilingFit

NS = "dspark_obs:"
MAX_POSITIONS = 16
GAP_REASONS = ("deque_wrap", "clear", "server_restart", "write_backlog", "write_failed", "poll_error", "poll_stall",
               "request_failed", "request_steps_missing")


class _Window:
    """Per-position counts of the last ``limit`` request-steps, kept as per-batch sums."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.batches: deque[dict[str, np.ndarray | float]] = deque()
        self.rows = 0

    def add(self, agg: dict) -> None:
        self.batches.append(agg)
        self.rows += int(agg["rows"])
        while len(self.batches) > 1 and self.rows - int(self.batches[0]["rows"]) >= self.limit:
            self.rows -= int(self.batches.popleft()["rows"])

    def total(self, key: str):
        return sum(b[key] for b in self.batches)


def confidence_matrix(conf: pa.ChunkedArray | pa.Array, positions: int) -> np.ndarray:
    """Ragged ``confidence`` lists as a rows x ``positions`` float64 matrix, NaN where absent.

    Vectorised over Arrow's offsets (a batch of 256 x 50 records is ~13k
    lists per poll): a null list, a short list or a null item leaves NaN.

    >>> confidence_matrix(pa.array([[0.5, 0.25], None, [1.0]], pa.list_(pa.float32())), 3).tolist()
    [[0.5, 0.25, nan], [nan, nan, nan], [1.0, nan, nan]]
    """
    if isinstance(conf, pa.ChunkedArray):
        conf = conf.combine_chunks() if conf.num_chunks else pa.array([], conf.type)
    n = len(conf)
    mat = np.full((n, positions), np.nan)
    if n == 0 or conf.null_count == n:
        return mat
    lengths = pc.fill_null(pc.list_value_length(conf), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.fill_null(pc.list_flatten(conf), float("nan")).to_numpy(zero_copy_only=False)
    starts = np.cumsum(lengths) - lengths
    row = np.repeat(np.arange(n), lengths)
    pos = np.arange(values.size) - np.repeat(starts, lengths)
    keep = pos < positions
    mat[row[keep], pos[keep]] = values[keep]
    return mat


def aggregate_step_reqs(reqs: pa.Table, *, positions: int = MAX_POSITIONS) -> dict:
    """Sums over one batch of ``step_reqs`` rows that the censoring-aware gauges need.

    >>> t = pa.table({"verify_len": pa.array([3, 7], pa.int16()), "correct_drafts": pa.array([2, 1], pa.int16()),
    ...               "acc_len": pa.array([3, 2], pa.int16()), "draft_tokens": [[1] * 6, [1] * 6],
    ...               "confidence": [None, [0.9] * 6]})
    >>> agg = aggregate_step_reqs(t, positions=6)
    >>> agg["reached"][:3].tolist(), agg["accepted"][:3].tolist(), agg["censored"]
    ([2, 2, 0], [2, 1, 0], 1)
    """
    n = reqs.num_rows
    out = {"rows": n, "reached": np.zeros(positions, np.int64), "accepted": np.zeros(positions, np.int64),
           "conf_sum": np.zeros(positions), "conf_n": np.zeros(positions, np.int64),
           "censored": 0, "window_sum": 0.0, "acc_sum": 0.0}
    if n == 0:
        return out
    w = reqs.column("verify_len").to_numpy(zero_copy_only=False).astype(np.int64) - 1
    c = reqs.column("correct_drafts").to_numpy(zero_copy_only=False).astype(np.int64)
    gamma = pc.list_value_length(reqs.column("draft_tokens")).to_numpy(zero_copy_only=False)
    gamma = np.nan_to_num(gamma.astype(np.float64), nan=0).astype(np.int64)
    k = np.arange(1, positions + 1)[None, :]
    reached = (w[:, None] >= k) & (c[:, None] >= k - 1)
    accepted = reached & (c[:, None] >= k)
    out["reached"] = reached.sum(axis=0)
    out["accepted"] = accepted.sum(axis=0)
    out["censored"] = int(censored(w, c, gamma).sum())
    out["window_sum"] = float(w.sum())
    out["acc_sum"] = float(reqs.column("acc_len").to_numpy(zero_copy_only=False).astype(np.float64).sum())
    mat = confidence_matrix(reqs.column("confidence"), positions)
    sel = reached & ~np.isnan(mat)
    out["conf_sum"] = np.where(sel, mat, 0.0).sum(axis=0)
    out["conf_n"] = sel.sum(axis=0)
    return out


class SidecarMetrics:
    """The sidecar's registry; the collector calls the ``on_*`` hooks."""

    def __init__(self, *, window_rows: int = 20_000, clock: Callable[[], float] = time.monotonic,
                 health: bool = True, ceiling_fit: Optional[CeilingFit] = None) -> None:
        self.registry = CollectorRegistry()
        self.track_health = health  # off: a registry nobody scrapes need not run the health queries
        r = self.registry
        self._clock = clock
        self._last_poll: Optional[float] = None
        self.window = _Window(window_rows)
        self._lock = threading.Lock()
        self.info = Info(NS + "run", "The run being collected", registry=r)
        self.rows = Counter(NS + "rows", "Rows queued for the store", ["table"], registry=r)
        self.rows_written = Counter(NS + "rows_written", "Rows committed to the store", ["table"], registry=r)
        self.rows_dropped = Counter(NS + "rows_dropped", "Rows dropped because writing fell behind", ["table"],
                                    registry=r)
        self.gaps = Counter(NS + "gaps", "Gaps in forward_ct noticed", ["reason"], registry=r)
        self.lost = Counter(NS + "lost_forward_cts", "forward_cts possibly lost (upper bound; restarts "
                            "count 0: their length is unknown)", ["reason"], registry=r)
        self.dead_letters = Counter(NS + "dead_letters", "Payloads rejected into dead_letters", ["source"],
                                    registry=r)
        self.polls = Counter(NS + "polls", "Successful /server_info polls", registry=r)
        self.poll_errors = Counter(NS + "poll_errors", "Failed /server_info polls", registry=r)
        self.poll_seconds = Histogram(NS + "poll_duration_seconds", "Time to fetch and decode /server_info",
                                      buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                      registry=r)
        self.poll_lag = Gauge(NS + "poll_lag_seconds", "Seconds since the last successful poll", registry=r)
        self.poll_lag.set_function(self._lag)
        self.backlog_bytes = Gauge(NS + "write_backlog_bytes", "Bytes waiting to be written", registry=r)
        self.backlog_rows = Gauge(NS + "write_backlog_rows", "Rows waiting to be written", registry=r)
        self.held = Gauge(NS + "server_records_held", "Records in the server's deque at the last poll",
                          ["dp_rank"], registry=r)
        self.high_water = Gauge(NS + "high_water_forward_ct", "Last forward_ct read", ["dp_rank"], registry=r)
        self.acceptance = Gauge(NS + "verified_window_acceptance", "Acceptance of draft k among request-steps "
                                "that verified it after accepting 1..k-1 (censoring-aware)", ["position"],
                                registry=r)
        self.confidence = Gauge(NS + "verified_window_confidence", "Mean reported confidence c_k over the same "
                                "request-steps", ["position"], registry=r)
        self.verified = Gauge(NS + "verified_window_request_steps", "Request-steps that verified position k "
                              "in the window", ["position"], registry=r)
        self.censored = Gauge(NS + "censored_step_share", "Share of request-steps whose window was fully "
                              "accepted with window < gamma (ceiling unknown)", registry=r)
        self.mean_window = Gauge(NS + "mean_window", "Mean drafts verified per request-step (verify_len - 1)",
                                 registry=r)
        self.mean_acc_len = Gauge(NS + "mean_acc_len", "Mean tokens committed per request-step", registry=r)
        self.window_rows = Gauge(NS + "gauge_window_request_steps", "Request-steps the DSpark gauges cover",
                                 registry=r)
        # Known label values start at 0, so increase() and rate() answer 0 rather than nothing.
        for reason in GAP_REASONS:
            self.gaps.labels(reason)
            self.lost.labels(reason)
        for table in ("steps", "step_reqs", "requests", "tokens"):
            for counter in (self.rows, self.rows_written, self.rows_dropped):
                counter.labels(table)
        self.dead_letters.labels("/server_info")
        self.health = HealthCounters(window_rows=window_rows)
        r.register(self.health)
        self.ceiling = LiveCeiling(fit=ceiling_fit)
        r.register(self.ceiling)
        self._server = None

    def _lag(self) -> float:
        return float("nan") if self._last_poll is None else self._clock() - self._last_poll

    # -- hooks ---------------------------------------------------------------

    def on_run(self, **labels: object) -> None:
        self.info.info({k: str(v) for k, v in labels.items()})

    def on_poll(self, seconds: float) -> None:
        self.polls.inc()
        self.poll_seconds.observe(seconds)
        self._last_poll = self._clock()

    def on_rank(self, dp_rank: int, held: int, high_water: int) -> None:
        self.held.labels(str(dp_rank)).set(held)
        self.high_water.labels(str(dp_rank)).set(high_water)

    def on_batch(self, steps: pa.Table, reqs: pa.Table, *, gamma: Optional[int] = None) -> None:
        """One poll's new rows: the censoring-aware gauges and the health counters."""
        self.on_step_reqs(reqs)
        if self.track_health:
            self.health.add(steps, reqs, gamma=gamma)
            self.ceiling.add_steps(reqs)

    def on_request(self, row: dict, tokens: Optional[pa.Table]) -> None:
        """A finished request (driver response or request log): the live ceiling's tokens."""
        if self.track_health:
            self.ceiling.on_request(row, tokens)

    def on_step_reqs(self, reqs: pa.Table) -> None:
        agg = aggregate_step_reqs(reqs)
        with self._lock:
            self.window.add(agg)
            reached, accepted = self.window.total("reached"), self.window.total("accepted")
            conf_sum, conf_n = self.window.total("conf_sum"), self.window.total("conf_n")
            rows = self.window.rows
            for k in range(MAX_POSITIONS):
                if reached[k] == 0:
                    continue
                pos = str(k + 1)
                self.acceptance.labels(pos).set(accepted[k] / reached[k])
                self.verified.labels(pos).set(int(reached[k]))
                if conf_n[k]:
                    self.confidence.labels(pos).set(conf_sum[k] / conf_n[k])
            if rows:
                self.censored.set(self.window.total("censored") / rows)
                self.mean_window.set(self.window.total("window_sum") / rows)
                self.mean_acc_len.set(self.window.total("acc_sum") / rows)
            self.window_rows.set(rows)

    # -- serving ---------------------------------------------------------------

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` (port 0 picks one); returns the port.

        Always in the classic text format (0.0.4): prometheus_client's
        OpenMetrics output, which Prometheus asks for first, escapes the ``:`` of
        ``dspark_obs:*`` to ``_``, and the dashboard and alert rules would find
        nothing.
        """
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the scraper gave up (its scrape_timeout)
                    pass

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
