"""Schedule replay: re-plan logged steps with ``dspark_obs.scheduler`` and ask "what if".

**Conformance.**  For every decode step of a run, rebuild what the server's planner saw
and run the one scheduler implementation on it:

* confidences are the recorded (4-decimal) ones; survival is their float32 ``cumprod``;
* the budget uses the survivals of the step ``lag_steps`` *decode* steps earlier on the
  same DP rank and server segment (ordered by ``forward_ct``; prefill batches between
  steps do not count); a request absent from that step is fresh and gets ones; the first
  ``lag_steps`` steps of a segment see only fresh requests;
* windows come from the current survivals and the replayed budget; ties between requests
  follow the batch order, which is the order of a record's ``reqs`` (the store keeps it).

A step *matches* when every replayed ``verify_len`` equals the logged one.  A step whose
lag window straddles a collection gap (a clear or a deque wrap may have swallowed a decode
step) has unknown history; it is counted apart, not as a mismatch.

**What-if.**  Re-plan the same steps with recalibrated confidences (an STS JSON:
``c' = sigmoid(logit(c) * T_current / T_new)`` per position) or another cost table, and
price the outcome: per request-step the committed tokens are ``min(block, w') + 1`` where
``block`` is the full-block acceptance (drafts a full verify would accept) and ``w'`` the
new window.  ``block`` comes, in order of preference, from the truth (emulator
``emu_block_accept``, a static or cap-accept step, a step whose window rejected a draft, a
cap-accept companion), else from a ``ceiling`` result table ``[lo, mid, hi]``, else from the
survival-based expectation ``w + sum_{k>w} S_k / S_w`` within ``[w, gamma]``.  Step time
comes from a cost table at the tokens the target would run (compact: the smallest observed
graph tier above ``sum(verify_len')``; static and cap-accept: the full block).  The batches
are the logged ones: a what-if does not re-simulate who is running when.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs import costtable as ct
from dspark_obs import schema
from dspark_obs import sql as sqlmod
from dspark_obs.estimators.calibration.recalibration import apply_survival_map
from dspark_obs.estimators.costmodel import TIMERS, fitted_table_of
from dspark_obs.estimators.pairing import companion_of, paired_steps
from dspark_obs.scheduler import ScheduleConfig, survival_from_confidence, verify_lens_topk, verify_token_budget

__all__ = [
    "SOURCES", "StepLog", "recalibrate", "lag_indices", "replay_schedule", "conformance", "block_acceptance",
    "price_schedule", "ReplayReport", "load_step_log", "replay_run", "write_results",
]

DEFAULT_LAG_STEPS = 2

_f64, _i64, _str = pa.float64(), pa.int64(), pa.string()


_field = schema.field  # a documented column


# -- pure functions ----------------------------------------------------------------

@dataclass(frozen=True)
class StepLog:
    """A run's decode steps in replay order with their request rows (CSR by ``row_ptr``).

    Step arrays have length S, row arrays length R = ``row_ptr[-1]``; rows of step i
    are ``row_ptr[i]:row_ptr[i+1]`` in batch order.
    """

    gamma: int
    mode: str
    dp_rank: np.ndarray
    segment: np.ndarray
    forward_ct: np.ndarray
    budget: np.ndarray  # logged budget, -1 where absent
    lag_steps: np.ndarray
    unknown_history: np.ndarray  # bool
    num_verify_tokens: np.ndarray
    measured_s: np.ndarray  # nan where absent
    row_ptr: np.ndarray
    rid: np.ndarray  # int codes
    confidence: np.ndarray  # [R, gamma] float32
    verify_len: np.ndarray
    acc_len: np.ndarray
    block_lo: np.ndarray  # full-block accepted drafts: [lo, mid, hi] per row
    block_mid: np.ndarray
    block_hi: np.ndarray
    block_source: np.ndarray  # index into SOURCES per row

    @property
    def acceptance_source(self) -> str:
        """The weakest source any request-step needed."""
        return SOURCES[int(self.block_source.max())] if self.block_source.size else "truth"

    @property
    def estimated_share(self) -> float:
        """Share of request-steps whose full-block acceptance is an estimate, not truth."""
        return float(np.mean(self.block_source > 0)) if self.block_source.size else 0.0

    @property
    def num_steps(self) -> int:
        return int(self.forward_ct.size)

    @property
    def bs(self) -> np.ndarray:
        return np.diff(self.row_ptr)


def recalibrate(confidence: np.ndarray, t_current: Sequence[float], t_new: Sequence[float]) -> np.ndarray:
    """``sigmoid(logit(c) * T_current / T_new)`` per position, float32; unchanged where equal.

    >>> recalibrate(np.array([[0.5, 0.8]]), [1, 1], [2, 1]).tolist()
    [[0.5, 0.800000011920929]]
    """
    conf = np.asarray(confidence, dtype=np.float32)
    gamma = conf.shape[-1]
    ratio = _temperatures(t_current, gamma, "current") / _temperatures(t_new, gamma, "new")
    with np.errstate(divide="ignore", over="ignore"):
        c = conf.astype(np.float64)
        logit = np.log(c) - np.log1p(-c)
        new = 1.0 / (1.0 + np.exp(-logit * ratio))
    return np.where(ratio == 1.0, conf, new.astype(np.float32))


def confidence_from_survival(survival: np.ndarray) -> np.ndarray:
    """Conditional confidences ``c_k = S_k / S_{k-1}`` (``S_0 = 1``; 0 after a zero survival), float32.

    >>> confidence_from_survival(np.array([[0.8, 0.4, 0.0]])).tolist()
    [[0.800000011920929, 0.5, 0.0]]
    """
    s = np.asarray(survival, dtype=np.float64)
    prev = np.hstack([np.ones((s.shape[0], 1)), s[:, :-1]])
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(prev > 0, s / prev, 0.0)
    return np.clip(c, 0.0, 1.0).astype(np.float32)


def _temperatures(t: Sequence[float], gamma: int, which: str) -> np.ndarray:
    arr = np.asarray(list(t), dtype=np.float64)
    if arr.size < gamma or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{which} STS temperatures must be {gamma} positive numbers (one per draft "
                         f"position), got {arr.tolist()}")
    return arr[:gamma]


def lag_indices(dp_rank: np.ndarray, segment: np.ndarray, lag_steps: np.ndarray) -> np.ndarray:
    """Index of each step's lagged step (same rank and segment, ``lag`` steps back); -1 if none.

    Steps must be sorted by (dp_rank, segment, forward_ct).

    >>> lag_indices(np.array([0, 0, 0, 1, 1, 1]), np.zeros(6, int), np.full(6, 2)).tolist()
    [-1, -1, 0, -1, -1, 3]
    """
    n = np.asarray(dp_rank).size
    idx = np.arange(n)
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (np.diff(dp_rank) != 0) | (np.diff(segment) != 0)
    group_start = np.maximum.accumulate(np.where(new_group, idx, 0))
    lag = np.asarray(lag_steps, dtype=np.int64)
    back = idx - lag
    return np.where((lag > 0) & (back >= group_start), back, -1)


def replay_schedule(log: StepLog, table: ct.CostTable, *, confidence: Optional[np.ndarray] = None,
                    cfg: Optional[ScheduleConfig] = None) -> tuple[np.ndarray, np.ndarray]:
    """Re-plan every step: ``(budget [S], verify_len [R])`` from the one scheduler.

    ``confidence`` replaces the logged confidences (e.g. recalibrated ones).
    """
    cfg = cfg or ScheduleConfig(gamma=log.gamma)
    conf = log.confidence if confidence is None else np.asarray(confidence, dtype=np.float32)
    surv = survival_from_confidence(conf)
    lag_idx = lag_indices(log.dp_rank, log.segment, log.lag_steps)
    ptr = log.row_ptr
    budgets = np.zeros(log.num_steps, dtype=np.int64)
    lens = np.zeros(ptr[-1], dtype=np.int32)
    for i in range(log.num_steps):
        lo, hi = ptr[i], ptr[i + 1]
        hist = np.ones((hi - lo, log.gamma), dtype=np.float32)
        j = lag_idx[i]
        if j >= 0:  # requests of step j keep their survival row; the rest are fresh
            prev = log.rid[ptr[j]:ptr[j + 1]]
            order = np.argsort(prev, kind="stable")
            pos = np.minimum(np.searchsorted(prev[order], log.rid[lo:hi]), order.size - 1)
            found = prev[order][pos] == log.rid[lo:hi]
            hist[found] = surv[ptr[j] + order[pos[found]]]
        decision = verify_token_budget(hist, table, cfg)
        budgets[i] = decision.budget
        lens[lo:hi] = verify_lens_topk(surv[lo:hi], decision.budget, cfg)
    return budgets, lens


def conformance(log: StepLog, budgets: np.ndarray, verify_lens: np.ndarray) -> dict:
    """Steps (with known history) whose replayed windows and budget equal the logged ones."""
    ok_rows = (verify_lens == log.verify_len).astype(np.int64)
    bad_per_step = np.add.reduceat(1 - ok_rows, log.row_ptr[:-1]) if ok_rows.size else np.zeros(0, np.int64)
    known = ~log.unknown_history
    steps = int(known.sum())
    matching = int((known & (bad_per_step == 0)).sum())
    return {"steps": steps, "matching_steps": matching, "share": matching / steps if steps else None,
            "budget_matches": int((known & (budgets == log.budget)).sum()),
            "unknown_history_steps": int((~known).sum())}


def expected_block_accept(survival: np.ndarray, window: np.ndarray) -> np.ndarray:
    """``E[block | first w drafts accepted] = w + sum_{k>w} S_k / S_w`` per row.

    >>> expected_block_accept(np.array([[0.5, 0.25, 0.125]]), np.array([1])).tolist()
    [1.75]
    """
    surv = np.asarray(survival, dtype=np.float64)
    w = np.asarray(window, dtype=np.int64)
    gamma = surv.shape[1]
    padded = np.hstack([np.ones((surv.shape[0], 1)), surv])
    s_w = padded[np.arange(surv.shape[0]), w]
    tail_mask = np.arange(1, gamma + 1)[None, :] > w[:, None]
    tail = np.where(tail_mask, surv, 0.0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        extra = np.where(s_w > 0, tail / s_w, 0.0)
    return w + extra


SOURCES = ("truth", "ceiling", "survival")


def block_acceptance(*, mode: str, gamma: int, window: np.ndarray, correct_drafts: np.ndarray,
                     cap_trim: np.ndarray, survival: np.ndarray, truth: Optional[np.ndarray] = None,
                     ceiling: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Full-block accepted drafts per request-step as ``(lo, mid, hi, source)``.

    ``source`` indexes :data:`SOURCES` per row.  ``truth`` (nan where unknown) is emulator
    or companion truth; ``ceiling`` holds the ceiling table's ``(lo, mid, hi)`` in drafts
    (nan where it has no row).  Static and cap-accept steps, and steps whose window
    rejected a draft, are exact regardless.

    >>> lo, mid, hi, src = block_acceptance(mode="compact", gamma=3, window=np.array([1, 1]),
    ...     correct_drafts=np.array([0, 1]), cap_trim=np.zeros(2), survival=np.array([[.5, .25, .125]] * 2))
    >>> lo.tolist(), mid.tolist(), hi.tolist(), [SOURCES[i] for i in src]
    ([0.0, 1.0], [0.0, 1.75], [0.0, 3.0], ['truth', 'survival'])
    """
    window = np.asarray(window, dtype=np.int64)
    correct = np.asarray(correct_drafts, dtype=np.float64)
    n = window.size
    lo = np.full(n, np.nan)
    if mode == "static":
        lo[:] = correct
    elif mode == "cap-accept":
        lo[:] = correct + np.asarray(cap_trim, dtype=np.float64)
    if truth is not None:
        lo = np.where(np.isnan(lo), np.asarray(truth, dtype=np.float64), lo)
    exact_inside = (correct < window) | (window >= gamma)
    lo = np.where(np.isnan(lo) & exact_inside, correct, lo)
    mid, hi = lo.copy(), lo.copy()
    source = np.zeros(n, dtype=np.int8)
    todo = np.isnan(mid)
    if todo.any() and ceiling is not None:
        c_lo, c_mid, c_hi = (np.asarray(a, dtype=np.float64) for a in ceiling)
        use = todo & np.isfinite(c_mid)
        lo[use], mid[use], hi[use] = c_lo[use], c_mid[use], c_hi[use]
        source[use] = 1
        todo = np.isnan(mid)
    if todo.any():
        sel = np.flatnonzero(todo)
        lo[sel] = window[sel]
        hi[sel] = gamma
        mid[sel] = expected_block_accept(np.asarray(survival)[sel], window[sel])
        source[sel] = 2
    return lo, mid, hi, source


