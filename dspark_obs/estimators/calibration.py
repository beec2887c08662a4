"""Calibration of the confidence head's survival, position by position.

The event at position ``k`` (1..gamma) of a request-step is *the first k drafts
all survive a full-block verify*; the head predicts it with its survival
``S_k = c_1 * ... * c_k`` (the record's ``survival``, else the cumulative
product of ``confidence``) — SGLang's own probe scores exactly this pair
(``dspark_observability.PerPositionConfidenceMetrics``).

Where the truth comes from (``labels``):

``observed``
    What the run's own record decides.  A cap-accept or static step verified
    the whole block, so every position is known.  A compact step with window
    ``w`` and ``c`` accepted drafts knows positions ``k <= w`` directly, and,
    when the chain broke inside the window (``c < w``), that every ``k > c`` is
    false — a full-block verify would have rejected the same draft.  Only the
    tail of a *censored* step (``c == w < gamma``) is unknown and left out.
    Those are exactly the steps that survived their whole window, so what is
    left is biased twice: deep positions are labelled mostly on steps the
    scheduler trusted (the labelled share of positives is higher than in the
    population), and among steps with the same predicted survival the likely
    positives are missing (the head looks more over-confident than it is).
``reconstructed``
    The block-accept estimator's ceiling (table ``ceiling``, written by
    ``dspark-obs estimate``).  The label is ``clip(mid - (k - 1), 0, 1)``: 0/1
    wherever the estimate is an integer (uncensored steps; greedy censored
    steps with ``lo == hi``), and a soft label otherwise, so that the labels of
    a step sum to its estimated acceptance ``mid``.
``companion``
    The paired cap-accept step of a companion run (same rid and anchor
    ``prefix_len``, same drafts; :mod:`dspark_obs.estimators.pairing`):
    ``correct_drafts + cap_trim >= k``.  Compact steps without such a pair are
    left out.

The metrics are pure functions in scikit-learn's style (``y_true, y_prob``
positional, options keyword-only; ``y_true`` may hold soft labels in [0, 1]).
:func:`calibrate_run` is the thin layer that reads the views and writes the
``calibration`` and ``calibration_bins`` tables.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from dspark_obs import schema

__all__ = [
    "BINNINGS", "LABEL_KINDS", "ReliabilityCurve", "RunEvents", "RunCalibration",
    "expected_calibration_error", "maximum_calibration_error", "debiased_calibration_error",
    "brier_score_loss", "log_loss", "auroc_score", "reliability_curve",
    "bootstrap_calibration_error", "parse_binning", "block_events", "observed_events",
    "CalibrationDataError", "load_events", "summarise_events", "calibrate_run",
]

EPS_PROB = 1e-8
"""Probabilities are clamped to [EPS_PROB, 1 - EPS_PROB] before binning and logs (SGLang's EPS_PROB)."""
LABEL_KINDS = ("observed", "reconstructed", "companion")
BINNINGS = ("width15", "width20", "mass15")
"""Equal-width 15 bins (SGLang's convention), 20 (DeepSpec's), and 15 equal-mass bins."""
_STRATEGIES = ("uniform", "quantile")

_f64, _str, _i16, _i32, _i64 = pa.float64(), pa.string(), pa.int16(), pa.int32(), pa.int64()


_fld = schema.field  # a documented column


CALIBRATION = pa.schema([
    _fld("workload", _str, "workload name; '*' = all workloads", False),
    _fld("position", _i16, "draft position k (1..gamma); the event is 'first k drafts survive a full block'", False),
    _fld("labels", _str, "observed | reconstructed | companion (where the truth came from)", False),
    _fld("binning", _str, "width15 | width20 | mass15 (equal-width or equal-mass bins)", False),
    _fld("mode", _str, "verify mode of the run the predictions came from"),
    _fld("label_source", _str, "companion run id, 'ceiling', or the run itself"),
    _fld("n", _i64, "labelled request-steps at this position", False),
    _fld("n_requests", _i32, "distinct requests among them (the bootstrap's unit)"),
    _fld("mean_predicted", _f64, "mean survival S_k"),
    _fld("observed_rate", _f64, "mean label (share of steps whose first k drafts survive)"),
    _fld("ece", _f64, "expected calibration error (lower is better)"),
    _fld("ece_ci_lo", _f64, "request-level bootstrap CI of ece, lower end; null without --bootstrap"),
    _fld("ece_ci_hi", _f64, "request-level bootstrap CI of ece, upper end"),
    _fld("debiased_ece", _f64, "ece minus its estimated sampling bias (Kumar et al. 2019); may be < 0"),
    _fld("mce", _f64, "maximum calibration error over non-empty bins"),
    _fld("brier", _f64, "Brier score (binning-independent)"),
    _fld("log_loss", _f64, "log loss (binning-independent)"),
    _fld("auroc", _f64, "area under the ROC curve; null when every label is the same"),
    _fld("bootstrap", _i32, "bootstrap resamples behind the CI (0 = none)"),
])

CALIBRATION_BINS = pa.schema([
    _fld("workload", _str, "workload name; '*' = all workloads", False),
    _fld("position", _i16, "draft position k (1..gamma)", False),
    _fld("labels", _str, "observed | reconstructed | companion", False),
    _fld("binning", _str, "width15 | width20 | mass15", False),
    _fld("bin", _i16, "bin index (only non-empty bins are stored)", False),
    _fld("bin_lo", _f64, "lower edge of the bin"),
    _fld("bin_hi", _f64, "upper edge of the bin"),
    _fld("mean_predicted", _f64, "mean survival in the bin"),
    _fld("observed_rate", _f64, "mean label in the bin"),
    _fld("count", _i64, "request-steps in the bin", False),
])

schema.register("calibration", CALIBRATION)
schema.register("calibration_bins", CALIBRATION_BINS)


# -- validation and binning ------------------------------------------------------


def _check_pair(y_true: Any, y_prob: Any) -> tuple[np.ndarray, np.ndarray]:
    """Both as 1-D float64 arrays of equal length with values in [0, 1]."""
    out = []
    for name, values in (("y_true", y_true), ("y_prob", y_prob)):
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be numeric, got {np.asarray(values).dtype}") from None
        if arr.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise ValueError(f"{name} has non-finite values ({arr[bad[0]]} at index {bad[0]})")
        if arr.size and (arr.min() < 0 or arr.max() > 1):
            raise ValueError(f"{name} has values outside [0, 1]: min {arr.min():g}, max {arr.max():g}"
                             + (" (use 0/1 outcomes, or probabilities as soft labels)" if name == "y_true" else ""))
        out.append(arr)
    if out[0].shape != out[1].shape:
        raise ValueError(f"y_true and y_prob have different lengths: {out[0].size} != {out[1].size}")
    return out[0], out[1]


def _check_binning(n_bins: Any, strategy: Any) -> None:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1, got {n_bins!r}")
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")


def parse_binning(name: str) -> tuple[int, str]:
    """``'width15'`` -> ``(15, 'uniform')``; ``'mass15'`` -> ``(15, 'quantile')``.

    >>> parse_binning("width20")
    (20, 'uniform')
    """
    m = re.fullmatch(r"(width|mass)([1-9][0-9]*)", str(name))
    if not m:
        raise ValueError(f"binning {name!r} is not widthN or massN (e.g. {', '.join(BINNINGS)})")
    return int(m.group(2)), "uniform" if m.group(1) == "width" else "quantile"


@dataclass(frozen=True)
class _Bins:
    edges: np.ndarray  # [n_bins + 1]
    ids: np.ndarray  # [n] bin of each sample
    count: np.ndarray  # [n_bins]
    pred_sum: np.ndarray
    true_sum: np.ndarray


def _edges(p: np.ndarray, n_bins: int, strategy: str) -> np.ndarray:
    if strategy == "quantile" and p.size:
        return np.quantile(p, np.linspace(0.0, 1.0, n_bins + 1))
    return np.linspace(0.0, 1.0, n_bins + 1)


def _bin_ids(p: np.ndarray, edges: np.ndarray, strategy: str) -> np.ndarray:
    n_bins = edges.size - 1
    if strategy == "uniform":  # SGLang: floor(p * n_bins), an edge belongs to the bin above
        return np.clip((p * n_bins).astype(np.int64), 0, n_bins - 1)
    return np.searchsorted(edges[1:-1], p)  # scikit-learn's quantile rule


def _binned(y: np.ndarray, p: np.ndarray, n_bins: int, strategy: str) -> _Bins:
    p = np.clip(p, EPS_PROB, 1.0 - EPS_PROB)
    edges = _edges(p, n_bins, strategy)
    ids = _bin_ids(p, edges, strategy)
    return _Bins(edges, ids, np.bincount(ids, minlength=n_bins).astype(np.float64),
                 np.bincount(ids, weights=p, minlength=n_bins), np.bincount(ids, weights=y, minlength=n_bins))


def _ece(b: _Bins) -> float:
    total = b.count.sum()
    return float(np.abs(b.pred_sum - b.true_sum).sum() / total) if total else math.nan


def _mce(b: _Bins) -> float:
    full = b.count > 0
    if not full.any():
        return math.nan
    return float(np.max(np.abs(b.pred_sum[full] - b.true_sum[full]) / b.count[full]))


def _debiased_ece(b: _Bins) -> float:
    from scipy.special import ndtr

    full = b.count > 0
    total = b.count.sum()
    if not total:
        return math.nan
    n = b.count[full]
    rate = b.true_sum[full] / n
    gap = np.abs(b.pred_sum[full] / n - rate)
    sd = np.sqrt(np.clip(rate * (1.0 - rate), 0.0, None) / n)
    # E|N(gap, sd^2)| (folded normal mean) = the mean of Kumar et al.'s resampled ECE terms.
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, gap / sd, np.inf)
        folded = np.where(sd > 0, sd * np.sqrt(2.0 / np.pi) * np.exp(-0.5 * z * z) + gap * (1.0 - 2.0 * ndtr(-z)), gap)
    return float(np.sum(n * (2.0 * gap - folded)) / total)


