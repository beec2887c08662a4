"""Tests for dspark_obs.report.stats: hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from dspark_obs.report.ceiling import pool_estimates
from dspark_obs.report.stats import (
    Z95, benjamini_hochberg, bootstrap_pvalue, clustered_mean, difference_ztest, poisson_interval,
    poisson_rate_test, se_from_ci, two_sided_p, welch_ttest, wilson_interval,
)


def test_wilson_interval_hand_computed():
    lo, hi = wilson_interval(8, 10)
    z = Z95
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.8 * 0.2 / 10 + z * z / 400) / (1 + z * z / 10)
    assert (lo, hi) == pytest.approx((centre - half, centre + half))
    assert wilson_interval(0, 50)[0] == 0.0 and wilson_interval(50, 50)[1] == 1.0
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def test_clustered_mean_equals_the_iid_se_with_singleton_clusters_and_grows_with_clustering():
    y = np.array([1.0, 0, 1, 1, 0, 1, 0, 1])
    mean, se, g = clustered_mean(y, np.arange(8))
    assert (mean, g) == (0.625, 8)
    assert se == pytest.approx(math.sqrt(8 / 7 * np.sum((y - mean) ** 2) / 64))
    _, se_pairs, _ = clustered_mean(np.array([1.0, 1, 0, 0, 1, 1, 0, 0]), np.array([0, 0, 1, 1, 2, 2, 3, 3]))
    _, se_iid, _ = clustered_mean(np.array([1.0, 1, 0, 0, 1, 1, 0, 0]), np.arange(8))
    assert se_pairs > se_iid  # perfectly correlated within requests: fewer effective samples


def test_difference_ztest_and_se_from_ci():
    se = se_from_ci(0.9, 1.1)
    assert se == pytest.approx(0.1 / Z95)
    delta, s, p = difference_ztest(0.5, 0.1, 0.3, 0.1)
    assert delta == pytest.approx(0.2) and s == pytest.approx(math.sqrt(0.02))
    assert p == pytest.approx(2 * st.norm.sf(0.2 / math.sqrt(0.02)))
    assert difference_ztest(0.5, None, 0.3, 0.1)[2] is None
    assert two_sided_p(0.0) == 1.0


def test_welch_poisson_and_bootstrap_pvalues():
    a, b = np.array([1.0, 2, 3, 4]), np.array([2.0, 4, 6, 8, 10])
    delta, se, p = welch_ttest(a, b)
    assert delta == pytest.approx(-3.5) and p == pytest.approx(st.ttest_ind(a, b, equal_var=False).pvalue)
    assert welch_ttest(a[:1], b)[2] is None
    assert poisson_rate_test(5, 100, 5, 100) == pytest.approx(1.0)
    assert poisson_rate_test(20, 100, 2, 100) < 0.001
    assert poisson_interval(0) == pytest.approx((0.0, 3.6889), abs=1e-4)
    assert bootstrap_pvalue(np.r_[np.full(500, 1.0), np.full(499, -1.0)]) == pytest.approx(1.0)


def test_benjamini_hochberg_hand_computed_and_monotone():
    assert benjamini_hochberg([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.2])
    assert benjamini_hochberg([]) == []
    q = benjamini_hochberg(np.linspace(0.001, 0.9, 30))
    assert all(x <= y + 1e-12 for x, y in zip(q, q[1:])) and max(q) <= 1


def test_pooled_estimates_weight_values_and_combine_standard_errors():
    value, se = pool_estimates([0.9, 0.8], [0.01, 0.02], [1, 3])
    assert value == pytest.approx(0.825) and se == pytest.approx(math.sqrt(0.25**2 * 1e-4 + 0.75**2 * 4e-4))
    assert pool_estimates([0.9], [None], [1])[1] is None