def observed_tiers(mode: str, num_verify_tokens: np.ndarray) -> np.ndarray:
    """The graph tiers a compact run was seen to replay (sorted, unique, positive)."""
    if mode != "compact":
        return np.zeros(0, dtype=np.int64)
    t = np.asarray(num_verify_tokens, dtype=np.int64)
    return np.unique(t[t > 0])


def target_tokens_for(mode: str, gamma: int, bs: np.ndarray, total_verify: np.ndarray,
                      tiers: np.ndarray) -> np.ndarray:
    """Tokens the target runs: compact rounds ``sum(verify_len)`` up to a tier; else the full block."""
    bs = np.asarray(bs, dtype=np.int64)
    if mode != "compact":
        return bs * (gamma + 1)
    total = np.asarray(total_verify, dtype=np.int64)
    if tiers.size == 0:
        return total
    idx = np.searchsorted(tiers, total, side="left")
    return np.where(idx < tiers.size, tiers[np.minimum(idx, tiers.size - 1)], total)


def price_schedule(log: StepLog, verify_lens: np.ndarray, time_table: ct.CostTable,
                   *, tiers: Optional[np.ndarray] = None) -> dict:
    """Committed tokens and step time of ``verify_lens`` on the logged batches."""
    tiers = observed_tiers(log.mode, log.num_verify_tokens) if tiers is None else tiers
    window = np.asarray(verify_lens, dtype=np.int64) - 1
    starts = log.row_ptr[:-1]
    tokens = {k: np.add.reduceat(np.minimum(b, window) + 1.0, starts)
              for k, b in (("lo", log.block_lo), ("mid", log.block_mid), ("hi", log.block_hi))}
    total = np.add.reduceat(np.asarray(verify_lens, dtype=np.int64), starts)
    m = target_tokens_for(log.mode, log.gamma, log.bs, total, tiers)
    seconds = np.asarray(time_table.step_seconds(num_reqs=log.bs, budget=m - log.bs), dtype=np.float64)
    return _summary(log, tokens, seconds)


