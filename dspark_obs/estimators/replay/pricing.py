"""What a re-planned schedule would have committed and cost: full-block acceptance and step time.

:func:`block_acceptance` picks each request-step's full-block acceptance from the
truth, a ``ceiling`` result or the survivals; :func:`price_schedule` turns new
windows into committed tokens (``min(block, w') + 1``) and step time from a
cost table.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from dspark_obs import costtable as ct
from dspark_obs.acceptance import known_block_accept
from dspark_obs.estimators.replay.schedule import StepLog


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


def block_acceptance(*, mode: str, gamma: int, window: np.ndarray, correct_drafts: np.ndarray,
                     cap_trim: np.ndarray, survival: np.ndarray, truth: Optional[np.ndarray] = None,
                     ceiling: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Full-block accepted drafts per request-step as ``(lo, mid, hi, source)``.

    ``source`` indexes :data:`SOURCES` per row.  ``truth`` (nan where unknown) is emulator
    or companion truth; ``ceiling`` holds the ceiling table's ``(lo, mid, hi)`` in drafts
    (nan where it has no row).  Where the step shows it (:func:`dspark_obs.acceptance.known_block_accept`:
    static and cap-accept steps, truth, a window that rejected a draft) it is exact.

    >>> lo, mid, hi, src = block_acceptance(mode="compact", gamma=3, window=np.array([1, 1]),
    ...     correct_drafts=np.array([0, 1]), cap_trim=np.zeros(2), survival=np.array([[.5, .25, .125]] * 2))
    >>> from dspark_obs.estimators.replay.schedule import SOURCES
    >>> lo.tolist(), mid.tolist(), hi.tolist(), [SOURCES[i] for i in src]
    ([0.0, 1.0], [0.0, 1.75], [0.0, 3.0], ['truth', 'survival'])
    """
    window = np.asarray(window, dtype=np.int64)
    n = window.size
    lo = known_block_accept(mode, window, correct_drafts, cap_trim, gamma=gamma, truth=truth)
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
