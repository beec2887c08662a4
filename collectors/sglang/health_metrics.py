"""The sidecar's trimming-health counters: every figure of :mod:`dspark_obs.health` as a counter.

SGLang's own spec metrics are gauges reset every log interval, so PromQL
``rate()`` cannot be used on them.  These are counters of the sums behind each
health figure — request-steps, trimmed and budget-trimmed ones, censored ones,
verified and no-trim tokens, accepted / verified / proposed drafts, the
survival-predicted accepted drafts, padding and DP-tier tokens, the cost
table's summed relative error, the step loop's summed step_cpu_ms — per DP
rank, so any window's figure is a ratio of two ``rate()`` s (the Grafana row
and the alert rules in ``examples/`` are written that way).  Per position, ``position_*`` counters
give survival-predicted against observed acceptance.  ``observation_*`` count
the observation's own cost: the seconds the server spent answering the
sidecar's polls and clears (the collector times each), so their ``rate()`` is
the share of wall time the server spends on being observed.

The sums come from the same SQL as every other consumer (``health_figures``
over the poll's batch in memory).  Work is deferred to scrape time: batches
queue (cheap) and are folded into the totals when Prometheus scrapes, or
whenever ``fold_rows`` request-steps are waiting, so a sidecar nobody
scrapes does not spend CPU per poll.  ``trimming_active`` (a gauge) says
whether the budget-trimmed share of the last ``window_rows`` request-steps
reached the limit of ``thresholds.toml``; ``cost_table_loaded`` what the
server's arguments said at the start of the run.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Iterable, Optional

import duckdb
import numpy as np
import pyarrow as pa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dspark_obs import health

NS = "dspark_obs:"

# (counter name without _total, health_figures column, help)
RANK_COUNTERS = (
    ("request_steps", "request_steps", "Request-steps seen"),
    ("trimmed_request_steps", "trimmed_steps", "Request-steps with verify_len < gamma + 1"),
    ("budget_trimmed_request_steps", "budget_trimmed_steps", "Trimmed request-steps whose first trimmed draft "
     "had survival >= 0.01 (trims the planner's budget made)"),
    ("censored_request_steps", "censored_steps", "Request-steps that accepted their whole window below gamma "
     "(trim regret numerator)"),
    ("verified_tokens", "verified_tokens", "Sum of verify_len (verified slots, anchor included)"),
    ("no_trim_tokens", "no_trim_tokens", "Slots a no-trim verify would have verified: request-steps x (gamma + 1)"),
    ("accepted_drafts", "accepted_drafts", "Accepted drafts (sum of correct_drafts)"),
    ("verified_drafts", "verified_drafts", "Drafts actually verified (sum of verify_len - 1)"),
    ("proposed_drafts", "proposed_drafts", "Drafts proposed: request-steps x gamma (SGLang's spec_accept_rate "
     "denominator)"),
    ("survival_request_steps", "survival_steps", "Request-steps that carried survival"),
    ("expected_accepted_drafts", "expected_accepted", "Survival-predicted accepted drafts, sum of S_1..S_window"),
    ("survival_accepted_drafts", "survival_accepted", "Accepted drafts of the request-steps that carried survival"),
    ("decode_steps", "decode_steps", "Decode steps seen"),
    ("graph_tokens", "graph_tokens", "Verify tokens run (num_verify_tokens: the CUDA-graph tier) in compact steps"),
    ("padded_tokens", "padded_tokens", "Graph-tier padding: num_verify_tokens - sum(verify_len), compact steps"),
    ("dp_tier_tokens", "dp_tier_tokens", "Tokens from rounding up to the largest DP rank's tier "
     "(verify_tokens_dp_synced - verify_tokens_local)"),
    ("costtable_fit_steps", "fit_steps", "Steps with predicted_step_ms and step_gpu_ms"),
    ("costtable_abs_pct_error", None, "Sum over those steps of |predicted_step_ms - step_gpu_ms| / step_gpu_ms "
     "(MAPE = rate of this / rate of costtable_fit_steps)"),
    ("step_cpu_steps", "timed_steps", "Decode steps with step_cpu_ms (host time since the previous step)"),
    ("step_cpu_seconds", None, "Sum of their step_cpu_ms, in seconds (mean step = rate of this / rate of "
     "step_cpu_steps)"),
)
# counters that are a mean x its count in health_figures: name -> (mean column, count column, scale)
_FROM_MEANS = {"costtable_abs_pct_error": ("costtable_mape", "fit_steps", 1.0),
               "step_cpu_seconds": ("step_cpu_ms", "timed_steps", 1e-3)}
OBSERVATION_COUNTERS = (
    ("observation_server_seconds", "server_s", "Seconds the server took to answer the sidecar's /server_info polls "
     "and clears, timed by the sidecar (rate() = share of wall time: an upper bound on the observation's cost)"),
    ("observation_requests", "requests", "Polls and clears the sidecar sent and timed"),
    ("observation_collect_seconds", "collect_s", "Seconds the sidecar has been collecting (the share's "
     "denominator over a whole run)"),
)
POSITION_COUNTERS = (
    ("position_verified_request_steps", "n", "Request-steps that verified draft position k (with survival)"),
    ("position_expected_accepted", "expected_accepted", "Survival-predicted acceptances at position k (sum S_k)"),
    ("position_accepted", "actual_accepted", "Observed acceptances at position k (correct_drafts >= k)"),
)


def _default_limits() -> health.Limits:
    """The limits of the packaged thresholds file (the report's, so the gauge and the report's gates agree)."""
    from dspark_obs.report.thresholds import load_thresholds  # start-up: the report package costs ~1 s to import

    return health.Limits.from_thresholds(load_thresholds())


class HealthCounters:
    """A Prometheus collector of the health counters; :meth:`add` queues one poll's batch."""

    def __init__(self, *, window_rows: int = 20_000, fold_rows: int = 100_000,
                 limits: Optional[health.Limits] = None) -> None:
        self.window_rows, self.fold_rows = max(1, window_rows), max(1, fold_rows)
        self.limits = limits or _default_limits()
        self._lock = threading.Lock()  # pending batches and totals: held only briefly (the poll loop adds)
        self._fold_lock = threading.Lock()  # one fold at a time (the query's connection is reused)
        self._folder: Optional[threading.Thread] = None
        self._pending: list[tuple[pa.Table, pa.Table]] = []
        self._pending_rows = 0
        self._rank: dict[str, dict[str, float]] = {}
        self._pos: dict[int, dict[str, float]] = {}
        self._lens: dict[int, float] = {}
        self._recent: deque[tuple[int, int]] = deque()  # (request-steps, budget-trimmed) per fold
        self._recent_rows = 0
        self.gamma: Optional[int] = None
        self.cost_table_loaded: Optional[bool] = None
        self._con: Optional[duckdb.DuckDBPyConnection] = None
        self._observed = {"server_s": 0.0, "requests": 0.0}
        self._collect_t0: Optional[float] = None
        self._collect_s: Optional[float] = None  # set when the run ends (then it stops counting)

    def on_collect_start(self, t0: Optional[float] = None) -> None:
        self._collect_t0, self._collect_s = time.monotonic() if t0 is None else t0, None

    def on_collect_end(self, elapsed_s: float) -> None:
        self._collect_s = elapsed_s

    def on_served(self, seconds: float) -> None:
        """One poll or clear the server answered in ``seconds`` (timed by the collector)."""
        with self._lock:
            self._observed["server_s"] += seconds
            self._observed["requests"] += 1

    def observation(self) -> dict[str, float]:
        """server_s, requests and collect_s so far (the counters' values)."""
        with self._lock:
            out = dict(self._observed)
        out["collect_s"] = (self._collect_s if self._collect_s is not None else
                            0.0 if self._collect_t0 is None else time.monotonic() - self._collect_t0)
        return out

    def on_run(self, state: health.ServerState, *, dp_size: int = 1) -> None:
        """The run's shape: every series it can have starts at 0 now.

        A labelled counter born at its first fold carries that fold's whole
        increase in its first sample, which ``rate()`` and ``increase()`` never
        see (a short run, or a DP rank's first batch, would count as nothing);
        Prometheus' own advice is to export known label values at 0.
        """
        self.gamma = state.gamma
        self.cost_table_loaded = state.cost_table_loaded if state.mode != "static" else None
        with self._lock:
            for rank in range(max(1, dp_size)):
                self._rank.setdefault(str(rank), {})
            for k in range(1, (self.gamma or 0) + 1):
                self._pos.setdefault(k, {})
            for v in range(1, (self.gamma or 0) + 2):
                self._lens.setdefault(v, 0.0)

    def add(self, steps: pa.Table, reqs: pa.Table, *, gamma: Optional[int] = None) -> None:
        """Queue one batch (cheap); folded at the next scrape or when ``fold_rows`` wait."""
        if gamma:
            self.gamma = gamma
        with self._lock:
            self._pending.append((steps, reqs))
            self._pending_rows += reqs.num_rows
            due = self._pending_rows >= self.fold_rows and (self._folder is None or not self._folder.is_alive())
            if due:  # off the caller's thread: the poll loop must not wait on a query
                self._folder = threading.Thread(target=self.fold, name="health-fold", daemon=True)
                self._folder.start()

    def fold(self) -> None:
        """Fold every queued batch into the totals (one query over them all)."""
        with self._fold_lock:
            with self._lock:
                batches, self._pending, self._pending_rows = self._pending, [], 0
            if not batches:
                return
            steps = pa.concat_tables([b[0] for b in batches], promote_options="default")
            reqs = pa.concat_tables([b[1] for b in batches], promote_options="default")
            self._con = health.memory_connection(steps, reqs, run_id="live", gamma=self.gamma, con=self._con)
            fig = health.memory_figures(self._con)
            pos = health.memory_by_position(self._con)
            lens, counts = np.unique(reqs.column("verify_len").to_numpy(zero_copy_only=False), return_counts=True)
            with self._lock:
                self._merge(fig, pos, lens, counts)

    def _merge(self, fig, pos, lens, counts) -> None:
        """Add one fold's sums to the totals (under ``_lock``)."""
        self._fold_ranks(fig)
        for row in pos.itertuples():
            tot = self._pos.setdefault(int(row.position), {})
            for _, col, _ in POSITION_COUNTERS:
                tot[col] = tot.get(col, 0.0) + float(getattr(row, col) or 0)
        for v, c in zip(lens.tolist(), counts.tolist()):
            self._lens[int(v)] = self._lens.get(int(v), 0.0) + c

    def _fold_ranks(self, fig) -> None:
        ranks = fig[(fig["dp_rank"] != "*") & (fig["workload"] == "*")]
        for row in ranks.to_dict("records"):
            tot = self._rank.setdefault(str(row["dp_rank"]), {})
            for name, col, _ in RANK_COUNTERS:
                if col is None:  # a sum = mean x count
                    mean_col, n_col, scale = _FROM_MEANS[name]
                    mean, n = row.get(mean_col), row.get(n_col)
                    value = 0.0 if health.is_missing(mean) or health.is_missing(n) else float(mean) * float(n) * scale
                else:
                    value = 0.0 if health.is_missing(row.get(col)) else float(row[col])
                tot[name] = tot.get(name, 0.0) + value
        pooled = health.run_row(fig)
        if pooled is not None:
            n, trimmed = int(pooled["request_steps"] or 0), int(pooled["budget_trimmed_steps"] or 0)
            self._recent.append((n, trimmed))
            self._recent_rows += n
            while len(self._recent) > 1 and self._recent_rows - self._recent[0][0] >= self.window_rows:
                self._recent_rows -= self._recent.popleft()[0]

    def trimming_active(self) -> Optional[float]:
        """1 / 0 over the last ``window_rows`` request-steps (0 without a cost table); None before ``min_request_steps``."""
        if self.cost_table_loaded is False:
            return 0.0  # the flat uninitialised table: whatever the windows look like, nothing plans them
        n = sum(r for r, _ in self._recent)
        if n < self.limits.min_request_steps:
            return None
        share = sum(t for _, t in self._recent) / n
        return 1.0 if share >= self.limits.min_budget_trimmed_share else 0.0

    def totals(self) -> dict[str, dict[str, float]]:
        """Per DP rank, counter name -> total (after folding what is queued)."""
        self.fold()
        with self._lock:
            return {rank: dict(t) for rank, t in self._rank.items()}

    # -- prometheus_client collector protocol ---------------------------------------------

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        self.fold()
        observed = self.observation()
        with self._lock:
            for name, _, doc in RANK_COUNTERS:
                fam = CounterMetricFamily(NS + name, doc, labels=["dp_rank"])
                for rank, tot in sorted(self._rank.items()):
                    fam.add_metric([rank], tot.get(name, 0.0))
                yield fam
            for name, col, doc in POSITION_COUNTERS:
                fam = CounterMetricFamily(NS + name, doc, labels=["position"])
                for k, tot in sorted(self._pos.items()):
                    fam.add_metric([str(k)], tot.get(col, 0.0))
                yield fam
            for name, key, doc in OBSERVATION_COUNTERS:
                yield CounterMetricFamily(NS + name, doc, value=observed[key])
            fam = CounterMetricFamily(NS + "verify_len_request_steps", "Request-steps by verify_len (distinct "
                                      "window sizes: count(rate(...) > 0))", labels=["verify_len"])
            for v, c in sorted(self._lens.items()):
                fam.add_metric([str(v)], c)
            yield fam
            active = self.trimming_active()
            g = GaugeMetricFamily(NS + "trimming_active", "1 when the budget-trimmed share of the last request-steps "
                                  "reached its limit, 0 when trimming is inactive (NaN: too few request-steps)")
            g.add_metric([], float("nan") if active is None else active)
            yield g
            g = GaugeMetricFamily(NS + "cost_table_loaded", "1 when the server's arguments name a cost table "
                                  "(--speculative-dspark-sps-table-path), 0 when not, NaN before the run starts")
            g.add_metric([], float("nan") if self.cost_table_loaded is None else float(self.cost_table_loaded))
            yield g