def _summary(log: StepLog, tokens: dict[str, np.ndarray], seconds: np.ndarray) -> dict:
    ok = np.isfinite(seconds) & (seconds > 0)
    out = {"steps": int(ok.sum())}
    if not ok.any():
        return {**out, "accepted_tokens_mean": None, "accepted_tokens_lo": None, "accepted_tokens_hi": None,
                "acc_len_mean": None, "step_ms_mean": None, "tokens_per_s": None,
                "tokens_per_s_lo": None, "tokens_per_s_hi": None}
    out["accepted_tokens_mean"] = float(tokens["mid"][ok].mean())
    out["accepted_tokens_lo"] = float(tokens["lo"][ok].mean())
    out["accepted_tokens_hi"] = float(tokens["hi"][ok].mean())
    out["acc_len_mean"] = float(tokens["mid"][ok].sum() / log.bs[ok].sum())
    out["step_ms_mean"] = float(seconds[ok].mean() * 1e3)
    for key, name in (("mid", "tokens_per_s"), ("lo", "tokens_per_s_lo"), ("hi", "tokens_per_s_hi")):
        rate = 0.0
        for rank in np.unique(log.dp_rank[ok]):
            sel = ok & (log.dp_rank == rank)
            rate += tokens[key][sel].sum() / seconds[sel].sum()
        out[name] = float(rate)
    return out