# -- metrics -----------------------------------------------------------------------


def expected_calibration_error(y_true, y_prob, *, n_bins: int = 15, strategy: str = "uniform") -> float:
    """Expected calibration error: ``sum_b (n_b / n) |mean(y_prob)_b - mean(y_true)_b|``.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Outcomes, 0/1 (or soft labels in [0, 1]).
    y_prob : array-like of shape (n,)
        Predicted probabilities in [0, 1]; clamped to [1e-8, 1 - 1e-8] as SGLang does.
    n_bins : int, default 15
        15 is SGLang's convention (``dspark_sts_fit.py``, the confidence probe), 20 DeepSpec's.
    strategy : {'uniform', 'quantile'}, default 'uniform'
        ``uniform``: equal-width bins, ``floor(p * n_bins)`` (SGLang's rule: a probability
        on an edge goes to the bin above).  ``quantile``: equal-mass bins on the
        quantiles of ``y_prob`` (scikit-learn's ``calibration_curve`` rule).

    Returns
    -------
    float
        Lower is better; NaN for empty input.

    >>> round(expected_calibration_error([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3]), 3)
    0.175
    """
    y, p = _check_pair(y_true, y_prob)
    _check_binning(n_bins, strategy)
    return _ece(_binned(y, p, n_bins, strategy))


