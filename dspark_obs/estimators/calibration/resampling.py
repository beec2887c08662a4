"""Request-level bootstrap of every calibration metric at once, vectorised over resamples.

A resample draws requests with replacement; its metrics are those of the
request-steps it drew (steps of one request are not independent, so requests
are the unit, as in :func:`~dspark_obs.estimators.calibration.metrics.bootstrap_calibration_error`).
Each resample is a row of Poisson(1) weights over requests
(:func:`dspark_obs.estimators.stats.group_weights`, the one bootstrap-weights
function): the per-request sufficient statistics (:class:`RequestSums`: per bin,
per score level) are computed once, and every metric of every resample is a
matrix product with them, then the metrics' own formulas
(:func:`~.metrics.ece_from_sums`, :func:`~.metrics.debiased_terms`,
:func:`~.metrics.auroc_from_levels`).

With all weights 1 the results equal :func:`~.metrics.expected_calibration_error`,
``debiased_calibration_error``, ``brier_score_loss`` and ``auroc_score``.  For
AUROC over more than ``auroc_levels`` distinct scores, :func:`resampled_metrics`
ranks the resamples on scores rounded to ``1 / auroc_levels`` (scores within one
level count as ties), which keeps a resample linear in the number of levels
instead of the number of steps; it serves the standard error only, the figure
itself is exact.  ``dspark-obs report`` draws its intervals and drift tests from here.
"""

from __future__ import annotations

import copy

import numpy as np
from scipy import sparse

from dspark_obs.estimators.calibration.metrics import (EPS_PROB, auroc_from_levels, bin_edges, bin_ids,
                                                       debiased_terms, ece_from_sums, parse_binning, request_bins)
from dspark_obs.estimators.stats import group_weights

__all__ = ["METRICS", "AUROC_LEVELS", "RequestSums", "calibration_replicates", "resampled_metrics", "resampled_sums",
           "resampled_together", "ResampleWeights", "figures_of_sums"]

METRICS = ("ece", "debiased_ece", "brier", "auroc", "acceptance")
AUROC_LEVELS = 4096
_CELLS_PER_CHUNK = 4_000_000
"""Bound on resamples x max(levels, requests) held at once (about 32 MB of float64 per array)."""