def logged_outcome(log: StepLog) -> dict:
    """What the run did: committed tokens and measured step time."""
    acc = np.add.reduceat(log.acc_len.astype(np.float64), log.row_ptr[:-1])
    return _summary(log, {"lo": acc, "mid": acc, "hi": acc}, log.measured_s)


# -- thin layer ----------------------------------------------------------------------

_STEPS_SQL = """
SELECT dp_rank, segment, forward_ct, bs, mode, coalesce(budget, -1) AS budget,
       coalesce(lag_steps, $default_lag) AS lag_steps, num_verify_tokens, {timer} AS measured_ms
FROM steps WHERE run_id = $run AND bs > 0
"""
# No ORDER BY: DuckDB preserves insertion order (files sort by time, rows keep record
# order), and a step's request order is the batch order the scheduler broke ties by.
_REQS_SQL = """
SELECT dp_rank, segment, forward_ct, rid, req_pool_index, verify_len, acc_len, correct_drafts,
       cap_trim, confidence, emu_block_accept
FROM step_reqs WHERE run_id = $run
"""


@dataclass
class ReplayReport:
    run: str
    table_note: str
    time_model: str
    conformance: dict
    whatif: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def load_step_log(con, run: str, *, timer: str = "step_gpu_ms", use_emulator_truth: bool = True,
                  use_companion: bool = True, default_lag: int = DEFAULT_LAG_STEPS) -> StepLog:
    """Read one run's decode steps and request rows into a :class:`StepLog`.

    ``use_emulator_truth=False`` ignores ``emu_block_accept`` (to see what a real server's
    data would give); ``use_companion=False`` ignores a cap-accept companion run.
    """
    sqlmod.refresh(con)
    info = con.sql("SELECT mode, gamma FROM runs WHERE run_id = $run", params={"run": run}).fetchall()
    steps = con.sql(_STEPS_SQL.format(timer=_timer(timer)),
                    params={"run": run, "default_lag": default_lag}).to_arrow_table()
    if steps.num_rows == 0:
        raise ValueError(f"run {run!r} has no decode steps; list runs with `dspark-obs sql --data D run_overview`")
    reqs = con.sql(_REQS_SQL, params={"run": run}).to_arrow_table()
    modes = set(steps.column("mode").to_pylist()) - {""}
    mode = (info[0][0] if info and info[0][0] else None) or (modes.pop() if len(modes) == 1 else "")
    if mode == "static":
        raise ValueError(f"run {run!r} is static: static steps carry no confidences and no budget, so there "
                         "is nothing to replay; replay a compact or cap-accept run")
    if reqs.num_rows == 0 or reqs.column("confidence").null_count == reqs.num_rows:
        raise ValueError(f"run {run!r} has no request confidences; collect with the 'reqs' component "
                         "(SGLANG_DSPARK_DEBUG_DUMP=...,reqs)")
    steps = steps.take(np.argsort(_step_code(steps), kind="stable"))
    reqs = reqs.take(np.argsort(_step_code(reqs), kind="stable"))  # stable: keeps the batch order
    step_code, row_code = _step_code(steps), _step_code(reqs)
    if np.setdiff1d(row_code, step_code).size:
        raise ValueError(f"run {run!r}: some step_reqs rows have no steps row; the store is inconsistent "
                         "(re-collect the run)")
    ptr = np.searchsorted(row_code, step_code, side="left")
    ptr_end = np.searchsorted(row_code, step_code, side="right")
    keep = ptr_end > ptr  # steps without request rows cannot be replayed
    if not keep.all():
        steps = steps.filter(pa.array(keep))
        ptr, ptr_end = ptr[keep], ptr_end[keep]
    row_ptr = np.concatenate([ptr, ptr_end[-1:]]).astype(np.int64)
    conf_col = reqs.column("confidence")
    if conf_col.null_count:
        raise ValueError(f"run {run!r}: {conf_col.null_count} request-steps lack confidences; "
                         "collect with the 'reqs' component for every step")
    gamma = int(info[0][1]) if info and info[0][1] else len(conf_col[0].as_py())
    conf = np.asarray(pc.list_flatten(conf_col).to_numpy(zero_copy_only=False), dtype=np.float32)
    conf = conf.reshape(-1, gamma)
    # A request is its rid; a server that sends no rid leaves its pool slot as the key.
    rid = pc.if_else(pc.is_null(reqs.column("rid")),
                     pc.binary_join_element_wise("#pool", pc.cast(reqs.column("req_pool_index"), pa.string()), ""),
                     reqs.column("rid"))
    rid_codes = pc.dictionary_encode(rid).combine_chunks().indices
    verify_len = reqs.column("verify_len").to_numpy().astype(np.int64)
    correct = reqs.column("correct_drafts").to_numpy().astype(np.int64)
    dp = steps.column("dp_rank").to_numpy().astype(np.int64)
    seg = steps.column("segment").to_numpy().astype(np.int64)
    fct = steps.column("forward_ct").to_numpy().astype(np.int64)
    lag = steps.column("lag_steps").to_numpy().astype(np.int64)
    truth = np.full(reqs.num_rows, np.nan)
    if use_emulator_truth:
        truth = reqs.column("emu_block_accept").to_numpy(zero_copy_only=False).astype(np.float64)
    companion = _companion_truth(con, run, reqs) if use_companion else None
    if companion is not None:
        truth = np.where(np.isnan(truth), companion, truth)
    ceiling = _ceiling(con, run, reqs, gamma)
    lo, mid, hi, source = block_acceptance(
        mode=mode, gamma=gamma, window=verify_len - 1, correct_drafts=correct,
        cap_trim=reqs.column("cap_trim").to_numpy(), survival=survival_from_confidence(conf),
        truth=truth, ceiling=ceiling)
    measured = steps.column("measured_ms").to_numpy(zero_copy_only=False).astype(np.float64) / 1e3
    return StepLog(
        gamma=gamma, mode=mode, dp_rank=dp, segment=seg, forward_ct=fct,
        budget=steps.column("budget").to_numpy().astype(np.int64), lag_steps=lag,
        unknown_history=_after_gaps(con, run, dp, seg, fct, lag),
        num_verify_tokens=steps.column("num_verify_tokens").to_numpy().astype(np.int64),
        measured_s=measured, row_ptr=row_ptr, rid=np.asarray(rid_codes.to_numpy(), dtype=np.int64),
        confidence=conf, verify_len=verify_len,
        acc_len=reqs.column("acc_len").to_numpy().astype(np.int64),
        block_lo=lo, block_mid=mid, block_hi=hi, block_source=source)


