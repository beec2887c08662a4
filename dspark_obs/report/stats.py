"""Small statistics for the report: intervals, significance tests and the FDR adjustment.

Pure functions on numbers and arrays.  Two-sided p-values throughout.

>>> round(two_sided_p(1.959964), 3)
0.05
>>> [round(q, 3) for q in benjamini_hochberg([0.01, 0.04, 0.03, 0.2])]
[0.04, 0.053, 0.053, 0.2]
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _st

from dspark_obs.estimators.stats import clustered_mean  # the request-clustered mean's one home


__all__ = ["Z95", "two_sided_p", "se_from_ci", "wilson_interval", "poisson_interval", "clustered_mean",
           "difference_ztest", "welch_ttest", "poisson_rate_test", "bootstrap_pvalue", "percentile_interval",
           "benjamini_hochberg"]

Z95 = 1.959963984540054
"""The 97.5% normal quantile: a 95% interval is the estimate +- Z95 standard errors."""


def two_sided_p(z: float) -> float:
    """P(|N(0,1)| >= |z|)."""
    return float(2.0 * _st.norm.sf(abs(z)))


def se_from_ci(low: float | None, high: float | None, *, level: float = 0.95) -> float | None:
    """The standard error a symmetric normal interval ``[low, high]`` at ``level`` implies (None if unknown).

    >>> round(se_from_ci(0.9, 1.1), 4)
    0.051
    """
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)) or high < low:
        return None
    return (high - low) / (2.0 * float(_st.norm.ppf(0.5 + level / 2)))


def wilson_interval(successes: float, n: float, *, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (NaNs for n = 0).

    >>> [round(v, 3) for v in wilson_interval(8, 10)]
    [0.49, 0.943]
    """
    if n <= 0:
        return math.nan, math.nan
    z = float(_st.norm.ppf(0.5 + level / 2))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= n else min(1.0, centre + half)
    return lo, hi


def poisson_interval(count: int, *, level: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) interval of a Poisson count.

    >>> [round(v, 3) for v in poisson_interval(0)]
    [0.0, 3.689]
    """
    alpha = 1 - level
    lo = 0.0 if count == 0 else float(_st.chi2.ppf(alpha / 2, 2 * count) / 2)
    hi = float(_st.chi2.ppf(1 - alpha / 2, 2 * count + 2) / 2)
    return lo, hi


def difference_ztest(value: float, se: float | None, baseline: float, baseline_se: float | None
                     ) -> tuple[float, float | None, float | None]:
    """``(delta, se_delta, p)`` of ``value - baseline`` for two independent normal estimates.

    p is None when a standard error is unknown; a zero combined SE gives p = 1
    for equal values and 0 otherwise.
    """
    delta = value - baseline
    if se is None or baseline_se is None or not (math.isfinite(se) and math.isfinite(baseline_se)):
        return delta, None, None
    s = math.sqrt(se * se + baseline_se * baseline_se)
    if s == 0:
        return delta, 0.0, 1.0 if delta == 0 else 0.0
    return delta, s, two_sided_p(delta / s)


def welch_ttest(a: np.ndarray, b: np.ndarray) -> tuple[float, float | None, float | None]:
    """``(mean(a) - mean(b), se, p)`` by Welch's unequal-variance t-test (None when a side has < 2 values)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    delta = float(a.mean() - b.mean()) if a.size and b.size else math.nan
    if a.size < 2 or b.size < 2:
        return delta, None, None
    se = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    if se == 0:
        return delta, 0.0, 1.0 if delta == 0 else 0.0
    res = _st.ttest_ind(a, b, equal_var=False)
    return delta, se, float(res.pvalue)


def poisson_rate_test(count: int, exposure: float, baseline_count: int, baseline_exposure: float) -> float | None:
    """Two-sided p of equal Poisson rates: ``count`` given the total is binomial in the exposure share.

    >>> poisson_rate_test(0, 100, 0, 100)
    1.0
    """
    if exposure <= 0 or baseline_exposure <= 0:
        return None
    total = int(count + baseline_count)
    if total == 0:
        return 1.0
    return float(_st.binomtest(int(count), total, exposure / (exposure + baseline_exposure)).pvalue)


def bootstrap_pvalue(differences: np.ndarray) -> float | None:
    """Two-sided p of 'no difference' from bootstrap replicates of a difference.

    ``2 * min(#(d <= 0) + 1, #(d >= 0) + 1) / (B + 1)``, capped at 1.

    >>> bootstrap_pvalue(np.full(999, 0.1))
    0.002
    """
    d = np.asarray(differences, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return None
    below, above = int(np.sum(d <= 0)), int(np.sum(d >= 0))
    return float(min(1.0, 2.0 * (min(below, above) + 1) / (d.size + 1)))


def percentile_interval(samples: np.ndarray, *, level: float = 0.95) -> tuple[float | None, float | None]:
    """Percentile interval of bootstrap replicates (None, None when none are finite)."""
    s = np.asarray(samples, dtype=np.float64)
    s = s[np.isfinite(s)]
    if s.size == 0:
        return None, None
    lo, hi = np.quantile(s, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def benjamini_hochberg(p_values) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q-values), in the input order."""
    p = np.asarray(list(p_values), dtype=np.float64)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p)
    ranked = p[order] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(q, 1.0)
    return out.tolist()