def maximum_calibration_error(y_true, y_prob, *, n_bins: int = 15, strategy: str = "uniform") -> float:
    """Largest ``|mean(y_prob)_b - mean(y_true)_b|`` over non-empty bins (NaN if empty).

    Same inputs and binning as :func:`expected_calibration_error`.

    >>> round(maximum_calibration_error([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3]), 3)
    0.3
    """
    y, p = _check_pair(y_true, y_prob)
    _check_binning(n_bins, strategy)
    return _mce(_binned(y, p, n_bins, strategy))


def debiased_calibration_error(y_true, y_prob, *, n_bins: int = 15, strategy: str = "uniform") -> float:
    """ECE with its finite-sample bias removed (may be slightly negative; NaN if empty).

    The plug-in ECE is biased upwards: sampling noise in each bin's observed rate
    only ever adds to ``|gap|``.  Following Kumar, Liang & Ma (2019), "Verified
    Uncertainty Calibration", NeurIPS (the debiased estimator of their
    ``calibration`` package; see also Roelofs et al. 2022, "Mitigating Bias in
    Calibration Error Estimation", AISTATS), the bias is estimated by redrawing each
    bin's rate from ``N(rate_b, rate_b (1 - rate_b) / n_b)`` and subtracted:
    ``2 * ECE - E[ECE_resampled]``.  The expectation is taken in closed form (the
    mean of a folded normal) instead of by Monte Carlo, so the estimate is
    deterministic.  Same inputs and binning as :func:`expected_calibration_error`.

    >>> round(debiased_calibration_error([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3]), 3)
    0.175
    """
    y, p = _check_pair(y_true, y_prob)
    _check_binning(n_bins, strategy)
    return _debiased_ece(_binned(y, p, n_bins, strategy))


def brier_score_loss(y_true, y_prob) -> float:
    """Mean squared difference ``mean((y_prob - y_true)^2)`` (lower is better; NaN if empty).

    >>> round(brier_score_loss([0, 1], [0.2, 0.6]), 3)
    0.1
    """
    y, p = _check_pair(y_true, y_prob)
    return float(np.mean((p - y) ** 2)) if y.size else math.nan


def log_loss(y_true, y_prob) -> float:
    """Mean cross-entropy ``-mean(y log p + (1 - y) log(1 - p))`` (lower is better; NaN if empty).

    ``y_prob`` is clamped to [1e-8, 1 - 1e-8] first, so a confident miss costs
    ``-log(1e-8) = 18.4`` instead of infinity.

    >>> round(log_loss([0, 1], [0.5, 0.5]), 4)
    0.6931
    """
    y, p = _check_pair(y_true, y_prob)
    if not y.size:
        return math.nan
    p = np.clip(p, EPS_PROB, 1.0 - EPS_PROB)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def auroc_score(y_true, y_prob) -> float:
    """Area under the ROC curve by the Mann–Whitney U statistic (higher is better).

    Tied scores count one half, as in scikit-learn's ``roc_auc_score``.  Soft
    labels count as a positive of weight ``y`` and a negative of weight ``1 - y``.
    Returns NaN, without a warning, when there are no positives or no negatives —
    e.g. a position where every step survived — and for empty input, so that a
    per-position table stays rectangular (scikit-learn warns, or raises in
    versions before 1.6).

    >>> auroc_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    """
    y, p = _check_pair(y_true, y_prob)
    pos_total, neg_total = y.sum(), (1.0 - y).sum()
    if pos_total <= 0 or neg_total <= 0:
        return math.nan
    _, group = np.unique(p, return_inverse=True)  # ascending scores; ties share a group
    pos = np.bincount(group, weights=y)
    neg = np.bincount(group, weights=1.0 - y)
    below = np.cumsum(neg) - neg
    return float(np.sum(pos * (below + 0.5 * neg)) / (pos_total * neg_total))


@dataclass(frozen=True)
class ReliabilityCurve:
    """Reliability-diagram data, one entry per non-empty bin (arrays of equal length)."""

    bin: np.ndarray  # bin index among n_bins
    bin_lo: np.ndarray
    bin_hi: np.ndarray
    bin_center: np.ndarray
    mean_predicted: np.ndarray
    observed_rate: np.ndarray
    count: np.ndarray