def _timer(timer: str) -> str:
    if timer not in TIMERS:
        raise ValueError(f"timer {timer!r} is not one of {', '.join(TIMERS)} (--timer)")
    return timer


def _step_code(t: pa.Table) -> np.ndarray:
    """One sortable int64 per (dp_rank, segment, forward_ct)."""
    dp, seg, fct = (t.column(c).to_numpy().astype(np.int64) for c in ("dp_rank", "segment", "forward_ct"))
    return (dp << 52) | (seg << 40) | fct


def _after_gaps(con, run: str, dp: np.ndarray, seg: np.ndarray, fct: np.ndarray,
                lag: np.ndarray) -> np.ndarray:
    """Steps within ``lag`` records after a collection gap on their rank and segment."""
    unknown = np.zeros(fct.size, dtype=bool)
    gaps = con.sql("SELECT dp_rank, segment, last_missing_forward_ct FROM gaps "
                   "WHERE run_id = $run AND last_missing_forward_ct >= 0", params={"run": run}).fetchall()
    for g_dp, g_seg, g_last in gaps:
        group = np.flatnonzero((dp == g_dp) & (seg == g_seg))
        after = group[fct[group] > g_last]
        if after.size:
            unknown[after[: max(int(lag[after[0]]), 0)]] = True
    return unknown


