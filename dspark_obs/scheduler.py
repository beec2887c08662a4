"""The DSpark scheduler: per-step verify budget and per-request windows.

One implementation, used by the emulator to plan steps and by schedule replay
to re-plan logged ones.  It follows SGLang 0.5.23 exactly
(``dspark_planner.compute_verify_token_budget`` and
``dspark_schedule.schedule_verify_lens_topk``), and the fidelity tier checks it
against those functions on randomized cases:

* **budget**: all survivals ``S[r, j] >= survival_eps`` of the running requests,
  taken ``lag_steps`` decode steps earlier (fresh requests get ``S = 1``), sorted
  descending; ``tau*(k) = N + sum(top-k)``; ``k* = argmax_k tau*(k) / T(N, k)``
  (additive table) or ``argmax_k tau*(k) * SPS(N + k)`` (1-D table).  Global
  argmax over every k, first maximum wins.
* **windows**: ``verify_len_r = min_verify_len + #(entries of r among the global
  top-k*)`` over the *current* survivals, clamped to ``[max(min, 1), max_len]``;
  ties broken by value desc, position asc, request asc.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from dspark_obs.costtable import CostTable, SpsAdditiveCostTable
from dspark_obs.rowwise import by_row_blocks

SURVIVAL_EPS = 1e-6


@dataclass(frozen=True)
class ScheduleConfig:
    """SGLang's ``DSparkScheduleConfig``: ``max_verify_len=0`` means ``gamma + 1``."""

    gamma: int
    min_verify_len: int = 1
    max_verify_len: int = 0
    survival_eps: float = SURVIVAL_EPS

    @property
    def resolved_max_verify_len(self) -> int:
        return self.max_verify_len or (self.gamma + 1)

    def __post_init__(self) -> None:
        max_len = self.resolved_max_verify_len
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}.")
        if not 0 <= self.min_verify_len <= max_len <= self.gamma + 1:
            raise ValueError(
                "verify-len config must satisfy 0 <= min <= max <= gamma+1, got "
                f"min={self.min_verify_len}, max={max_len}, gamma={self.gamma}."
            )
        if self.survival_eps < 0:
            raise ValueError(f"survival_eps must be >= 0, got {self.survival_eps}.")


@dataclass(frozen=True)
class BudgetDecision:
    """The chosen budget ``k*`` and what the cost model predicted for it."""

    budget: int
    predicted_step_seconds: Optional[float]
    predicted_theta: float


def survival_from_confidence(confidence: np.ndarray) -> np.ndarray:
    """``S_k = c_1 ... c_k`` per row, bit-exact with SGLang's CPU ``torch.cumprod``.

    The inputs are float32, but torch's CPU kernel keeps the running product in
    double and rounds each output to float32; a float32 running product differs
    by an ulp often enough to flip ``survival_eps`` crossings and ties.
    """
    conf32 = np.asarray(confidence, dtype=np.float32)

    def survival(c: np.ndarray) -> np.ndarray:
        return np.cumprod(c.astype(np.float64), axis=-1).astype(np.float32)

    return survival(conf32) if conf32.ndim < 2 else by_row_blocks(survival, conf32)


def verify_token_budget(
    history_survival: np.ndarray, table: CostTable, cfg: ScheduleConfig
) -> BudgetDecision:
    """``k* = argmax_k tau*(k) / T(N, k)`` over the lagged survivals.

    ``history_survival`` is ``[N, gamma]`` float32, already lagged (rows of fresh
    requests all ones).  Returns the number of verify tokens above one per request.
    """
    surv = np.asarray(history_survival, dtype=np.float32)
    num_requests = surv.shape[0]
    cand = surv[:, : cfg.resolved_max_verify_len].ravel()
    cand = cand[cand >= cfg.survival_eps].astype(np.float64)
    tau = num_requests + np.concatenate(([0.0], np.cumsum(np.sort(cand)[::-1])))
    ks = np.arange(tau.size)
    if isinstance(table, SpsAdditiveCostTable):
        step_s = _additive_step_seconds(table, num_requests, tau.size)
        theta = tau / step_s
        idx = int(np.argmax(theta))
        predicted = float(step_s[idx])
    else:
        sps = table.steps_per_sec(num_requests + ks)
        theta = tau * sps
        idx = int(np.argmax(theta))
        predicted = 1.0 / float(sps[idx]) if sps[idx] > 0 else None
    return BudgetDecision(budget=idx, predicted_step_seconds=predicted,
                          predicted_theta=float(theta[idx]))


def _additive_step_seconds(table: SpsAdditiveCostTable, num_requests: int, n: int) -> np.ndarray:
    # Mirrors SGLang's tensor path: alpha through python interpolation, theta
    # through a clamped bucketize so single-probe tables behave identically.
    floor = table.bias_seconds + float(table.alpha(float(num_requests)))
    m_probes = np.asarray(table.m_probes, dtype=np.float64)
    theta_vals = np.asarray(table.theta_seconds, dtype=np.float64)
    m = np.clip(num_requests + np.arange(n, dtype=np.float64), m_probes[0], m_probes[-1])
    hi = np.clip(np.searchsorted(m_probes, m, side="right"), 1, m_probes.size - 1)
    lo = hi - 1
    span = np.maximum(m_probes[hi] - m_probes[lo], 1e-9)
    frac = (m - m_probes[lo]) / span
    return floor + theta_vals[lo] + frac * (theta_vals[hi] - theta_vals[lo])