def reliability_curve(y_true, y_prob, *, n_bins: int = 15, strategy: str = "uniform") -> ReliabilityCurve:
    """Per-bin mean prediction and observed rate (empty bins are left out).

    ``observed_rate`` and ``mean_predicted`` equal scikit-learn's
    ``calibration_curve(y_true, y_prob, n_bins=..., strategy=...)`` (apart from the
    1e-8 clamp, and for ``uniform`` a probability exactly on an edge, which goes
    to the bin above here as in SGLang).

    >>> curve = reliability_curve([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3], n_bins=2)
    >>> curve.observed_rate.tolist(), curve.count.tolist()
    ([0.0, 1.0], [2, 2])
    """
    y, p = _check_pair(y_true, y_prob)
    _check_binning(n_bins, strategy)
    return _curve(_binned(y, p, n_bins, strategy))


def _curve(b: _Bins) -> ReliabilityCurve:
    full = np.flatnonzero(b.count > 0)
    lo, hi = b.edges[full], b.edges[full + 1]
    n = b.count[full]
    return ReliabilityCurve(full, lo, hi, (lo + hi) / 2, b.pred_sum[full] / n, b.true_sum[full] / n,
                            n.astype(np.int64))


def bootstrap_calibration_error(y_true, y_prob, groups, *, n_bins: int = 15, strategy: str = "uniform",
                                n_resamples: int = 1000, confidence_level: float = 0.95,
                                seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the ECE, resampling whole groups (requests).

    Steps of one request share its prompt and history, so they are not
    independent; resampling requests keeps that dependence.  Vectorised: the
    per-(request, bin) sums are computed once and each resample is a multinomial
    reweighting of them.  Bin edges stay those of the full sample.

    Parameters
    ----------
    groups : array-like of shape (n,)
        The resampling unit of each sample (request ids).
    n_resamples : int, default 1000
    confidence_level : float, default 0.95
    seed : int, default 0
        Seed of ``numpy.random.default_rng``: the same inputs give the same interval.

    Returns ``(lo, hi)``; ``(nan, nan)`` for empty input.

    >>> lo, hi = bootstrap_calibration_error([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3], ["a", "a", "b", "b"])
    >>> bool(lo <= 0.175 <= hi)
    True
    """
    y, p = _check_pair(y_true, y_prob)
    _check_binning(n_bins, strategy)
    g = np.asarray(groups)
    if g.shape != y.shape:
        raise ValueError(f"groups must have the length of y_true: {g.size} != {y.size}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be an integer >= 1, got {n_resamples!r}")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level!r}")
    if not y.size:
        return math.nan, math.nan
    _, gidx = np.unique(g, return_inverse=True)
    weights = _multinomial_weights(int(gidx.max()) + 1, n_resamples, seed)
    samples = _resampled_ece(weights, gidx, _binned(y, p, n_bins, strategy), p, y)
    return _interval(samples, confidence_level)


def _multinomial_weights(n_groups: int, n_resamples: int, seed: int) -> np.ndarray:
    """[n_resamples, n_groups]: how often each group is drawn in each resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_resamples).astype(np.float64)