def _companion_truth(con, run: str, reqs: pa.Table) -> Optional[np.ndarray]:
    companion = companion_of(con, run)
    if companion is None:
        return None
    paired = paired_steps(con, run, companion)
    lookup = {(r["rid"], r["forward_ct"], r["dp_rank"]): r["true_block_accept"]
              for r in paired.to_pylist() if r["same_drafts"]}
    keys = zip(reqs.column("rid").to_pylist(), reqs.column("forward_ct").to_pylist(),
               reqs.column("dp_rank").to_pylist())
    return np.array([lookup.get(k, np.nan) for k in keys], dtype=np.float64)


def _ceiling(con, run: str, reqs: pa.Table, gamma: int) -> Optional[tuple[np.ndarray, ...]]:
    """The ``ceiling`` result table's ``(lo, mid, hi)`` (drafts, 0..gamma) for ``run``, row for row of ``reqs``.

    When several methods were stored, ``default`` wins over the others.  The
    join runs in DuckDB (a run of millions of steps as Python tuples would take
    gigabytes); steps without a ceiling row get NaN.
    """
    views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    if "ceiling" not in views:
        return None
    keys = pa.table({"i": pa.array(np.arange(reqs.num_rows, dtype=np.int64)),
                     **{c: reqs.column(c) for c in ("rid", "forward_ct", "dp_rank", "segment")}})
    con.register("_replay_ceiling_keys", keys)
    try:
        if not con.sql("SELECT count(*) FROM ceiling WHERE run_id = $run", params={"run": run}).fetchall()[0][0]:
            return None
        got = con.sql("""
            WITH c AS (
                SELECT rid, forward_ct, dp_rank, segment, lo, mid, hi FROM ceiling WHERE run_id = $run
                QUALIFY row_number() OVER (PARTITION BY rid, forward_ct, dp_rank, segment
                                           ORDER BY coalesce(method, '') = 'default' DESC) = 1
            )
            SELECT c.lo, c.mid, c.hi
            FROM _replay_ceiling_keys AS k
            LEFT JOIN c ON c.rid IS NOT DISTINCT FROM k.rid AND c.forward_ct = k.forward_ct
                       AND c.dp_rank = k.dp_rank AND c.segment IS NOT DISTINCT FROM k.segment
            ORDER BY k.i""", params={"run": run}).to_arrow_table()
    except Exception:  # a ceiling table of another shape: fall back to the survival expectation
        return None
    finally:
        con.unregister("_replay_ceiling_keys")
    vals = [np.clip(got.column(c).to_numpy(zero_copy_only=False).astype(np.float64), 0.0, gamma)
            for c in ("lo", "mid", "hi")]
    return vals[0], vals[1], vals[2]