class RequestSums:
    """One sample's sufficient statistics per request; called with resample weights, every metric.

    Per request: per bin the count and the sums of the clamped prediction and the
    label (:func:`~.metrics.request_bins`); the steps, the labels' and the squared
    errors' sums; per score level the positive and negative weight (AUROC).
    ``auroc_levels``: None ranks on the exact scores; an integer rounds the
    scores to that many levels when they have more distinct values.
    """

    def __init__(self, y_true, y_prob, groups, *, n_groups: int, binning: str = "width15",
                 auroc_levels: int | None = None, edges: np.ndarray | None = None) -> None:
        y = np.asarray(y_true, dtype=np.float64)
        p_raw = np.clip(np.asarray(y_prob, dtype=np.float64), 0.0, 1.0)
        g = np.asarray(groups, dtype=np.int64)
        if not (y.shape == p_raw.shape == g.shape) or y.ndim != 1:
            raise ValueError(f"y_true, y_prob and groups must be 1-D of one length, got {y.shape}, {p_raw.shape}, "
                             f"{g.shape}")
        if g.size and (g.min() < 0 or g.max() >= n_groups):
            raise ValueError(f"groups must index the {n_groups} columns of weights, got values in "
                             f"[{g.min()}, {g.max()}]")
        self.n_groups = n_groups
        n_bins, strategy = parse_binning(binning)
        p = np.clip(p_raw, EPS_PROB, 1.0 - EPS_PROB)
        if edges is None:   # the sample's own edges, else those its caller binned it by (equal-mass bins)
            edges = bin_edges(p, n_bins, strategy)
        ids = bin_ids(p, edges, strategy) if y.size else np.zeros(0, np.int64)
        self.count, self.psum, self.ysum = request_bins(g, ids, p, y, n_groups, n_bins)
        self.n_g = np.bincount(g, minlength=n_groups).astype(np.float64)
        self.y_g = np.bincount(g, weights=y, minlength=n_groups)
        self.sq_g = np.bincount(g, weights=(p_raw - y) ** 2, minlength=n_groups)
        # AUROC: positive and negative weight of each request at each (tied) score, scores ascending; built
        # when first asked for (a sort of the steps and two sparse matrices: callers that take AUROC's
        # SE elsewhere never pay for them)
        self._scored = (y, p_raw, g)
        self._levels = auroc_levels
        self._ranks: tuple | None = None

    def _ranked(self) -> tuple:
        """``(levels, positive weight [levels, requests], negative weight)``."""
        if self._ranks is None:
            y, p_raw, g = self._scored
            _, level = np.unique(p_raw, return_inverse=True)
            if self._levels is not None and level.size and int(level.max()) + 1 > self._levels:
                level = _rounded_levels(p_raw, self._levels)
            n = int(level.max()) + 1 if level.size else 0
            self._ranks = (n, sparse.csr_matrix((y, (level, g)), shape=(n, self.n_groups)),
                           sparse.csr_matrix((1.0 - y, (level, g)), shape=(n, self.n_groups)))
        return self._ranks

    @property
    def n_levels(self) -> int:
        return self._ranked()[0]

    def with_auroc_levels(self, auroc_levels: int) -> "RequestSums":
        """These sums as built with ``auroc_levels`` (the scores rounded to that many levels when they have
        more distinct values), without recounting the rest."""
        out = copy.copy(self)
        out._levels = auroc_levels if self._levels is None else min(self._levels, auroc_levels)
        out._ranks = None if out._levels != self._levels else self._ranks
        return out

    def __call__(self, weights: np.ndarray, *, auroc: bool = True) -> dict[str, np.ndarray]:
        """Every metric per row of ``weights``; without ``auroc`` all but AUROC (its re-ranking is the one
        cost per step and resample: ``dspark-obs report`` takes its SE from
        :func:`~.metrics.clustered_auroc` instead)."""
        w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
        if w.shape[1] != self.n_groups:
            raise ValueError(f"weights must have {self.n_groups} columns (one per request), got {w.shape[1]}")
        out = self.metrics_of(w @ self.columns())
        if auroc:
            out["auroc"] = self._auroc(w)
        return out

    def columns(self) -> np.ndarray:
        """The per-request statistics side by side (``[requests, 3 bins + 3]``): a resample's are one product."""
        return np.hstack([self.count, self.psum, self.ysum, self.n_g[:, None], self.sq_g[:, None],
                          self.y_g[:, None]])

    def metrics_of(self, resampled: np.ndarray) -> dict[str, np.ndarray]:
        """All metrics but AUROC from ``weights @ self.columns()`` (one row per resample)."""
        return figures_of_sums(resampled, self.count.shape[1])

    def _auroc(self, w: np.ndarray) -> np.ndarray:
        n_levels, pos_t, neg_t = self._ranked()
        if n_levels == 0:
            return np.full(w.shape[0], np.nan)
        wt = np.ascontiguousarray(w.T)
        pos = np.ascontiguousarray(np.asarray(pos_t @ wt).T)  # [B, levels], scores ascending
        neg = np.ascontiguousarray(np.asarray(neg_t @ wt).T)  # (row-contiguous: a fast cumsum)
        return auroc_from_levels(pos, neg)


def calibration_replicates(y_true, y_prob, groups, weights: np.ndarray, *, binning: str = "width15"
                           ) -> dict[str, np.ndarray]:
    """Each metric of :data:`METRICS` for every resample (row of ``weights``), exact.

    Parameters
    ----------
    y_true, y_prob : array-like of shape (n,)
        Labels in [0, 1] (soft labels allowed) and predicted survivals; no NaN.
    groups : int array of shape (n,)
        Request index of each sample, 0..n_groups-1 (the columns of ``weights``).
    weights : float array of shape (B, n_groups)
        How often each request is drawn per resample; ``np.ones((1, G))`` gives the sample's own metrics.
    binning : str
        ``widthN`` or ``massN``, as in the ``calibration`` table.

    Returns ``{metric: float array of shape (B,)}``; NaN where a resample leaves
    the metric undefined (no positives or no negatives for AUROC).

    >>> w = np.ones((1, 2))
    >>> r = calibration_replicates([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3], [0, 0, 1, 1], w)
    >>> round(float(r["ece"][0]), 3), float(r["auroc"][0]), float(r["acceptance"][0])
    (0.175, 1.0, 0.5)
    """
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    return RequestSums(y_true, y_prob, groups, n_groups=w.shape[1], binning=binning)(w)