def _resampled_ece(weights: np.ndarray, gidx: np.ndarray, b: _Bins, p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ECE of each resample (row of ``weights``) with the bins of ``b``."""
    n_groups, n_bins = weights.shape[1], b.count.size
    cell = gidx * n_bins + b.ids
    size = n_groups * n_bins
    pc = np.clip(p, EPS_PROB, 1.0 - EPS_PROB)
    count = np.bincount(cell, minlength=size).reshape(n_groups, n_bins)
    psum = np.bincount(cell, weights=pc, minlength=size).reshape(n_groups, n_bins)
    ysum = np.bincount(cell, weights=y, minlength=size).reshape(n_groups, n_bins)
    total = weights @ count.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.abs(weights @ psum - weights @ ysum).sum(axis=1) / total


def _interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    samples = samples[np.isfinite(samples)]
    if not samples.size:
        return math.nan, math.nan
    lo, hi = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


# -- events and labels ------------------------------------------------------------


def block_events(block_accept, *, gamma: int) -> np.ndarray:
    """Labels of the events 'first k drafts survive', k = 1..gamma, from a full-block acceptance.

    ``block_accept`` (shape (n,)) counts accepted drafts of a full block; a
    fractional value (an estimate) gives soft labels ``clip(A - (k - 1), 0, 1)``
    that sum to ``A``.  Returns float64 of shape (n, gamma).

    >>> block_events([2, 0.5], gamma=3).tolist()
    [[1.0, 1.0, 0.0], [0.5, 0.0, 0.0]]
    """
    a = np.asarray(block_accept, dtype=np.float64).reshape(-1, 1)
    return np.clip(a - np.arange(gamma), 0.0, 1.0)


def observed_events(correct_drafts, window, *, gamma: int) -> np.ndarray:
    """What a compact step's record decides; NaN where the censored tail leaves it unknown.

    Positions ``k <= window`` were verified; when the chain broke inside the window
    (``correct_drafts < window``) every later event is false.  The positions beyond
    the window of a step that accepted its whole window are unknown (NaN).

    >>> observed_events([1, 2], [3, 2], gamma=4).tolist()
    [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, nan, nan]]
    """
    c = np.asarray(correct_drafts, dtype=np.int64).reshape(-1, 1)
    w = np.asarray(window, dtype=np.int64).reshape(-1, 1)
    y = block_events(c[:, 0], gamma=gamma)
    known = (np.arange(1, gamma + 1) <= w) | (c < w)
    return np.where(known, y, np.nan)


class CalibrationDataError(ValueError):
    """The store lacks what a calibration needs; the message names the fix."""


@dataclass(frozen=True)
class RunEvents:
    """A run's request-steps as arrays: predictions and labels per position.

    ``survival``, ``confidence`` and ``y`` have shape (n, gamma); ``y`` is NaN
    where the truth is unknown (and ``confidence`` where it was not sent).
    ``rid`` is the request (the bootstrap's unit); ``dp_rank`` and ``forward_ct``
    identify the step.
    """

    run_id: str
    labels: str
    mode: str
    gamma: int
    label_source: str
    rid: np.ndarray
    workload: np.ndarray
    dp_rank: np.ndarray
    forward_ct: np.ndarray
    survival: np.ndarray
    confidence: np.ndarray
    y: np.ndarray
    notes: tuple[str, ...] = ()


_STEPS_SQL = """
SELECT s.rid, coalesce(s.rid, 'pool-' || s.req_pool_index) AS unit,
       coalesce(s.workload, 'unknown') AS workload, s.dp_rank, s.forward_ct, s.prefix_len,
       s."window", s.correct_drafts, s.cap_trim, s.confidence, s.survival{extra}
FROM step_reqs_w s {join}
WHERE s.run_id = $run AND (s.confidence IS NOT NULL OR s.survival IS NOT NULL) AND {chunk}
"""
_ORDER_SQL = "ORDER BY s.dp_rank, s.forward_ct, s.rid"


def events_sql(query: str, chunk=None, *, ordered: bool = True) -> str:
    """:func:`events_query`'s SQL for the requests of ``chunk`` (all when None), in step order."""
    on = (lambda col: "TRUE") if chunk is None else chunk.on
    text = query.format(chunk=on("s.rid"), chunk_p=on("p.rid"), chunk_e=on("e.rid"))
    return text + _ORDER_SQL if ordered else text


def _fetch(con, sql_text: str, params: dict) -> pa.Table:
    return con.sql(sql_text, params=params).to_arrow_table()  # DuckDB 2: fetch results fully


def _run_info(con, run_id: str) -> tuple[str, int | None]:
    rows = con.sql("SELECT mode, gamma FROM runs WHERE run_id = $run", params={"run": run_id}).fetchall()
    mode, gamma = rows[0] if rows else (None, None)
    if not mode:
        modes = con.sql("SELECT mode, count(*) FROM steps WHERE run_id = $run AND mode <> '' GROUP BY 1 "
                        "ORDER BY 2 DESC", params={"run": run_id}).fetchall()
        mode = modes[0][0] if modes else ""
    return mode or "", gamma


def _list_matrix(column: pa.ChunkedArray, gamma: int, name: str) -> np.ndarray:
    """A list<float> column as (n, gamma) float64; null rows become NaN."""
    arr = column.combine_chunks()
    out = np.full((len(arr), gamma), np.nan)
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False))
    if valid.any():
        lengths = np.asarray(arr.value_lengths().to_numpy(zero_copy_only=False))[valid]
        if np.any(lengths != gamma):
            raise CalibrationDataError(f"{name} lists have lengths {sorted(set(lengths.tolist()))}, expected gamma = {gamma}")
        out[valid] = np.asarray(arr.filter(pa.array(valid)).flatten().to_numpy(zero_copy_only=False),
                                dtype=np.float64).reshape(-1, gamma)
    return out


def load_events(con, run_id: str, *, labels: str = "observed", companion: str | None = None,
                chunk=None) -> RunEvents:
    """Read one run's predictions and the labels of kind ``labels`` from the views.

    ``companion`` names the cap-accept companion (default: the run recorded with
    ``companion_of = run_id``).  Raises :class:`CalibrationDataError` with the fix
    when the run, its confidences, its companion or its ceiling estimates are missing.
    ``chunk`` (a :class:`~dspark_obs.estimators.ceiling_chunks.Chunk`) reads only
    some requests; a chunk without labelled steps gives empty events.
    """
    query, params, mode, gamma, source = events_query(con, run_id, labels=labels, companion=companion)
    table = _fetch(con, events_sql(query, chunk), {**params, **({} if chunk is None else chunk.params)})
    ev, counts = _events(table, run_id, labels, mode, gamma, source)
    if chunk is None:
        counts["total"] = _check_labelled(con, run_id, labels, mode, source, table.num_rows)
        ev = dataclasses.replace(ev, notes=_notes(labels, mode, params.get("method"), counts))
    return ev


def _notes(labels: str, mode: str, method: str | None, counts: dict) -> tuple[str, ...]:
    """What the labels left out, from the counts of :func:`_events` summed over the run."""
    total, rows = counts["total"], counts["rows"]
    notes = []
    if labels == "companion":
        notes.append(f"{total - rows} of {total} steps have no companion step with the same "
                     f"drafts at the same anchor and are left out")
    elif labels == "reconstructed" and rows < total:
        notes.append(f"{total - rows} of {total} steps have no ceiling estimate and are left out")
    if labels == "reconstructed":
        notes.append(f"ceiling method {method or 'unnamed'}: {counts['fractional']} of "
                     f"{rows} steps have a fractional estimate (soft labels)")
    elif labels == "observed" and mode not in ("cap-accept", "static"):
        notes.append(f"{counts['censored']} of {rows} steps are censored (whole window accepted): "
                     "their positions beyond the window are unlabelled")
    return tuple(notes)


