"""A live ceiling estimate in the sidecar: tokens lost to trimming, exact for greedy requests, fitted for sampled.

For a greedy request a trimmed draft would have been accepted exactly when it
equals the token the target went on to commit at its position, so once the
request's output tokens are known (the driver's responses, or ``collect
--request-log``) each censored request-step's full-block acceptance follows
from :func:`dspark_obs.estimators.ceiling.walk.walk_blocks`, the walk the
offline estimator uses: ``lo`` counts the walked drafts that match (the
unverifiable rest at 0), ``hi`` the same with the rest accepted; the two agree
unless the output was cut before the walk ended.  A sampled request's trimmed
drafts are accepted with a probability only a fitted acceptance model gives:
with ``fit`` (``collect --ceiling-fit FILE``, written by ``dspark-obs estimate
--fit-out FILE`` on an earlier run of the same deployment) its censored steps
go through :func:`~dspark_obs.estimators.ceiling.estimate_ceiling` itself, with
that fit, so the live sums are what ``estimate --fit-in FILE`` writes for the
run; without one they are counted, not estimated.  Evidence and the alignment
check are the estimator's (:func:`~dspark_obs.estimators.ceiling.evidence.align_requests`),
over the request's censored steps.  Steps and tokens can arrive in either
order (a request's last steps may come with the poll after its response), so
censored steps wait for their request and finished requests wait, a bounded
while, for late steps.  Requests of unknown temperature are not estimated
live (``estimate`` infers their sampling from the whole run).

Counters: ``ceiling_request_steps_total`` (greedy censored request-steps
resolved), ``tokens_lost_lo_total`` / ``tokens_lost_hi_total`` (sum of
ceiling - accepted drafts), ``ceiling_sampled_request_steps_total`` and
``tokens_lost_sampled_{lo,mid,hi}_total`` (sampled, with a fit),
``ceiling_requests_total{sampling}``; gauge ``ceiling_fit_loaded``.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dspark_obs.estimators.ceiling import estimate_ceiling
from dspark_obs.estimators.ceiling.evidence import align_requests, padded_lists, token_index
from dspark_obs.estimators.ceiling.fit import CeilingFit
from dspark_obs.estimators.ceiling.walk import NO_TOKEN, ceiling_from_factors, walk_blocks

NS = "dspark_obs:"


class LiveCeiling:
    """Joins censored request-steps to their request's tokens as both arrive; a Prometheus collector."""

    def __init__(self, *, keep_finished: int = 4096, max_waiting_steps: int = 500_000,
                 fit: Optional[CeilingFit] = None) -> None:
        self.keep_finished, self.max_waiting_steps, self.fit = keep_finished, max_waiting_steps, fit
        self._lock = threading.Lock()
        self._steps: dict[str, list[_Step]] = {}
        self._waiting = 0
        self._done: OrderedDict[str, _Finished] = OrderedDict()
        self.totals = {"steps": 0.0, "lo": 0.0, "hi": 0.0, "dropped": 0.0}
        self.sampled = {"steps": 0.0, "lo": 0.0, "mid": 0.0, "hi": 0.0}
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
        taken = reqs.take(pa.array(keep))
        prefix = taken.column("prefix_len").to_numpy(zero_copy_only=False)
        bonus = taken.column("bonus_token").to_numpy(zero_copy_only=False)
        drafts = taken.column("draft_tokens").to_pylist()
        conf = taken.column("confidence").to_pylist() if "confidence" in taken.column_names else [None] * keep.size
        with self._lock:
            touched = set()
            for j, i in enumerate(keep.tolist()):
                self._steps.setdefault(rid[i], []).append(_Step(int(prefix[j]), int(w[i]), int(c[i]), int(bonus[j]),
                                                                drafts[j], conf[j]))
                touched.add(rid[i])
            self._waiting += keep.size
            for r in touched & self._done.keys():
                self._resolve(r)
            self._bound()

    def on_request(self, row: dict, tokens: Optional[pa.Table]) -> None:
        """A finished request: its output tokens resolve its censored steps (greedy; sampled with a fit)."""
        rid, temp = row.get("rid"), row.get("temperature")
        kind = "unknown" if temp is None else "greedy" if float(temp) == 0.0 else "sampled"
        with self._lock:
            self.requests[kind] += 1
            usable = kind == "greedy" or (kind == "sampled" and self.fit is not None)
            if not usable or tokens is None or tokens.num_rows == 0 or row.get("prompt_tokens") is None:
                self._drop(rid)
                return
            completion = row.get("completion_tokens")
            self._done[rid] = _Finished(tokens, int(row["prompt_tokens"]), row.get("finish_reason") == "stop",
                                        -1 if completion is None else int(completion), kind == "greedy")
            while len(self._done) > self.keep_finished:
                self._done.popitem(last=False)
            self._resolve(rid)

    def _resolve(self, rid: str) -> None:
        steps = self._steps.pop(rid, [])
        if not steps:
            return
        self._waiting -= len(steps)
        done = self._done[rid]
        gamma = max(len(s.drafts) for s in steps)
        drafts = np.full((len(steps), gamma), NO_TOKEN, dtype=np.int64)
        conf = np.full((len(steps), gamma), np.nan)
        for j, s in enumerate(steps):
            drafts[j, :len(s.drafts)] = s.drafts
            if s.confidence is not None:
                conf[j, :len(s.confidence)] = [np.nan if v is None else v for v in s.confidence]
        window = np.array([s.window for s in steps])
        correct = np.array([s.correct for s in steps])
        al = _aligned(done, steps, drafts, correct)
        if done.greedy:  # a trimmed draft is accepted iff it is the committed token
            walk = walk_blocks(drafts, window, correct, al.evidence.realised, al.natural_end)
            a = walk.matched.astype(np.float64)
            self.totals["steps"] += len(steps)
            self.totals["lo"] += float((ceiling_from_factors(walk, a, tail=0.0) - correct).sum())
            self.totals["hi"] += float((ceiling_from_factors(walk, a, tail=1.0) - correct).sum())
            return
        fit = self.fit
        if fit.gamma != gamma:
            self.totals["dropped"] += len(steps)
            return
        est = estimate_ceiling(drafts, window, correct, al.evidence, greedy=np.zeros(len(steps), bool),
                               natural_end=al.natural_end, confidence=conf, model=fit.acceptance, drafter=fit.drafter,
                               use_drafter=fit.use_drafter, binned_prior=fit.binned)
        self.sampled["steps"] += len(steps)
        for key, value in (("lo", est.lo), ("mid", est.mid), ("hi", est.hi)):
            self.sampled[key] += float((value - correct).sum())

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
            for key, doc in (("steps", "Censored request-steps of sampled requests whose ceiling the sidecar "
                                       "estimated (with collect --ceiling-fit)"),
                             ("lo", "Tokens lost to trimming, sampled requests, lower bound (any drafter)"),
                             ("mid", "Tokens lost to trimming, sampled requests, the fitted expectation"),
                             ("hi", "Tokens lost to trimming, sampled requests, upper bound (any drafter)")):
                name = "ceiling_sampled_request_steps" if key == "steps" else f"tokens_lost_sampled_{key}"
                yield CounterMetricFamily(NS + name, doc, value=self.sampled[key])
            g = GaugeMetricFamily(NS + "ceiling_fit_loaded", "1 when the live ceiling has a fit for sampled "
                                  "requests (collect --ceiling-fit FILE from estimate --fit-out FILE)")
            g.add_metric([], float(self.fit is not None))
            yield g
            fam = CounterMetricFamily(NS + "ceiling_requests", "Finished requests seen by the live ceiling, by "
                                      "sampling (greedy ones are estimated live; sampled ones with a fit)",
                                      labels=["sampling"])
            for kind, n in self.requests.items():
                fam.add_metric([kind], n)
            yield fam

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self.totals, "sampled": dict(self.sampled), "requests": dict(self.requests),
                    "waiting": self._waiting}


