"""SGLang's additive step-time table fitted to cells of logged steps: the pure functions.

Cells of ``(bs, M)`` with their median time (:func:`bin_cells`), the context
slope within cells (:func:`context_slope`), the hat bases on the probe grids and
the bounded least-squares fit (:func:`fit_additive`), and the error per batch
bucket (:func:`error_summary`).  The method is the package's docstring
(:mod:`dspark_obs.estimators.costmodel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import lsq_linear

from dspark_obs import costtable as ct

TIMERS = ("step_gpu_ms", "step_cpu_ms", "target_verify_gpu_ms")
MODELS = ("fitted", "fitted+context", "server")
_BIAS_FLOOR_SECONDS = 1e-9


def target_tokens(mode: Sequence[str] | np.ndarray, bs: np.ndarray, num_verify_tokens: np.ndarray,
                  gamma: np.ndarray | int) -> np.ndarray:
    """Tokens the target verified per step: ``M`` of the additive model.

    ``bs * (gamma + 1)`` for cap-accept (its ``num_verify_tokens`` is the committed
    window, not what ran), ``num_verify_tokens`` otherwise (graph tier in compact,
    the full block in static).

    >>> target_tokens(["compact", "cap-accept"], np.array([4, 4]), np.array([16, 11]), 6).tolist()
    [16, 28]
    """
    bs = np.asarray(bs, dtype=np.int64)
    tokens = np.asarray(num_verify_tokens, dtype=np.int64)
    full = bs * (np.asarray(gamma, dtype=np.int64) + 1)
    return np.where(np.asarray(mode) == "cap-accept", full, tokens)


@dataclass(frozen=True)
class Cells:
    """Binned probes: one row per ``(bs, M)`` cell; arrays of equal length."""

    bs: np.ndarray  # int
    m: np.ndarray  # float: mean M of the cell's steps
    n: np.ndarray  # int: steps in the cell
    seconds: np.ndarray  # median step time
    context_tokens: np.ndarray  # mean sum(prefix_len); nan where unknown
    cell_of_step: Optional[np.ndarray] = None  # the cell of each input step

    def __len__(self) -> int:
        return int(self.bs.size)


def bin_cells(bs: np.ndarray, m: np.ndarray, seconds: np.ndarray,
              context_tokens: Optional[np.ndarray] = None, *, m_bin_width: int = 1) -> Cells:
    """Group steps into ``(bs, M)`` cells (M rounded to ``m_bin_width``) with median time.

    ``context_tokens`` (sum of prefix_len per step) is averaged per cell.
    """
    bs = np.asarray(bs, dtype=np.int64)
    m = np.asarray(m, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    ctx = (np.full(bs.size, np.nan) if context_tokens is None
           else np.asarray(context_tokens, dtype=np.float64))
    if not (bs.size == m.size == seconds.size == ctx.size):
        raise ValueError(f"bs, m, seconds and context_tokens must have equal length, got "
                         f"{bs.size}, {m.size}, {seconds.size}, {ctx.size}")
    if m_bin_width < 1:
        raise ValueError(f"m_bin_width must be >= 1, got {m_bin_width}")
    mbin = np.round(m / m_bin_width).astype(np.int64)
    keys, inverse, counts = np.unique(np.stack([bs, mbin]), axis=1, return_inverse=True,
                                      return_counts=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    med = np.array([np.median(seconds[order[s:s + c]]) for s, c in zip(starts, counts)])
    sums = lambda v: np.bincount(inverse, weights=v, minlength=counts.size)  # noqa: E731
    return Cells(bs=keys[0], m=sums(m) / counts, n=counts, seconds=med, context_tokens=sums(ctx) / counts,
                 cell_of_step=inverse)


def context_slope(cell_of_step: np.ndarray, seconds: np.ndarray,
                  context_tokens: np.ndarray) -> tuple[float, float]:
    """Seconds per prefix token from the variation *within* cells, and its standard error.

    Within one ``(bs, M)`` cell alpha and theta are constant, so regressing the step time
    on ``sum(prefix_len)`` after removing each cell's means isolates the context cost
    (a fixed-effects estimator); across cells it would be confounded with alpha, since
    ``sum(prefix_len)`` grows with the batch.

    >>> context_slope(np.array([0, 0, 1, 1]), np.array([1.0, 3.0, 5.0, 9.0]), np.array([0.0, 2, 0, 4]))[0]
    1.0
    """
    cell = np.asarray(cell_of_step, dtype=np.int64)
    y = np.asarray(seconds, dtype=np.float64)
    x = np.asarray(context_tokens, dtype=np.float64)
    if not (cell.size == y.size == x.size):
        raise ValueError(f"cell_of_step, seconds and context_tokens must have equal length, got "
                         f"{cell.size}, {y.size}, {x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError("context_tokens has missing values: collect with the 'reqs' component "
                         "(SGLANG_DSPARK_DEBUG_DUMP=...,reqs) or fit without the context term")
    counts = np.maximum(np.bincount(cell), 1)
    mean_y = np.bincount(cell, weights=y) / counts
    dx = x - (np.bincount(cell, weights=x) / counts)[cell]
    dy = y - mean_y[cell]
    # Step-time noise is relative (a few % of the step), so weight by 1 / (cell mean)^2.
    w = 1.0 / np.maximum(mean_y[cell], 1e-300) ** 2
    sxx = float(np.sum(w * dx * dx))
    if sxx <= 0:
        raise ValueError("sum(prefix_len) never varies within a (bs, M) cell, so its cost cannot be told "
                         "from alpha(bs); collect longer runs (requests of different lengths)")
    slope = float(np.sum(w * dx * dy)) / sxx
    dof = max(y.size - counts.size - 1, 1)
    resid = dy - slope * dx
    return slope, float(np.sqrt(np.sum(w * resid * resid) / dof / sxx))


def hat_basis(x: np.ndarray, probes: Sequence[int]) -> np.ndarray:
    """``[n, P]`` weights with ``np.interp(x, probes, v) == hat_basis(x, probes) @ v``.

    >>> hat_basis(np.array([0, 4, 12]), [1, 8, 16]).round(3).tolist()
    [[1.0, 0.0, 0.0], [0.571, 0.429, 0.0], [0.0, 0.5, 0.5]]
    """
    probes = np.asarray(probes, dtype=np.float64)
    x = np.clip(np.asarray(x, dtype=np.float64), probes[0], probes[-1])
    out = np.zeros((x.size, probes.size))
    if probes.size == 1:
        out[:, 0] = 1.0
        return out
    hi = np.clip(np.searchsorted(probes, x, side="right"), 1, probes.size - 1)
    lo = hi - 1
    frac = (x - probes[lo]) / (probes[hi] - probes[lo])
    rows = np.arange(x.size)
    out[rows, lo] = 1.0 - frac
    out[rows, hi] += frac
    return out


def probe_grid(base: Sequence[int], observed_max: float) -> list[int]:
    """``base`` probes up to the first one at or above ``observed_max`` (at least one probe)."""
    kept = []
    for p in base:
        kept.append(int(p))
        if p >= observed_max:
            break
    return kept


@dataclass(frozen=True)
class AdditiveFit:
    """A fitted additive table, optionally with a context term, and how well it is determined."""

    table: ct.SpsAdditiveCostTable
    context_seconds_per_token: Optional[float]  # None: fitted without the context term
    context_stderr: Optional[float]
    alpha_stderr: list[float]
    theta_stderr: list[float]
    bias_stderr: float
    bs_covered: list[bool]
    m_covered: list[bool]
    n_cells: int
    n_steps: int

    def predict_seconds(self, bs: np.ndarray, m: np.ndarray,
                        context_tokens: Optional[np.ndarray] = None) -> np.ndarray:
        """Step time at ``(bs, M)``; the context term is added when it was fitted."""
        bs = np.asarray(bs, dtype=np.float64)
        out = self.table.bias_seconds + self.table.alpha(bs) + self.table.theta(np.asarray(m, dtype=np.float64))
        if self.context_seconds_per_token is not None:
            if context_tokens is None:
                raise ValueError("this fit has a context term: pass context_tokens (sum of prefix_len per step)")
            out = out + self.context_seconds_per_token * np.asarray(context_tokens, dtype=np.float64)
        return out


def fit_additive(cells: Cells, *, bs_probes: Sequence[int], m_probes: Sequence[int],
                 context: Optional[tuple[float, float]] = None) -> AdditiveFit:
    """Least-squares fit of ``bias + alpha(bs) + theta(M)`` to ``cells``.

    ``context = (seconds_per_token, stderr)`` (from :func:`context_slope`) marks the
    cells' times as already net of the context cost and is carried into the fit.

    Rows are weighted by ``sqrt(n)`` (a cell's median of n steps has variance ~ 1/n);
    ``alpha(bs_probes[0]) = theta(m_probes[0]) = 0``.  Interior or last probes with no
    data under their hat are dropped from the grid.  Raises ValueError when the cells
    cannot separate the terms (e.g. only static steps, where M = bs * (gamma + 1)).

    Four cells generated by ``bias 1 ms, alpha(8) 1 ms, theta(64) 2 ms`` (linear in between):

    >>> bs, m = np.array([1, 8, 1, 8]), np.array([1.0, 8, 64, 64])
    >>> seconds = (1 + (bs - 1) / 7 + 2 * (m - 1) / 63) * 1e-3
    >>> cells = Cells(bs=bs, m=m, n=np.ones(4, int), seconds=seconds, context_tokens=np.full(4, np.nan))
    >>> fit = fit_additive(cells, bs_probes=[1, 8], m_probes=[1, 64])
    >>> [round(v * 1e3, 6) for v in (fit.table.bias_seconds, *fit.table.alpha_seconds, *fit.table.theta_seconds)]
    [1.0, 0.0, 1.0, 0.0, 2.0]
    """
    if len(cells) == 0:
        raise ValueError("no steps to fit: the runs have no decode steps with this timer; "
                         "collect with SGLANG_DSPARK_DEBUG_DUMP including core and the timer's component")
    _check_probes("bs_probes", bs_probes)
    _check_probes("m_probes", m_probes)
    bs_grid = _supported(cells.bs, list(bs_probes))
    m_grid = _supported(cells.m, list(m_probes))
    hb, hm = hat_basis(cells.bs, bs_grid), hat_basis(cells.m, m_grid)
    design = np.hstack([np.ones((len(cells), 1)), hb[:, 1:], hm[:, 1:]])
    w = np.sqrt(cells.n.astype(np.float64))
    beta, se = _solve(design * w[:, None], cells.seconds * w,
                      f"{len(cells)} (bs, M) cells for {design.shape[1]} coefficients (bs grid {bs_grid}, "
                      f"M grid {m_grid})")
    nb, nm = len(bs_grid) - 1, len(m_grid) - 1
    table = ct.SpsAdditiveCostTable(
        bias_seconds=float(beta[0]),
        bs_probes=bs_grid, alpha_seconds=[0.0, *map(float, beta[1:1 + nb])],
        m_probes=m_grid, theta_seconds=[0.0, *map(float, beta[1 + nb:1 + nb + nm])],
    )
    return AdditiveFit(
        table=table,
        context_seconds_per_token=None if context is None else float(context[0]),
        context_stderr=None if context is None else float(context[1]),
        alpha_stderr=[0.0, *map(float, se[1:1 + nb])],
        theta_stderr=[0.0, *map(float, se[1 + nb:1 + nb + nm])],
        bias_stderr=float(se[0]),
        bs_covered=_covered(hb),
        m_covered=_covered(hm),
        n_cells=len(cells), n_steps=int(cells.n.sum()),
    )


def _solve(a: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients and standard errors of ``a @ beta ~ y`` with ``beta[0]`` (the bias) kept above the floor."""
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)  # column scaling for conditioning
    a_s = a / scale
    if np.linalg.matrix_rank(a_s) < a_s.shape[1] or np.linalg.cond(a_s) > 1e8:
        raise ValueError(
            f"the steps cannot separate bias, alpha(bs) and theta(M): {what}. Pool runs with different "
            "verify tokens at the same batch size, e.g. a static and a compact run (--run A --run B), "
            "or pass coarser --bs-probes/--m-probes")
    beta_s = np.linalg.lstsq(a_s, y, rcond=None)[0]
    if beta_s[0] / scale[0] <= _BIAS_FLOOR_SECONDS:  # SGLang rejects bias <= 0
        lower = np.full(beta_s.size, -np.inf)
        lower[0] = _BIAS_FLOOR_SECONDS * scale[0]
        beta_s = lsq_linear(a_s, y, bounds=(lower, np.inf), method="bvls").x
    beta = beta_s / scale
    resid = y - a @ beta
    dof = max(a.shape[0] - a.shape[1], 1)
    cov = (resid @ resid / dof) * np.linalg.pinv(a_s.T @ a_s) / np.outer(scale, scale)
    return beta, np.sqrt(np.clip(np.diag(cov), 0.0, None))