def events_query(con, run_id: str, *, labels: str = "observed",
                 companion: str | None = None) -> tuple[str, dict, str, int | None, str]:
    """``(sql, params, mode, gamma, label source)`` of a run's events, the SQL to be completed by
    :func:`events_sql`.  Raises :class:`CalibrationDataError` as :func:`load_events`."""
    from dspark_obs.estimators import pairing

    if labels not in LABEL_KINDS:
        raise ValueError(f"labels must be one of {', '.join(LABEL_KINDS)}, got {labels!r}")
    mode, gamma = _run_info(con, run_id)
    if mode in ("cap-accept", "static") and labels != "observed":
        raise CalibrationDataError(
            f"run {run_id!r} is a {mode} run: it verified whole blocks, so its own labels are the "
            f"full-block truth; use labels 'observed' (--labels observed) instead of {labels!r}")
    params: dict[str, Any] = {"run": run_id}
    extra, join, source = "", "", run_id
    if labels == "companion":
        companion = companion or pairing.companion_of(con, run_id)
        if companion is None:
            raise CalibrationDataError(
                f"no cap-accept companion recorded for run {run_id!r} (runs.companion_of); replay its "
                "requests on a cap-accept server (dspark-obs demo does this) or name one with --companion RUN")
        params["companion"], source = companion, companion
        join = (f"JOIN ({pairing.PAIRED_STEPS_SQL}) p ON p.rid = s.rid AND p.forward_ct = s.forward_ct "
                "AND p.dp_rank = s.dp_rank AND p.same_drafts AND {chunk_p}")
        extra = ", p.true_block_accept"
    elif labels == "reconstructed":
        try:  # the estimator writes one method per run; prefer 'default' if several are there
            methods = [m for m, in con.sql("SELECT DISTINCT coalesce(method, '') FROM ceiling WHERE run_id = $run "
                                           "ORDER BY 1", params=params).fetchall()]
        except Exception:  # the ceiling estimator's table is not registered
            methods = []
        if not methods:
            raise CalibrationDataError(
                f"no ceiling estimates for run {run_id!r}; run `dspark-obs estimate --data DATA --run "
                f"{run_id}` first, or use --labels observed|companion")
        params["method"] = "default" if "default" in methods else methods[0]
        extra, source = ", e.mid", "ceiling"
        join = ("JOIN ceiling e ON e.run_id = s.run_id AND e.rid = s.rid AND e.forward_ct = s.forward_ct "
                "AND e.prefix_len = s.prefix_len AND coalesce(e.method, '') = $method AND {chunk_e}")
    return (_STEPS_SQL.format(extra=extra, join=join, chunk="{chunk}", chunk_p="{chunk_p}", chunk_e="{chunk_e}"),
            params, mode, gamma, source)


def _check_labelled(con, run_id: str, labels: str, mode: str, source: str, labelled: int) -> int:
    """The run has steps, confidences, and labelled steps (else the fix); its steps."""
    total = con.sql("SELECT count(*), count(confidence) + count(survival) FROM step_reqs WHERE run_id = $run",
                    params={"run": run_id}).fetchall()[0]
    if total[0] == 0:
        known = [r[0] for r in con.sql("SELECT DISTINCT run_id FROM step_reqs ORDER BY 1").fetchall()]
        raise CalibrationDataError(f"no request-steps for run {run_id!r}; runs with steps: "
                                   f"{', '.join(known) or 'none'} (collect one with dspark-obs collect or demo)")
    if total[1] == 0:
        raise CalibrationDataError(
            f"run {run_id!r} recorded no confidence or survival ({mode or 'unknown'} mode): static mode builds "
            "no confidence head; calibrate a compact or cap-accept run")
    if labelled == 0:
        raise CalibrationDataError(f"no request-steps of run {run_id!r} have {labels} labels "
                                   f"(source {source!r}); check that the runs pair up (same prompts and seeds)")
    return int(total[0])


def _events(table: pa.Table, run_id: str, labels: str, mode: str, gamma: int | None,
            source: str) -> tuple[RunEvents, dict]:
    """Arrays and labels of the fetched steps, and the counts behind the notes."""
    counts = {"rows": table.num_rows, "censored": 0, "fractional": 0}
    if not gamma:
        import pyarrow.compute as pc

        gamma = max(pc.max(pc.list_value_length(table.column(c))).as_py() or 0 for c in ("confidence", "survival"))
    conf = _list_matrix(table.column("confidence"), gamma, "confidence")
    surv = _list_matrix(table.column("survival"), gamma, "survival")
    surv = np.where(np.isnan(surv), np.cumprod(conf, axis=1), surv)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = surv / np.concatenate([np.ones((len(surv), 1)), surv[:, :-1]], axis=1)
    conf = np.where(np.isnan(conf), ratio, conf)

    col = {name: table.column(name).to_numpy() for name in ("window", "correct_drafts", "cap_trim")}
    if labels == "companion":
        y = block_events(table.column("true_block_accept").to_numpy(), gamma=gamma)
    elif labels == "reconstructed":
        mid = _ceiling_accept(table, col["correct_drafts"], col["window"], gamma)
        y = block_events(mid, gamma=gamma)
        counts["fractional"] = int(np.sum(mid != np.round(mid)))
    elif mode in ("cap-accept", "static"):
        y = block_events(col["correct_drafts"] + col["cap_trim"], gamma=gamma)
    else:
        y = observed_events(col["correct_drafts"], col["window"], gamma=gamma)
        counts["censored"] = int(((col["correct_drafts"] == col["window"]) & (col["window"] < gamma)).sum())
    ev = RunEvents(run_id, labels, mode, gamma, source, table.column("unit").to_numpy(zero_copy_only=False),
                   table.column("workload").to_numpy(zero_copy_only=False), table.column("dp_rank").to_numpy(),
                   table.column("forward_ct").to_numpy(), surv, conf, y)
    return ev, counts


