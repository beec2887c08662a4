"""Re-planning logged steps with the one scheduler: the step log, recalibrated confidences, the lag.

:class:`StepLog` holds a run's decode steps as arrays; :func:`replay_schedule`
rebuilds each step's budget and windows with :mod:`dspark_obs.scheduler` and
:func:`conformance` compares them with the logged ones (the method is the
package's docstring, :mod:`dspark_obs.estimators.replay`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from dspark_obs import costtable as ct
from dspark_obs.rowwise import by_row_blocks
from dspark_obs.scheduler import ScheduleConfig, survival_from_confidence, verify_lens_topk_steps, verify_token_budgets

DEFAULT_LAG_STEPS = 2
SOURCES = ("truth", "ceiling", "survival")
"""Where a request-step's full-block acceptance came from, strongest first (:attr:`StepLog.block_source`)."""


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

    def rescaled(block: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", over="ignore"):
            c = block.astype(np.float64)
            logit = np.log(c) - np.log1p(-c)
            new = 1.0 / (1.0 + np.exp(-logit * ratio))
        return np.where(ratio == 1.0, block, new.astype(np.float32))

    return by_row_blocks(rescaled, conf) if conf.ndim == 2 else rescaled(conf)


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
                    cfg: Optional[ScheduleConfig] = None, sources: Optional[np.ndarray] = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Re-plan every step: ``(budget [S], verify_len [R])`` from the one scheduler.

    ``confidence`` replaces the logged confidences (e.g. recalibrated ones);
    ``sources`` is :func:`lag_sources` of the log, when the caller replays it more than once.  The logged steps do not depend on each other (each plans on logged
    survivals), so steps of one batch size are planned together, in blocks of
    about :data:`_BLOCK_CELLS` survivals.
    """
    cfg = cfg or ScheduleConfig(gamma=log.gamma)
    conf = log.confidence if confidence is None else np.asarray(confidence, dtype=np.float32)
    surv = survival_from_confidence(conf)
    sources = lag_sources(log) if sources is None else sources
    hist = by_row_blocks(lambda src: np.where((src >= 0)[:, None], surv[np.maximum(src, 0)], np.float32(1.0)), sources)
    ptr = log.row_ptr
    budgets = np.zeros(log.num_steps, dtype=np.int64)
    lens = np.zeros(ptr[-1], dtype=np.int32)
    bs = log.bs
    for size in np.unique(bs):
        same = np.flatnonzero(bs == size)
        per_block = max(1, _BLOCK_CELLS // (int(size) * log.gamma))
        for at in range(0, same.size, per_block):
            steps = same[at:at + per_block]
            rows = ptr[steps][:, None] + np.arange(size)
            budgets[steps] = verify_token_budgets(hist[rows], table, cfg)
            lens[rows] = verify_lens_topk_steps(surv[rows], budgets[steps], cfg)
    return budgets, lens


_BLOCK_CELLS = 1 << 20
"""Survivals planned at once by :func:`replay_schedule` (bounds its working memory to tens of MB)."""


def lag_sources(log: StepLog) -> np.ndarray:
    """Each row's history source for the budget: its request's row at the lagged step, -1 when the request
    is not there (fresh) or the step has no lagged step (int64 [R]; the same for every replay of a log)."""
    step_of = np.repeat(np.arange(log.num_steps), log.bs)
    width = int(log.rid.max()) + 1 if log.rid.size else 1
    keys = step_of * width + log.rid
    order = np.argsort(keys, kind="stable")
    lag_idx = lag_indices(log.dp_rank, log.segment, log.lag_steps)[step_of]
    wanted = lag_idx * width + log.rid
    sorted_keys = keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, wanted), max(order.size - 1, 0))
    found = (lag_idx >= 0) & (sorted_keys[pos] == wanted) if order.size else np.zeros(0, bool)
    return np.where(found, order[pos] if order.size else pos, -1)


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