@dataclass(frozen=True)
class _Step:
    prefix: int
    window: int
    correct: int
    bonus: int
    drafts: list
    confidence: Optional[list]


@dataclass(frozen=True)
class _Finished:
    tokens: pa.Table
    prompt: int
    stop: bool
    completion: int  # -1 unknown
    greedy: bool


def _aligned(done: _Finished, steps: list[_Step], drafts: np.ndarray, correct: np.ndarray):
    """The estimator's evidence and alignment check over one request's censored steps and its tokens."""
    t, n = done.tokens, len(steps)
    index = token_index(np.zeros(t.num_rows, np.int64), t.column("pos").to_numpy(zero_copy_only=False).astype(np.int64),
                        t.column("token_id").to_numpy(zero_copy_only=False).astype(np.int64),
                        logprob=pc.fill_null(t.column("logprob"), float("nan")).to_numpy(zero_copy_only=False)
                        .astype(np.float64),
                        top_ids=padded_lists(t.column("top_ids"), fill=-1, dtype=np.int64),
                        top_logprobs=padded_lists(t.column("top_logprobs"), fill=np.nan, dtype=np.float64))
    first_pos = np.array([s.prefix - done.prompt + 1 for s in steps], dtype=np.int64)
    return align_requests(index, np.zeros(n, np.int64), 1, first_pos, drafts, correct,
                          np.array([s.bonus for s in steps], dtype=np.int64), token_counts=np.full(n, t.num_rows),
                          completion=np.full(n, done.completion), stop=np.full(n, done.stop))
