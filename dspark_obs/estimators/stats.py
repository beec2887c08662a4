"""Statistics over requests, the unit steps cluster in: bootstrap weights and the clustered mean.

Bootstrap weights are drawn per request, not per position in a list: the same on any split of a run.

A request-level bootstrap reweights whole requests.  Drawing the weights as one
multinomial over the run's requests ties every weight to the request's position
among all of them, so a worker holding a subset of the requests cannot draw its
share.  This module draws the **Poisson bootstrap** instead (each request's
weight in each resample is an independent Poisson(1) count — the usual bootstrap
of distributed and streaming systems; it matches the multinomial as the number of
requests grows): the weight of request ``r`` in resample ``b`` is a pure function
of ``(seed, hash(rid), b)``.  Any process, given a request's rid, draws its
weights; sums of ``weights @ per-request sums`` over disjoint sets of requests
add up to the whole run's, in any order and on any number of machines.

>>> w = poisson_weights(unit_keys(["a", "b", "c"]), 4, seed=0)
>>> w.shape, bool((w == poisson_weights(unit_keys(["c"]), 4, seed=0)[:, [0]].repeat(3, 1)).any())
((4, 3), True)
"""

from __future__ import annotations

import math

import numpy as np

from dspark_obs.estimators.compiled import jit
from dspark_obs.keys import stable_keys

__all__ = ["unit_keys", "run_unit_keys", "poisson_weights", "weight_tiles", "group_weights", "BLOCK", "UNITS_PER_TILE",
           "clustered_mean", "clustered_mean_of_sums"]

BLOCK = 64
"""Resamples drawn and reduced at a time by callers that bound their memory."""