def planning_table(con, run: str) -> tuple[ct.CostTable, str]:
    """The cost table the run's server planned with, and where that knowledge came from."""
    rows = con.sql("SELECT server_info, gamma FROM runs WHERE run_id = $run", params={"run": run}).fetchall()
    info = {}
    if rows and rows[0][0]:
        try:
            info = json.loads(rows[0][0])
        except ValueError:
            pass
    info = info if isinstance(info, dict) else {}
    path = info.get("speculative_dspark_sps_table_path")
    if path:
        try:
            return ct.load(path), f"server's --speculative-dspark-sps-table-path {path}"
        except (OSError, ValueError) as exc:
            raise ValueError(f"the run's cost table {path} cannot be read ({exc}); pass it with --sps-table FILE")
    if info.get("emulator") and info.get("emulator_sps_table") != "none":  # none: as SGLang without a table
        return ct.default_additive_table(), "emulator default additive table"
    if not info:
        return ct.default_additive_table(), "default additive table (the run has no server_info; --sps-table FILE)"
    gamma = int(rows[0][1] or 6)
    max_tokens = int(info.get("max_running_requests") or 256) * (gamma + 1)
    return ct.uninitialized_table(max_batch_tokens=max_tokens), "SGLang's uninitialised flat table (no table path)"