def resampled_metrics(y_true, y_prob, groups, *, n_groups: int, n_resamples: int, seed: int,
                      binning: str = "width15", auroc_levels: int | None = AUROC_LEVELS,
                      keys: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every metric over ``n_resamples`` request-level resamples, drawn in chunks.

    The weights are those of :func:`dspark_obs.estimators.stats.group_weights` with
    ``seed`` and the groups' ``keys`` (drawn chunk by chunk: a resample's row
    does not depend on the chunk), so memory stays bounded for runs with
    hundreds of thousands of steps.
    """
    sums = RequestSums(y_true, y_prob, groups, n_groups=n_groups, binning=binning, auroc_levels=auroc_levels)
    return resampled_sums(sums, ResampleWeights(n_groups, n_resamples, seed, keys))


class ResampleWeights:
    """The request weights of ``n_resamples`` resamples, in blocks of rows, drawn once and kept (as small
    integers: a Poisson(1) count is at most 23) for every sample of the same requests (every position)."""

    def __init__(self, n_groups: int, n_resamples: int, seed: int, keys: np.ndarray | None = None) -> None:
        self.n_groups, self.n_resamples, self.seed, self.keys = n_groups, n_resamples, seed, keys
        self._drawn: dict[int, list[np.ndarray]] = {}   # block rows -> blocks

    def blocks(self, rows: int):
        """Float64 weights, ``rows`` resamples at a time (:func:`~dspark_obs.estimators.stats.group_weights`)."""
        kept = self._drawn.get(rows)
        if kept is not None:
            yield from (block.astype(np.float64) for block in kept)
            return
        kept, done = [], 0
        while done < self.n_resamples:
            size = min(rows, self.n_resamples - done)
            block = group_weights(self.n_groups, size, self.seed, self.keys, start=done)
            kept.append(block.astype(np.uint8))
            yield block
            done += size
        self._drawn[rows] = kept


def resampled_sums(sums: RequestSums, weights: ResampleWeights, *, auroc: bool = True) -> dict[str, np.ndarray]:
    """:func:`resampled_metrics` of prepared sums with (shared) weights (without ``auroc``: all but AUROC)."""
    rows = max(1, min(weights.n_resamples, _CELLS_PER_CHUNK // max(sums.n_levels if auroc else 0, sums.n_groups, 1)))
    parts = [sums(block, auroc=auroc) for block in weights.blocks(rows)]
    return {m: np.concatenate([p[m] for p in parts]) if parts else np.zeros(0) for m in METRICS if auroc or m != "auroc"}


def resampled_together(many: list[RequestSums], weights: ResampleWeights) -> list[dict[str, np.ndarray]]:
    """``resampled_sums(s, weights, auroc=False)`` for each of ``many`` sums over the same requests (e.g. one
    per draft position), at once: their columns side by side, so that each block of weights is converted
    and multiplied once, by one wide product, instead of once per sums by a narrow one."""
    if not many:
        return []
    stacked = np.hstack([s.columns() for s in many])
    edges = np.cumsum([0, *(3 * s.count.shape[1] + 3 for s in many)])
    rows = max(1, min(weights.n_resamples, _CELLS_PER_CHUNK // max(many[0].n_groups, 1)))
    parts = [block @ stacked for block in weights.blocks(rows)]
    out = []
    for s, lo, hi in zip(many, edges[:-1], edges[1:]):
        got = [s.metrics_of(part[:, lo:hi]) for part in parts]
        out.append({m: np.concatenate([g[m] for g in got]) if got else np.zeros(0) for m in METRICS if m != "auroc"})
    return out


def figures_of_sums(resampled: np.ndarray, bins: int) -> dict[str, np.ndarray]:
    """ECE, debiased ECE, Brier and acceptance of each row of summed statistics laid out as
    :meth:`RequestSums.columns` (``[count, pred sums, label sums]`` per bin, then steps, squared errors, labels):
    a resample's figures, whoever summed them (one pass, or chunks of requests)."""
    count, psum, ysum = resampled[:, :bins], resampled[:, bins:2 * bins], resampled[:, 2 * bins:3 * bins]
    n, sq, ys = resampled[:, 3 * bins], resampled[:, 3 * bins + 1], resampled[:, 3 * bins + 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"ece": ece_from_sums(count, psum, ysum),
                "debiased_ece": np.sum(debiased_terms(count, psum, ysum), axis=1) / count.sum(axis=1),
                "brier": sq / n, "acceptance": ys / n}


def _rounded_levels(p_raw: np.ndarray, auroc_levels: int) -> np.ndarray:
    """Each score's level among the distinct ``floor(p * auroc_levels)`` values, ascending."""
    return np.unique(np.minimum((p_raw * auroc_levels).astype(np.int64), auroc_levels - 1), return_inverse=True)[1]