def _check_probes(name: str, probes: Sequence[int]) -> None:
    probes = list(probes)
    if not probes or probes != sorted(set(probes)) or probes[0] < 1:
        raise ValueError(f"{name} must be strictly increasing positive integers, got {probes}")


def _supported(x: np.ndarray, probes: list[int]) -> list[int]:
    """Drop probes (never the first) whose hat has no data; repeat until all have some."""
    while len(probes) > 1:
        support = hat_basis(x, probes).sum(axis=0)
        empty = [i for i in range(1, len(probes)) if support[i] <= 1e-12]
        if not empty:
            break
        probes = [p for i, p in enumerate(probes) if i not in empty[:1]]
    return probes


def _covered(hats: np.ndarray) -> list[bool]:
    return [bool(v) for v in (hats.max(axis=0) >= 0.5)] if hats.size else []


def bs_buckets(bs: np.ndarray, bs_probes: Sequence[int]) -> np.ndarray:
    """Label each batch size with its probe interval: ``'8-15'``, last one ``'256+'``.

    >>> bs_buckets(np.array([1, 7, 8, 300]), [1, 8, 256]).tolist()
    ['1-7', '1-7', '8-255', '256+']
    """
    probes = np.asarray(bs_probes)
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(probes[:-1], probes[1:])] + [f"{probes[-1]}+"]
    idx = np.clip(np.searchsorted(probes, np.asarray(bs), side="right") - 1, 0, probes.size - 1)
    return np.asarray(labels, dtype=object)[idx]


