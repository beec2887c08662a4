"""A live ceiling estimate in the sidecar: tokens lost to trimming, exact for greedy requests.

For a greedy request a trimmed draft would have been accepted exactly when it
equals the token the target went on to commit at its position, so once the
request's output tokens are known (the driver's responses, or ``collect
--request-log``) each censored request-step's full-block acceptance follows
from :func:`dspark_obs.estimators.ceiling_walk.walk_blocks`, the walk the
offline estimator uses: ``lo`` counts the walked drafts that match (the
unverifiable rest at 0), ``hi`` the same with the rest accepted; the two agree
unless the output was cut before the walk ended.  Steps and tokens can arrive
in either order (a request's last steps may come with the poll after its
response), so censored steps wait for their request and finished requests
wait, a bounded while, for late steps.  Sampled requests need the fitted
acceptance model of ``dspark-obs estimate``; they are counted, not estimated.

Counters: ``ceiling_request_steps_total`` (censored request-steps resolved),
``tokens_lost_lo_total`` / ``tokens_lost_hi_total`` (sum of ceiling - accepted
drafts), ``ceiling_requests_total{sampling}``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import CounterMetricFamily

from dspark_obs.estimators.ceiling_walk import NO_TOKEN, ceiling_from_factors, walk_blocks

NS = "dspark_obs:"


class LiveCeiling:
    """Joins censored request-steps to their request's tokens as both arrive; a Prometheus collector."""

    def __init__(self, *, keep_finished: int = 4096, max_waiting_steps: int = 500_000) -> None:
        self.keep_finished, self.max_waiting_steps = keep_finished, max_waiting_steps
        self._lock = threading.Lock()
        self._steps: dict[str, list[tuple[int, int, int, np.ndarray]]] = {}  # rid -> (prefix, w, correct, drafts)
        self._waiting = 0
        self._done: OrderedDict[str, tuple[np.ndarray, int, bool]] = OrderedDict()  # rid -> (tokens, prompt, stop)
        self.totals = {"steps": 0.0, "lo": 0.0, "hi": 0.0, "dropped": 0.0}
        self.requests = {"greedy": 0.0, "sampled": 0.0, "unknown": 0.0}

    def add_steps(self, reqs: pa.Table) -> None:
        """Keep the censored request-steps of one batch (resolving those whose request already finished)."""
        if reqs.num_rows == 0 or "rid" not in reqs.column_names:
            return
        w = pc.subtract(reqs.column("verify_len"), 1).to_numpy(zero_copy_only=False).astype(np.int64)
        c = reqs.column("correct_drafts").to_numpy(zero_copy_only=False).astype(np.int64)
        gamma = pc.list_value_length(reqs.column("draft_tokens")).to_numpy(zero_copy_only=False).astype(np.int64)
        rid = reqs.column("rid").to_pylist()
        keep = np.flatnonzero((c == w) & (w < gamma) & np.array([r is not None for r in rid], dtype=bool))
        if keep.size == 0:
            return
        prefix = reqs.column("prefix_len").to_numpy(zero_copy_only=False)
        drafts = reqs.column("draft_tokens").take(pa.array(keep)).to_pylist()
        with self._lock:
            touched = set()
            for j, i in enumerate(keep.tolist()):
                self._steps.setdefault(rid[i], []).append((int(prefix[i]), int(w[i]), int(c[i]),
                                                           np.asarray(drafts[j], dtype=np.int64)))
                touched.add(rid[i])
            self._waiting += keep.size
            for r in touched & self._done.keys():
                self._resolve(r)
            self._bound()

    def on_request(self, row: dict, tokens: Optional[pa.Table]) -> None:
        """A finished request: its output tokens resolve its censored steps (greedy only)."""
        rid, temp = row.get("rid"), row.get("temperature")
        kind = "unknown" if temp is None else "greedy" if float(temp) == 0.0 else "sampled"
        with self._lock:
            self.requests[kind] += 1
            if kind != "greedy" or tokens is None or tokens.num_rows == 0 or row.get("prompt_tokens") is None:
                self._drop(rid)
                return
            pos = tokens.column("pos").to_numpy(zero_copy_only=False).astype(np.int64)
            ids = tokens.column("token_id").to_numpy(zero_copy_only=False).astype(np.int64)
            out = np.full(int(pos.max()) + 1, NO_TOKEN, dtype=np.int64)
            out[pos] = ids
            self._done[rid] = (out, int(row["prompt_tokens"]), row.get("finish_reason") == "stop")
            while len(self._done) > self.keep_finished:
                self._done.popitem(last=False)
            self._resolve(rid)

    def _resolve(self, rid: str) -> None:
        steps = self._steps.pop(rid, [])
        if not steps:
            return
        self._waiting -= len(steps)
        out, prompt, natural_end = self._done[rid]
        gamma = max(len(s[3]) for s in steps)
        drafts = np.full((len(steps), gamma), NO_TOKEN, dtype=np.int64)
        for j, s in enumerate(steps):
            drafts[j, :len(s[3])] = s[3]
        first = np.array([s[0] - prompt + 1 for s in steps])[:, None]  # output position of d_1
        at = first + np.arange(gamma)[None, :]
        realised = np.where((at >= 0) & (at < out.size), out[np.clip(at, 0, out.size - 1)], NO_TOKEN)
        window = np.array([s[1] for s in steps])
        correct = np.array([s[2] for s in steps])
        walk = walk_blocks(drafts, window, correct, realised, np.full(len(steps), natural_end))
        a = walk.matched.astype(np.float64)  # greedy: a trimmed draft is accepted iff it is the committed token
        self.totals["steps"] += len(steps)
        self.totals["lo"] += float((ceiling_from_factors(walk, a, tail=0.0) - correct).sum())
        self.totals["hi"] += float((ceiling_from_factors(walk, a, tail=1.0) - correct).sum())

    def _drop(self, rid: Optional[str]) -> None:
        steps = self._steps.pop(rid, []) if rid is not None else []
        self._waiting -= len(steps)

    def _bound(self) -> None:
        while self._waiting > self.max_waiting_steps and self._steps:
            rid = next(iter(self._steps))
            self.totals["dropped"] += len(self._steps[rid])
            self._drop(rid)

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        with self._lock:
            for name, key, doc in (
                    ("ceiling_request_steps", "steps", "Censored request-steps whose ceiling the sidecar resolved "
                     "(greedy requests)"),
                    ("tokens_lost_lo", "lo", "Tokens lost to trimming, lower end: sum of ceiling - accepted drafts"),
                    ("tokens_lost_hi", "hi", "Tokens lost to trimming, upper end (differs where the output was cut)"),
                    ("ceiling_dropped_request_steps", "dropped", "Censored request-steps dropped unresolved (their "
                     "request never finished within the bound)")):
                fam = CounterMetricFamily(NS + name, doc)
                fam.add_metric([], self.totals[key])
                yield fam
            fam = CounterMetricFamily(NS + "ceiling_requests", "Finished requests seen by the live ceiling, by "
                                      "sampling (only greedy ones are estimated live)", labels=["sampling"])
            for kind, n in self.requests.items():
                fam.add_metric([kind], n)
            yield fam

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self.totals, "requests": dict(self.requests), "waiting": self._waiting}