def _ceiling_accept(table: pa.Table, correct: np.ndarray, window: np.ndarray, gamma: int) -> np.ndarray:
    """The ceiling's ``mid`` in drafts; checks its unit on the steps whose acceptance is known."""
    mid = np.asarray(table.column("mid").to_numpy(zero_copy_only=False), dtype=np.float64)
    exact = (correct < window) | (window >= gamma)  # uncensored: the block acceptance is correct_drafts
    if exact.any() and not np.allclose(mid[exact], correct[exact]):
        if np.allclose(mid[exact], correct[exact] + 1):  # acc_len units (SGLang's lo = w + 1 + extra)
            mid = mid - 1.0
        else:
            raise CalibrationDataError("ceiling.mid disagrees with correct_drafts on uncensored steps; "
                                       "re-run `dspark-obs estimate` for this run")
    return np.where(np.isnan(mid), np.nan, np.clip(mid, 0.0, gamma))


# -- the thin layer ------------------------------------------------------------------


@dataclass(frozen=True)
class RunCalibration:
    """What :func:`calibrate_run` wrote: rows of ``calibration`` and ``calibration_bins``."""

    run_id: str
    labels: str
    summary: pa.Table
    bins: pa.Table
    notes: tuple[str, ...] = field(default=())


def _connect(con_or_store):
    from dspark_obs import sql

    return sql.connection_and_store(con_or_store)


def _position_rows(ev: RunEvents, mask: np.ndarray, k: int, workload: str, binnings, weights, gidx,
                   level: float, n_boot: int) -> tuple[list[dict], list[dict]]:
    y, p = ev.y[mask, k], ev.survival[mask, k]
    ok = ~np.isnan(y) & ~np.isnan(p)
    y, p, g = y[ok], np.clip(p[ok], 0.0, 1.0), gidx[mask][ok]
    base = {"workload": workload, "position": k + 1, "labels": ev.labels}
    common = {"mode": ev.mode or None, "label_source": ev.label_source, "n": int(y.size),
              "n_requests": int(np.count_nonzero(np.bincount(g))) if g.size else 0,  # distinct groups (g >= 0)
              "bootstrap": n_boot if y.size and n_boot else 0}
    if y.size:
        common.update(mean_predicted=float(p.mean()), observed_rate=float(y.mean()), brier=brier_score_loss(y, p),
                      log_loss=log_loss(y, p), auroc=_none_if_nan(auroc_score(y, p)))
    rows, bin_rows = [], []
    for name in binnings:
        n_bins, strategy = parse_binning(name)
        row = {**base, "binning": name, **common}
        if y.size:
            b = _binned(y, p, n_bins, strategy)
            row.update(ece=_ece(b), mce=_mce(b), debiased_ece=_debiased_ece(b))
            if n_boot:
                lo, hi = _interval(_resampled_ece(weights, g, b, p, y), level)
                row.update(ece_ci_lo=_none_if_nan(lo), ece_ci_hi=_none_if_nan(hi))
            c = _curve(b)
            bin_rows += [{**base, "binning": name, "bin": int(i), "bin_lo": float(lo_), "bin_hi": float(hi_),
                          "mean_predicted": float(mp), "observed_rate": float(r), "count": int(n)}
                         for i, lo_, hi_, mp, r, n in zip(c.bin, c.bin_lo, c.bin_hi, c.mean_predicted,
                                                          c.observed_rate, c.count)]
        rows.append(row)
    return rows, bin_rows


def _none_if_nan(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _check_options(binnings, n_bootstrap, confidence_level) -> None:
    for name in binnings:
        parse_binning(name)
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, (int, np.integer)) or n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be an integer >= 0 (0 = no CI), got {n_bootstrap!r}")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level!r}")