def error_summary(measured_s: np.ndarray, predicted_s: np.ndarray, buckets: np.ndarray) -> list[dict]:
    """MAPE (fraction) and mean signed error (ms) overall (``'*'``) and per bucket.

    Steps with a missing (nan) prediction or measurement, or a non-positive measurement,
    are skipped.
    """
    measured_s = np.asarray(measured_s, dtype=np.float64)
    predicted_s = np.asarray(predicted_s, dtype=np.float64)
    ok = np.isfinite(measured_s) & np.isfinite(predicted_s) & (measured_s > 0)
    rows = []
    labels = np.asarray(buckets, dtype=object)
    for label in ["*", *sorted(set(labels[ok].tolist()), key=_bucket_key)]:
        sel = ok if label == "*" else ok & (labels == label)
        n = int(sel.sum())
        if n == 0:
            rows.append({"bs_bucket": label, "n": 0, "mape": None, "bias_ms": None})
            continue
        err = predicted_s[sel] - measured_s[sel]
        rows.append({"bs_bucket": label, "n": n, "mape": float(np.mean(np.abs(err) / measured_s[sel])),
                     "bias_ms": float(np.mean(err) * 1e3)})
    return rows


def _bucket_key(label: str) -> int:
    return int(label.split("-")[0].rstrip("+"))
