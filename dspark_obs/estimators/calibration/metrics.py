"""Calibration metrics: arrays in, numbers out.

Pure functions in scikit-learn's style -- ``y_true, y_prob`` positional,
options keyword-only, ``y_true`` 0/1 or soft labels in [0, 1] -- whose
docstrings state the exact formula, binning rule and edge cases, so that each
can be checked on its own: ``tests/test_calibration.py`` tests them against
scikit-learn (``calibration_curve``, ``brier_score_loss``, ``log_loss``,
``roc_auc_score``) and against plain loops.  No I/O: reading a run's events is
:mod:`dspark_obs.estimators.calibration.events`, writing the tables
:mod:`dspark_obs.estimators.calibration` (which re-exports the public names).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtr, ndtri

from dspark_obs.estimators import stats as bootstrap

__all__ = [
    "EPS_PROB", "BINNINGS", "ReliabilityCurve",
    "expected_calibration_error", "maximum_calibration_error", "debiased_calibration_error",
    "brier_score_loss", "log_loss", "auroc_score", "reliability_curve",
    "bootstrap_calibration_error", "parse_binning", "auroc_from_levels", "clustered_auroc", "request_bins",
]

EPS_PROB = 1e-8
"""Probabilities are clamped to [EPS_PROB, 1 - EPS_PROB] before binning and logs (SGLang's EPS_PROB)."""
BINNINGS = ("width15", "width20", "mass15")
"""Equal-width 15 bins (SGLang's convention), 20 (DeepSpec's), and 15 equal-mass bins."""
_STRATEGIES = ("uniform", "quantile")


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


def check_binning(n_bins: Any, strategy: Any) -> None:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1, got {n_bins!r}")
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")


def _checked_bins(y_true: Any, y_prob: Any, n_bins: Any, strategy: Any) -> Bins:
    """The public metrics' edge: inputs and binning checked, then binned."""
    y, p = _check_pair(y_true, y_prob)
    check_binning(n_bins, strategy)
    return binned(y, p, n_bins, strategy)


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
class Bins:
    """The sufficient statistics of the binned metrics: per bin, the count and the sums of ``p`` and ``y``.

    ECE, MCE, debiased ECE and the reliability curve are functions of them
    (:func:`ece_of`, ...); sums of disjoint samples add, so chunks, shards and
    bootstrap resamples (a weighted sum of :func:`request_bins`, in ``calibrate``
    and in :mod:`~.resampling` for the report) reuse the same formulas
    (:func:`ece_from_sums`, :func:`debiased_terms`).
    """

    edges: np.ndarray  # [n_bins + 1]
    ids: np.ndarray  # [n] bin of each sample
    count: np.ndarray  # [n_bins]
    pred_sum: np.ndarray
    true_sum: np.ndarray


def bin_edges(p: np.ndarray, n_bins: int, strategy: str) -> np.ndarray:
    if strategy == "quantile" and p.size:
        return np.quantile(p, np.linspace(0.0, 1.0, n_bins + 1))
    return np.linspace(0.0, 1.0, n_bins + 1)


def bin_ids(p: np.ndarray, edges: np.ndarray, strategy: str) -> np.ndarray:
    n_bins = edges.size - 1
    if strategy == "uniform":  # SGLang: floor(p * n_bins), an edge belongs to the bin above
        return np.clip((p * n_bins).astype(np.int64), 0, n_bins - 1)
    return np.searchsorted(edges[1:-1], p)  # scikit-learn's quantile rule


def binned(y: np.ndarray, p: np.ndarray, n_bins: int, strategy: str, edges: np.ndarray | None = None) -> Bins:
    """The :class:`Bins` of ``p`` (clamped) against ``y``; ``edges`` default to ``p``'s own (a chunk of a run
    passes the run's)."""
    p = np.clip(p, EPS_PROB, 1.0 - EPS_PROB)
    edges = bin_edges(p, n_bins, strategy) if edges is None else edges
    ids = bin_ids(p, edges, strategy)
    return Bins(edges, ids, np.bincount(ids, minlength=n_bins).astype(np.float64),
                 np.bincount(ids, weights=p, minlength=n_bins), np.bincount(ids, weights=y, minlength=n_bins))


def request_bins(groups: np.ndarray, ids: np.ndarray, p: np.ndarray, y: np.ndarray, n_groups: int,
                 n_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request and bin (``[n_groups, n_bins]``): the count and the sums of ``p`` and ``y``.

    The binned metrics' sufficient statistics, one row per resampling unit: a
    bootstrap resample's :class:`Bins` sums are ``weights @`` each (``calibrate``'s
    one pass and its chunks, the report's :class:`~.resampling.RequestSums`).
    ``p`` already clamped, ``ids`` its bins (:func:`bin_ids`).
    """
    cell = np.asarray(groups, dtype=np.int64) * n_bins + ids
    size = n_groups * n_bins
    count = np.bincount(cell, minlength=size).astype(np.float64).reshape(n_groups, n_bins)
    return (count, np.bincount(cell, weights=p, minlength=size).reshape(n_groups, n_bins),
            np.bincount(cell, weights=y, minlength=size).reshape(n_groups, n_bins))


def ece_from_sums(count: np.ndarray, pred_sum: np.ndarray, true_sum: np.ndarray) -> np.ndarray:
    """ECE from bin sums along the last axis (``[..., n_bins]``; e.g. one row per bootstrap resample)."""
    return np.abs(pred_sum - true_sum).sum(axis=-1) / count.sum(axis=-1)


def debiased_terms(count: np.ndarray, pred_sum: np.ndarray, true_sum: np.ndarray) -> np.ndarray:
    """Per bin ``n_b (2 |gap_b| - E|N(gap_b, sd_b^2)|)`` (0 for an empty bin): their sum over the bins, divided
    by the count, is the debiased ECE (the folded-normal mean is that of Kumar et al.'s resampled ECE terms)."""
    full = count > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(full, true_sum / count, 0.0)
        gap = np.where(full, np.abs(pred_sum / count - rate), 0.0)
        sd = np.where(full, np.sqrt(np.clip(rate * (1.0 - rate), 0.0, None) / count), 0.0)
        z = np.where(sd > 0, gap / sd, np.inf)
        folded = np.where(sd > 0, sd * np.sqrt(2.0 / np.pi) * np.exp(-0.5 * z * z) + gap * (1.0 - 2.0 * ndtr(-z)),
                          gap)
        return np.where(full, count * (2.0 * gap - folded), 0.0)


def ece_of(b: Bins) -> float:
    total = b.count.sum()
    return float(ece_from_sums(b.count, b.pred_sum, b.true_sum)) if total else math.nan


def mce_of(b: Bins) -> float:
    full = b.count > 0
    if not full.any():
        return math.nan
    return float(np.max(np.abs(b.pred_sum[full] - b.true_sum[full]) / b.count[full]))


def debiased_ece_of(b: Bins) -> float:
    total = b.count.sum()
    if not total:
        return math.nan
    return float(np.sum(debiased_terms(b.count, b.pred_sum, b.true_sum)[b.count > 0]) / total)


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
    return ece_of(_checked_bins(y_true, y_prob, n_bins, strategy))


def maximum_calibration_error(y_true, y_prob, *, n_bins: int = 15, strategy: str = "uniform") -> float:
    """Largest ``|mean(y_prob)_b - mean(y_true)_b|`` over non-empty bins (NaN if empty).

    Same inputs and binning as :func:`expected_calibration_error`.

    >>> round(maximum_calibration_error([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3]), 3)
    0.3
    """
    return mce_of(_checked_bins(y_true, y_prob, n_bins, strategy))


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
    return debiased_ece_of(_checked_bins(y_true, y_prob, n_bins, strategy))


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
    _, level = np.unique(p, return_inverse=True)  # ascending scores; ties share a level
    return float(auroc_from_levels(np.bincount(level, weights=y), np.bincount(level, weights=1.0 - y)))


def auroc_from_levels(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """AUROC from the positive and negative weight at each distinct score, scores ascending along the last
    axis (``[..., levels]``; e.g. one row per bootstrap resample): ties count one half; NaN without
    positives or negatives.

    >>> float(auroc_from_levels(np.array([0.0, 1.0, 0.0, 1.0]), np.array([1.0, 0.0, 1.0, 0.0])))  # as auroc_score's
    0.75
    """
    below = np.cumsum(neg, axis=-1) - neg
    pos_total, neg_total = pos.sum(axis=-1), neg.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        auc = np.sum(pos * (below + 0.5 * neg), axis=-1) / (pos_total * neg_total)
    return np.where((pos_total > 0) & (neg_total > 0), auc, np.nan)


def clustered_auroc(y_true, y_prob, groups, *, n_groups: int | None = None,
                    levels: np.ndarray | None = None) -> tuple[float, float]:
    """``(AUROC, its standard error)`` when steps come in correlated clusters (the requests).

    DeLong's placement values summed per cluster (Obuchowski 1997, *Nonparametric
    analysis of clustered ROC curve data*, Biometrics 53:567-578).  With ``M``
    positive and ``N`` negative weight, a step's placement as a positive is the
    share of negative weight below its score (ties one half), as a negative the
    share of positive weight above it; per cluster ``i`` with ``m_i``, ``n_i``
    and placement sums ``V10_i``, ``V01_i``::

        S10 = I10 / ((I10 - 1) M) * sum_i (V10_i - m_i AUROC)^2      (I10: clusters with positive weight)
        S01 = I01 / ((I01 - 1) N) * sum_i (V01_i - n_i AUROC)^2      (I01: clusters with negative weight)
        S11 = I / (I - 1) * sum_i (V10_i - m_i AUROC)(V01_i - n_i AUROC)
        Var = S10 / M + S01 / N + 2 S11 / (M N)

    Why not the request bootstrap the other figures use: a resample's AUROC
    re-ranks every step, a product of ``steps x resamples`` per cell, about
    10^10 operations per cell at ten million steps; this is one sort, and it
    estimates the same clustered variance (``tests/test_calibration_resampling.py`` checks
    it against the spread of AUROCs over simulated runs and against the
    bootstrap).  Soft labels count as in :func:`auroc_score`, whose value the
    first element equals.  ``(NaN, NaN)`` without positives or negatives; the SE
    is NaN with fewer than two clusters on either side.  ``n_groups``: ``groups``
    are already cluster numbers ``0..n_groups-1`` (not relabelled; a number
    without steps is no cluster).  ``levels``: each step's rank among the
    scores (ascending, ties equal, gaps allowed: e.g. its level among a larger
    set's scores), which saves the sort when several subsets of one set of
    steps are scored.

    >>> auc, se = clustered_auroc([0, 1, 0, 1, 0, 1], [0.1, 0.8, 0.4, 0.35, 0.2, 0.9], [0, 0, 1, 1, 2, 2])
    >>> round(auc, 4), round(se, 4)
    (0.8889, 0.2222)
    """
    y, p = _check_pair(y_true, y_prob)
    g = np.asarray(groups, dtype=np.int64)
    if g.shape != y.shape:
        raise ValueError(f"groups must be 1-D of the labels' length, got {g.shape} for {y.shape}")
    neg_w = 1.0 - y
    pos_total, neg_total = float(y.sum()), float(neg_w.sum())
    if not y.size or pos_total <= 0 or neg_total <= 0:
        return math.nan, math.nan
    level = np.unique(p, return_inverse=True)[1] if levels is None else np.asarray(levels, dtype=np.int64)
    if level.shape != y.shape:
        raise ValueError(f"levels must be 1-D of the labels' length, got {level.shape} for {y.shape}")
    pos, neg = np.bincount(level, weights=y), np.bincount(level, weights=neg_w, minlength=int(level.max()) + 1)
    neg_below = np.cumsum(neg) - 0.5 * neg            # negative weight below each score, ties one half
    pos_above = pos_total - np.cumsum(pos) + 0.5 * pos
    auc = float(np.dot(pos, neg_below) / (pos_total * neg_total))
    cluster = np.unique(g, return_inverse=True)[1] if n_groups is None else g
    size = 0 if n_groups is None else n_groups
    m = np.bincount(cluster, weights=y, minlength=size)
    n = np.bincount(cluster, weights=neg_w, minlength=size)
    a = np.bincount(cluster, weights=y * neg_below[level] / neg_total, minlength=size) - m * auc
    b = np.bincount(cluster, weights=neg_w * pos_above[level] / pos_total, minlength=size) - n * auc
    return auc, _obuchowski_se(a, b, m, n)


def _obuchowski_se(a: np.ndarray, b: np.ndarray, m: np.ndarray, n: np.ndarray) -> float:
    """The SE of :func:`clustered_auroc` from each cluster's centred placement sums ``a``, ``b`` and its
    positive and negative weight ``m``, ``n``."""
    pos_total, neg_total = float(m.sum()), float(n.sum())
    i10, i01 = int(np.count_nonzero(m > 0)), int(np.count_nonzero(n > 0))
    i = int(np.count_nonzero((m > 0) | (n > 0)))
    if min(i10, i01) < 2:
        return math.nan
    s10 = i10 / ((i10 - 1) * pos_total) * float(np.dot(a, a))
    s01 = i01 / ((i01 - 1) * neg_total) * float(np.dot(b, b))
    s11 = i / (i - 1) * float(np.dot(a, b))
    return math.sqrt(max(s10 / pos_total + s01 / neg_total + 2.0 * s11 / (pos_total * neg_total), 0.0))


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

    def rows(self) -> list[dict[str, Any]]:
        """One dict per bin with the ``calibration_bins`` table's columns of a bin."""
        return [{"bin": int(i), "bin_lo": float(lo), "bin_hi": float(hi), "mean_predicted": float(mp),
                 "observed_rate": float(r), "count": int(n)}
                for i, lo, hi, mp, r, n in zip(self.bin, self.bin_lo, self.bin_hi, self.mean_predicted,
                                               self.observed_rate, self.count)]


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
    return curve_of(_checked_bins(y_true, y_prob, n_bins, strategy))


def curve_of(b: Bins) -> ReliabilityCurve:
    full = np.flatnonzero(b.count > 0)
    lo, hi = b.edges[full], b.edges[full + 1]
    n = b.count[full]
    return ReliabilityCurve(full, lo, hi, (lo + hi) / 2, b.pred_sum[full] / n, b.true_sum[full] / n,
                            n.astype(np.int64))


def bootstrap_calibration_error(y_true, y_prob, groups, *, n_bins: int = 15, strategy: str = "uniform",
                                n_resamples: int = 1000, confidence_level: float = 0.95,
                                seed: int = 0) -> tuple[float, float]:
    """Bootstrap CI of the ECE, resampling whole groups (requests): ``ece +- z * SE``.

    Steps of one request share its prompt and history, so they are not
    independent; resampling requests keeps that dependence.  Vectorised: the
    per-(request, bin) sums are computed once and each resample is a Poisson(1)
    reweighting of them, the weights drawn per group from ``(seed, group)``
    (:mod:`~dspark_obs.estimators.stats`), so a subset of the groups gets
    the very weights the whole sample would.  Bin edges stay those of the full sample.

    The interval is normal, around the estimate, with the bootstrap standard
    error (clipped to [0, 1]) -- not the percentile interval: the ECE is biased
    upwards (``|mean error|`` per bin), its resamples more so, and a percentile
    interval of a well-calibrated head can lie wholly above its own estimate.
    ``dspark-obs report`` draws the same interval.

    Parameters
    ----------
    groups : array-like of shape (n,)
        The resampling unit of each sample (request ids).
    n_resamples : int, default 1000
    confidence_level : float, default 0.95
    seed : int, default 0
        Seed of the per-group weights: the same inputs give the same interval.

    Returns ``(lo, hi)``; ``(nan, nan)`` for empty input.

    >>> lo, hi = bootstrap_calibration_error([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3], ["a", "a", "b", "b"])
    >>> bool(lo <= 0.175 <= hi)
    True
    """
    y, p = _check_pair(y_true, y_prob)
    check_binning(n_bins, strategy)
    g = np.asarray(groups)
    if g.shape != y.shape:
        raise ValueError(f"groups must have the length of y_true: {g.size} != {y.size}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be an integer >= 1, got {n_resamples!r}")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level!r}")
    if not y.size:
        return math.nan, math.nan
    uniques, gidx = np.unique(g, return_inverse=True)
    weights = bootstrap.poisson_weights(bootstrap.unit_keys(uniques.tolist()), n_resamples, seed)
    b = binned(y, p, n_bins, strategy)
    return normal_interval(ece_of(b), resampled_ece(weights, gidx, b, p, y), confidence_level)


def resampled_ece(weights: np.ndarray, gidx: np.ndarray, b: Bins, p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ECE of each resample (row of ``weights``) with the bins of ``b``."""
    count, psum, ysum = request_bins(gidx, b.ids, np.clip(p, EPS_PROB, 1.0 - EPS_PROB), y, weights.shape[1],
                                     b.count.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return ece_from_sums(weights @ count, weights @ psum, weights @ ysum)


def none_if_nan(x: float) -> float | None:
    """A figure as the tables store it: NaN (undefined, e.g. AUROC of one class) becomes null."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def normal_interval(value: float, samples: np.ndarray, level: float, *, lower: float | None = 0.0) -> tuple[float, float]:
    """``value +- z * SE`` with the resamples' standard error, clipped to [lower, 1] (see above).

    The one interval of every bootstrapped calibration figure (``calibrate`` and
    ``report``); ``lower=None`` leaves the lower end unclipped (the debiased ECE
    may be negative).
    """
    samples = samples[np.isfinite(samples)]
    if samples.size < 2 or not np.isfinite(value):
        return math.nan, math.nan
    half = float(ndtri((1 + level) / 2)) * float(samples.std(ddof=1))
    lo = value - half
    return (lo if lower is None else max(lower, lo)), min(1.0, value + half)