def replay_run(con, run: str, *, sps_table: Optional[ct.CostTable] = None,
               sts_temperatures: Optional[Sequence[float]] = None,
               current_temperatures: Optional[Sequence[float]] = None,
               survival_maps: Optional[Sequence] = None,
               whatif_table: Optional[ct.CostTable] = None, time_table: Optional[ct.CostTable] = None,
               use_emulator_truth: bool = True, use_companion: bool = True,
               timer: str = "step_gpu_ms") -> ReplayReport:
    """Conformance of ``run`` and its what-if scenarios (see the module docstring).

    ``survival_maps`` (:func:`~dspark_obs.estimators.calibration.recalibration.load_survival_map`)
    re-plans with recalibrated survivals (scenario ``recalibration``).
    ``sps_table`` is the table the server planned with (default: :func:`planning_table`);
    ``whatif_table`` another one to plan with; ``time_table`` prices steps (default: the
    run's ``costmodel_fit``, else the planning table).
    """
    log = load_step_log(con, run, timer=timer, use_emulator_truth=use_emulator_truth,
                        use_companion=use_companion)
    if sps_table is None:
        sps_table, table_note = planning_table(con, run)
    else:
        table_note = "--sps-table"
    time_note = "time_table argument"
    if time_table is None:
        time_table = fitted_table_of(con, run)
        time_note = "costmodel fit of the run"
        if time_table is None:
            time_table, time_note = sps_table, f"planning table ({table_note})"
            if ct.is_uninitialized(time_table):
                time_table, time_note = ct.default_additive_table(), "default additive table"
    cfg = ScheduleConfig(gamma=log.gamma)
    budgets, lens = replay_schedule(log, sps_table, cfg=cfg)
    report = ReplayReport(run=run, table_note=table_note, time_model=time_note,
                          conformance={**conformance(log, budgets, lens), "table": table_note})
    base = {"acceptance_source": log.acceptance_source, "estimated_share": log.estimated_share,
            "time_model": time_note}
    report.whatif.append({"scenario": "logged", **logged_outcome(log), "acceptance_source": "logged",
                          "estimated_share": 0.0, "time_model": f"measured {timer}"})
    report.whatif.append({"scenario": "replay", **price_schedule(log, lens, time_table), **base})
    conf_new = None
    if sts_temperatures is not None:
        current = current_temperatures if current_temperatures is not None else [1.0] * log.gamma
        conf_new = recalibrate(log.confidence, current, sts_temperatures)
        _, lens_sts = replay_schedule(log, sps_table, confidence=conf_new, cfg=cfg)
        report.whatif.append({"scenario": "sts", **price_schedule(log, lens_sts, time_table), **base})
    if survival_maps is not None:
        conf_map = confidence_from_survival(apply_survival_map(survival_from_confidence(log.confidence),
                                                               list(survival_maps)))
        _, lens_map = replay_schedule(log, sps_table, confidence=conf_map, cfg=cfg)
        report.whatif.append({"scenario": "recalibration", **price_schedule(log, lens_map, time_table), **base})
    if whatif_table is not None:
        _, lens_t = replay_schedule(log, whatif_table, cfg=cfg)
        report.whatif.append({"scenario": "table", **price_schedule(log, lens_t, time_table), **base})
        if conf_new is not None:
            _, lens_both = replay_schedule(log, whatif_table, confidence=conf_new, cfg=cfg)
            report.whatif.append({"scenario": "sts+table", **price_schedule(log, lens_both, time_table), **base})
    if log.acceptance_source == "survival":
        report.notes.append(
            f"{np.mean(log.block_source == 2):.0%} of request-steps are censored with no truth or ceiling row: "
            "their full-block acceptance is the survival-based expectation within [window, gamma] "
            "(run `dspark-obs estimate` for ceiling rows, or collect a cap-accept companion)")
    return report


def write_results(store, report: ReplayReport) -> None:
    """Replace ``replay_conformance`` and ``replay_whatif`` of the report's run."""
    for table, rows in (("replay_conformance", [report.conformance]), ("replay_whatif", report.whatif)):
        store.drop_run(table, report.run)
        store.write(table, report.run, rows)