def verify_lens_topk(survival: np.ndarray, budget: int, cfg: ScheduleConfig) -> np.ndarray:
    """Per-request ``verify_len`` from the current survivals and the budget.

    ``survival`` is ``[N, gamma]``; returns int32 ``[N]`` in
    ``[max(min_verify_len, 1), max_verify_len]``.
    """
    surv = np.asarray(survival, dtype=np.float32)
    num_requests = surv.shape[0]
    max_len = cfg.resolved_max_verify_len
    extra = np.zeros(num_requests, dtype=np.int64)
    window = surv[:, :max_len]
    if budget > 0 and window.size > 0:
        cols = window.shape[1]
        valid = (window >= cfg.survival_eps).ravel()
        prob = np.where(valid, window.ravel().astype(np.float64), -np.inf)
        req = np.repeat(np.arange(num_requests), cols)
        pos = np.tile(np.arange(cols), num_requests)
        order = np.lexsort((req, pos, -prob))  # value desc, position asc, request asc
        chosen = order[: min(int(budget), prob.size)]
        extra = np.bincount(req[chosen], weights=valid[chosen], minlength=num_requests).astype(np.int64)
    lens = cfg.min_verify_len + extra
    return np.clip(lens, max(cfg.min_verify_len, 1), max_len).astype(np.int32)


def lagged_survival(
    current_rids: list[str], history: dict[str, np.ndarray], gamma: int
) -> np.ndarray:
    """Survival rows for the budget: each request's row from ``lag`` steps ago.

    ``history`` maps rid to the survival it had at that earlier step; requests
    absent there are fresh and get all ones, as SGLang's generation check does.
    """
    out = np.ones((len(current_rids), gamma), dtype=np.float32)
    for i, rid in enumerate(current_rids):
        row = history.get(rid)
        if row is not None:
            out[i] = row
    return out


def verify_token_budgets(history_survival: np.ndarray, table: CostTable, cfg: ScheduleConfig) -> np.ndarray:
    """:func:`verify_token_budget`'s budget for S steps of one batch size at once (``[S, N, gamma]`` -> ``[S]``).

    For schedule replay, whose logged steps do not depend on each other: each
    row is sorted and summed in the same order as the one-step function, so the
    budgets are equal to it step by step (``tests/test_scheduler_batch.py``).
    """
    surv = np.asarray(history_survival, dtype=np.float32)
    steps, num_requests = surv.shape[:2]
    cand = surv[:, :, : cfg.resolved_max_verify_len].reshape(steps, -1).astype(np.float64)
    valid = cand >= cfg.survival_eps
    ranked = -np.sort(np.where(valid, -cand, np.inf), axis=1)   # descending, the excluded last (as -inf)
    sums = np.cumsum(np.where(valid.sum(axis=1, keepdims=True) > np.arange(ranked.shape[1]), ranked, 0.0), axis=1)
    tau = num_requests + np.hstack([np.zeros((steps, 1)), sums])
    if isinstance(table, SpsAdditiveCostTable):
        theta = tau / _additive_step_seconds(table, num_requests, tau.shape[1])
    else:
        theta = tau * table.steps_per_sec(num_requests + np.arange(tau.shape[1]))
    theta[np.arange(tau.shape[1]) > valid.sum(axis=1, keepdims=True)] = -np.inf   # beyond each step's candidates
    return np.argmax(theta, axis=1).astype(np.int64)


def verify_lens_topk_steps(survival: np.ndarray, budgets: np.ndarray, cfg: ScheduleConfig) -> np.ndarray:
    """:func:`verify_lens_topk` for S steps of one batch size at once (``[S, N, gamma]``, ``[S]`` -> ``[S, N]``).

    Each cell gets one sort key (its value descending, then its position-major
    index), so one sort per step breaks ties as the one-step function does
    (value desc, position asc, request asc) and the step's budget-th key is the
    cut; equal to it step by step (``tests/test_scheduler_batch.py``).
    """
    surv = np.asarray(survival, dtype=np.float32)
    steps, num_requests = surv.shape[:2]
    max_len = cfg.resolved_max_verify_len
    window = surv[:, :, :max_len]
    cols = window.shape[2]
    cells = window.transpose(0, 2, 1).reshape(steps, cols * num_requests)
    valid = cells >= cfg.survival_eps
    # one int64 key per cell: the value descending (a non-negative float32's bits order as the value;
    # abs turns -0.0 into 0.0), then the position-major index; the excluded after every value
    shift = max(1, (cells.shape[1] - 1).bit_length())
    bits = np.abs(cells).view(np.uint32).astype(np.int64)
    key = (np.where(valid, 0xFFFFFFFF - bits, 1 << 32) << shift) | np.arange(cells.shape[1])
    ranked = np.sort(key, axis=1)
    budgets = np.clip(np.asarray(budgets, dtype=np.int64).reshape(-1, 1), 0, cells.shape[1])
    last = np.take_along_axis(ranked, np.maximum(budgets - 1, 0), axis=1)   # the budget-th key of each step
    taken = (key <= last) & (budgets > 0)
    extra = (taken & valid).reshape(steps, cols, num_requests).sum(axis=1)
    return np.clip(cfg.min_verify_len + extra, max(cfg.min_verify_len, 1), max_len).astype(np.int32)