def summarise_events(ev: RunEvents, *, binnings=BINNINGS, n_bootstrap: int = 1000, confidence_level: float = 0.95,
                     seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """The ``calibration`` and ``calibration_bins`` rows of one :class:`RunEvents` (pure)."""
    _check_options(binnings, n_bootstrap, confidence_level)
    rows, bin_rows = [], []
    wl_code, wl_values = _factorize(ev.workload)
    workloads = ["*", *wl_values]
    rid_code, _ = _factorize(ev.rid)  # codes in sorted order of the rids
    for i, workload in enumerate(workloads):
        mask = np.ones(len(ev.rid), dtype=bool) if workload == "*" else wl_code == i - 1
        gidx = _dense(rid_code[mask])  # np.unique(ev.rid[mask], return_inverse=True)[1], without sorting strings
        full_gidx = np.zeros(len(ev.rid), dtype=np.int64)
        full_gidx[mask] = gidx
        n_groups = int(gidx.max()) + 1 if gidx.size else 0
        weights = _multinomial_weights(n_groups, n_bootstrap, seed + i) if n_bootstrap and n_groups else None
        for k in range(ev.gamma):
            r, b = _position_rows(ev, mask, k, workload, binnings, weights, full_gidx, confidence_level,
                                  n_bootstrap if weights is not None else 0)
            rows += r
            bin_rows += b
    return (pa.Table.from_pylist(rows, schema=CALIBRATION.remove_metadata()),
            pa.Table.from_pylist(bin_rows, schema=CALIBRATION_BINS.remove_metadata()))


def _factorize(values: np.ndarray) -> tuple[np.ndarray, list]:
    """Codes of ``values`` numbered in their sorted order, and the sorted distinct values.

    The same numbering as ``np.unique(values, return_inverse=True)``, by hashing
    each value once and sorting only the distinct ones.
    """
    import pandas as pd

    codes, uniques = pd.factorize(np.asarray(values), use_na_sentinel=False)
    uniques = np.asarray(uniques, dtype=object if np.asarray(values).dtype == object else None)
    if uniques.size == 0:
        return codes.astype(np.int64), []
    order = np.argsort(uniques, kind="stable")
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return rank[codes], uniques[order].tolist()


def _dense(codes: np.ndarray) -> np.ndarray:
    """Renumber non-negative codes 0..k-1 keeping their order (``np.unique(codes, return_inverse=True)[1]``)."""
    if codes.size == 0:
        return codes.astype(np.int64)
    present = np.zeros(int(codes.max()) + 1, dtype=np.int64)
    present[codes] = 1
    return (np.cumsum(present) - 1)[codes]


def calibrate_run(con_or_store, run_id: str, *, labels: str = "observed", companion: str | None = None,
                  binnings=BINNINGS, n_bootstrap: int = 1000, confidence_level: float = 0.95, seed: int = 0,
                  write: bool = True, chunk_rows: int | None = None, sample_rows: int | None = None,
                  progress=None) -> RunCalibration:
    """Score a run's survival predictions per workload x position x binning and store the result.

    ``con_or_store``: a :class:`~dspark_obs.store.Store`, a data root, or a
    connection from :func:`dspark_obs.sql.connect`.  ``labels``: one of
    :data:`LABEL_KINDS` (see the module docstring).  ``n_bootstrap`` request-level
    resamples give ``ece_ci_lo/hi`` (0 = none; ``seed`` makes them reproducible).

    A run of more than ``chunk_rows`` labelled steps (default 150k) is read a
    chunk of whole requests at a time, so memory does not grow with the run
    (:mod:`~dspark_obs.estimators.calibration_chunks`): every figure is then the
    one-pass value up to the order of float additions, except AUROC and the
    edges of equal-mass bins, which come from a sample of whole requests chosen
    by rid hash (``sample_rows`` steps, default 500k) when the run holds more.
    ``progress(done_steps, total_steps)`` is called after each chunk.

    The rows of (``run_id``, ``labels``) in ``calibration`` and
    ``calibration_bins`` replace older ones; other label kinds are kept.
    """
    from dspark_obs.estimators import calibration_chunks as chunks
    from dspark_obs.estimators.ceiling_chunks import DEFAULT_CHUNK_ROWS

    _check_options(binnings, n_bootstrap, confidence_level)
    chunk_rows = chunk_rows or DEFAULT_CHUNK_ROWS
    con, store = _connect(con_or_store)
    plan = chunks.plan_run(con, run_id, labels=labels, companion=companion, chunk_rows=chunk_rows,
                           units=n_bootstrap > 0)
    if len(plan.chunks) == 1:  # one pass
        ev = load_events(con, run_id, labels=labels, companion=companion)
        summary, bins = summarise_events(ev, binnings=binnings, n_bootstrap=n_bootstrap,
                                         confidence_level=confidence_level, seed=seed)
        notes = ev.notes
        if progress is not None:
            progress(len(ev.rid), len(ev.rid))
    else:
        summary, bins, notes = chunks.summarise_in_chunks(
            con, run_id, plan, labels=labels, binnings=binnings, n_bootstrap=n_bootstrap,
            confidence_level=confidence_level, seed=seed,
            sample_rows=sample_rows or chunks.DEFAULT_SAMPLE_ROWS, progress=progress)
    if write:
        for table, rows in (("calibration", summary), ("calibration_bins", bins)):
            _replace_labels(store, table, run_id, labels, rows)
    return RunCalibration(run_id, labels, summary, bins, notes)


def _replace_labels(store, table: str, run_id: str, labels: str, rows: pa.Table) -> None:
    """Rewrite the run's partition of ``table`` with ``rows`` in place of the old ``labels`` rows.

    The store has no atomic partition replace, so a reader may briefly see the
    partition empty (between the drop and the write).
    """
    import pyarrow.compute as pc

    old = store.read(table, run_id).drop_columns(["run_id"])
    keep = old.filter(pc.not_equal(old.column("labels"), labels)) if old.num_rows else old
    merged = pa.concat_tables([keep.cast(rows.schema), rows]) if keep.num_rows else rows
    store.drop_run(table, run_id)
    store.write(table, run_id, merged)