UNITS_PER_TILE = 4096
"""Units per tile of :func:`weight_tiles`: a ``[64, 4096]`` block of weights (2 MB) bounds what a caller
holds at once, where one ``[64, 193k]`` block is the requests of a 10M-step run."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)   # SplitMix64's finaliser
_U11, _U27, _U30, _U31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)   # uint64 shifts: never float
_POISSON_CDF = np.cumsum([math.exp(-1.0) / math.factorial(k) for k in range(24)])
# The uniform of a draw is m / 2**53 (m: the top 53 bits, exact in float64), so ``uniform >= cdf`` is
# ``m >= ceil(cdf * 2**53)``: the same counts from integer thresholds, without a float copy of the bits.
_POISSON_THRESHOLDS = np.ceil(_POISSON_CDF * 9007199254740992.0).astype(np.uint64)


def unit_keys(units) -> np.ndarray:
    """A stable 64-bit key per resampling unit (:func:`dspark_obs.keys.stable_keys`: a request's key).

    Units are hashed once each; pass distinct values (callers factorize first).
    """
    return stable_keys(units)


def run_unit_keys(run_id: str, units) -> np.ndarray:
    """:func:`unit_keys` of requests of the run ``run_id``: the rid's key mixed with the run's, so that two runs'
    requests of one rid (a replayed prompt set, an emulator's numbering) are resampled independently, as a
    drift test between runs and a baseline pooled from several assume.

    >>> a, b = run_unit_keys("night-1", ["r1"]), run_unit_keys("night-2", ["r1"])
    >>> bool(a[0] != b[0]), bool((run_unit_keys("night-1", ["r1"]) == a).all())
    (True, True)
    """
    return unit_keys(units) ^ _mix(stable_keys([run_id]))[0]


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 whose outputs look uniform (:func:`_poisson_draws`
    repeats its steps)."""
    x = np.array(x, dtype=np.uint64)
    x ^= x >> _U30
    x *= _M1
    x ^= x >> _U27
    x *= _M2
    x ^= x >> _U31
    return x


def poisson_weights(keys: np.ndarray, n_resamples: int, seed: int, *, start: int = 0) -> np.ndarray:
    """``[n_resamples, len(keys)]`` float64 Poisson(1) weights of resamples ``start ..``.

    ``keys`` from :func:`unit_keys`.  The weight depends only on the key, the
    seed and the resample's number, so a subset of units gets exactly the
    columns the whole run would, and a block of resamples the rows.  Each draw
    is the resample's stream mixed with the key (:func:`_mix`), and its count the
    number of CDF thresholds at or below its top 53 bits: one compiled pass
    (numba), where numpy made a dozen over every draw (1000 resamples of 193k
    requests: 2.2 CPU s in numpy).
    """
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    with np.errstate(over="ignore"):
        stream = _mix(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _GOLDEN
                      + np.arange(start, start + n_resamples, dtype=np.uint64) * _GOLDEN + _GOLDEN)
    weights = np.empty((n_resamples, keys.size))
    if weights.size:
        jit(_poisson_draws)(keys, stream, _POISSON_THRESHOLDS, weights)
    return weights


def _poisson_draws(keys, stream, thresholds, out):
    """:func:`poisson_weights` (compiled): ``out[r, u]`` = the thresholds at or below ``mix(keys[u] ^
    stream[r]) >> 11``, with :func:`_mix`'s steps.

    The first four thresholds are counted without a branch and the rest searched only past them (2% of
    draws): a search from the first mispredicted its exit at about every draw, 0, 1 and 2 being about as
    likely (193M draws: 1.48 -> 0.45 CPU s).
    """
    head = min(4, thresholds.size)
    for r in range(stream.size):
        s = stream[r]
        for u in range(keys.size):
            x = keys[u] ^ s
            x ^= x >> _U30
            x *= _M1
            x ^= x >> _U27
            x *= _M2
            x ^= x >> _U31
            x >>= _U11
            w = 0
            for j in range(head):
                w += x >= thresholds[j]
            if w == head:
                while w < thresholds.size and x >= thresholds[w]:
                    w += 1
            out[r, u] = w


def weight_tiles(keys: np.ndarray, n_resamples: int, seed: int):
    """:func:`poisson_weights` of ``keys`` in tiles: yields ``(start, lo, hi, weights)``, the weights
    ``[<= BLOCK, hi - lo]`` of resamples ``start ..`` for units ``lo:hi`` (every tile of one block of
    resamples, then the next), so a caller reduces ``weights @ sums[lo:hi]`` tile by tile."""
    keys = np.asarray(keys, dtype=np.uint64)
    for start in range(0, n_resamples, BLOCK):
        rows = min(BLOCK, n_resamples - start)
        for lo in range(0, keys.size, UNITS_PER_TILE):
            hi = min(lo + UNITS_PER_TILE, keys.size)
            yield start, lo, hi, poisson_weights(keys[lo:hi], rows, seed, start=start)


def group_weights(n_groups: int, n_resamples: int, seed: int, keys: np.ndarray | None = None,
                  start: int = 0) -> np.ndarray:
    """``[n_resamples, n_groups]``: each group's (request's) weight in each bootstrap resample.

    :func:`poisson_weights` of ``keys`` (default: the groups' indices), so the
    report resamples requests as ``calibrate`` does.
    """
    if keys is None:
        keys = unit_keys(range(n_groups))
    return poisson_weights(keys, n_resamples, seed, start=start)


def clustered_mean(y: np.ndarray, groups: np.ndarray, *, n_groups: int | None = None) -> tuple[float, float, int]:
    """Mean of ``y`` and its cluster-robust standard error (clusters = ``groups``); also the cluster count.

    Steps of one request are not independent; the ratio estimator's variance
    sums the squared cluster residuals, ``G / (G - 1) * sum_g (Y_g - p n_g)^2 / n^2``.
    ``n_groups``: ``groups`` are already cluster numbers ``0..n_groups-1`` (not
    relabelled; a number without steps is no cluster).

    >>> m, se, g = clustered_mean(np.array([1., 1, 0, 0]), np.array([0, 0, 1, 1]))
    >>> m, round(se, 3), g
    (0.5, 0.5, 2)
    """
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return math.nan, math.nan, 0
    g = np.unique(np.asarray(groups), return_inverse=True)[1] if n_groups is None else np.asarray(groups)
    n_g = np.bincount(g, minlength=n_groups or 0).astype(np.float64)
    y_g = np.bincount(g, weights=y, minlength=n_groups or 0)
    n, clusters = float(y.size), int(np.count_nonzero(n_g))
    mean = float(y_g.sum() / n)
    return mean, _clustered_se(float(np.sum((y_g - mean * n_g) ** 2)), n, clusters), clusters


def clustered_mean_of_sums(n: float, y_sum: float, sums, clusters: int) -> tuple[float, float]:
    """:func:`clustered_mean`'s mean and SE from sums a chunked pass adds up: the steps, the labels' sum and,
    over requests, ``(sum Y_g^2, sum Y_g n_g, sum n_g^2)`` (the squared residuals expanded).

    >>> clustered_mean_of_sums(4, 2.0, (4.0, 4.0, 8.0), 2)
    (0.5, 0.5)
    """
    if not n:
        return math.nan, math.nan
    mean = y_sum / n
    y2, yn, n2 = (float(v) for v in sums)
    return mean, _clustered_se(max(y2 - 2.0 * mean * yn + mean * mean * n2, 0.0), float(n), clusters)


def _clustered_se(residual_ss: float, n: float, clusters: int) -> float:
    """``sqrt(G / (G - 1) * sum_g (Y_g - p n_g)^2 / n^2)``; NaN with fewer than two clusters."""
    if clusters < 2:
        return math.nan
    return math.sqrt(clusters / (clusters - 1) * residual_ss / (n * n))
