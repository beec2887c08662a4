"""Tests for dspark_obs.estimators.calibration.resampling: the request bootstrap of every metric equals the
metrics' own formulas with unit weights, and calibrate's bootstrap with the same weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from dspark_obs.estimators import calibration as cal
from dspark_obs.estimators.calibration import resampling
from dspark_obs.estimators.calibration.resampling import calibration_replicates
from dspark_obs.estimators.stats import group_weights

Z95 = float(norm.ppf(0.975))


@pytest.mark.parametrize("binning", ["width15", "width20", "mass15"])
def test_bootstrap_metrics_with_unit_weights_equal_the_estimators(binning):
    rng = np.random.default_rng(3)
    n = 1500
    p = rng.random(n)
    y = (rng.random(n) < p**1.4).astype(float)
    y[::9] = 0.4  # soft labels, as reconstructed labels have
    groups = rng.integers(0, 120, n)
    got = {k: float(v[0]) for k, v in calibration_replicates(y, p, groups, np.ones((1, 120)), binning=binning).items()}
    n_bins, strategy = cal.parse_binning(binning)
    assert got["ece"] == pytest.approx(cal.expected_calibration_error(y, p, n_bins=n_bins, strategy=strategy))
    assert got["debiased_ece"] == pytest.approx(cal.debiased_calibration_error(y, p, n_bins=n_bins, strategy=strategy))
    assert got["brier"] == pytest.approx(cal.brier_score_loss(y, p))
    assert got["auroc"] == pytest.approx(cal.auroc_score(y, p))
    assert got["acceptance"] == pytest.approx(y.mean())


def test_bootstrap_resamples_requests_like_the_estimators_bootstrap():
    rng = np.random.default_rng(5)
    p = rng.random(800)
    y = (rng.random(800) < p).astype(float)
    groups = rng.integers(0, 60, 800)
    reps = calibration_replicates(y, p, groups, group_weights(60, 400, 11))["ece"]
    lo, hi = cal.bootstrap_calibration_error(y, p, groups, n_resamples=400, seed=11)
    ece, se = cal.expected_calibration_error(y, p), reps.std(ddof=1)  # the report's interval is calibrate's
    assert [lo, hi] == pytest.approx([max(0.0, ece - Z95 * se), ece + Z95 * se])


def test_bootstrap_auroc_is_nan_when_a_resample_has_one_class_and_inputs_are_checked():
    reps = calibration_replicates([1.0, 1.0], [0.2, 0.8], [0, 1], np.ones((1, 2)))
    assert math.isnan(reps["auroc"][0])
    with pytest.raises(ValueError, match="groups must index the 2 columns of weights"):
        calibration_replicates([1.0], [0.5], [2], np.ones((1, 2)))
    with pytest.raises(ValueError, match="must be 1-D of one length"):
        calibration_replicates([1.0, 0.0], [0.5], [0, 1], np.ones((1, 2)))


def test_chunked_resampling_draws_the_same_resamples_as_one_draw(monkeypatch):
    rng = np.random.default_rng(9)
    p = rng.random(300)
    y = (rng.random(300) < p).astype(float)
    groups = rng.integers(0, 40, 300)
    whole = calibration_replicates(y, p, groups, group_weights(40, 90, 4))
    monkeypatch.setattr(resampling, "_CELLS_PER_CHUNK", 300 * 7)  # 7 resamples per chunk
    chunked = resampling.resampled_metrics(y, p, groups, n_groups=40, n_resamples=90, seed=4)
    for metric in resampling.METRICS:
        assert chunked[metric] == pytest.approx(whole[metric], nan_ok=True)


def test_weights_kept_for_the_next_position_and_coarser_levels_change_no_figure(monkeypatch):
    """The report draws each resample's weights once for all positions and counts each position's sums once:
    the figures are those of resampled_metrics at every position."""
    rng = np.random.default_rng(2)
    groups = rng.integers(0, 50, 4000)
    monkeypatch.setattr(resampling, "_CELLS_PER_CHUNK", 64 * 9)  # 9 resamples per block of 64 levels
    weights = resampling.ResampleWeights(50, 40, 6)
    drawn = []
    monkeypatch.setattr(resampling, "group_weights", lambda *a, **k: drawn.append(a) or group_weights(*a, **k))
    for k in range(3):   # positions: scores with more distinct values than the AUROC levels
        p = np.round(rng.random(4000), 5)
        y = (rng.random(4000) < p).astype(float)
        want = resampling.resampled_metrics(y, p, groups, n_groups=50, n_resamples=40, seed=6, auroc_levels=64)
        sums = resampling.RequestSums(y, p, groups, n_groups=50).with_auroc_levels(64)
        got = resampling.resampled_sums(sums, weights)
        for metric in resampling.METRICS:
            np.testing.assert_array_equal(got[metric], want[metric], err_msg=f"{metric} at position {k}")
        assert len(drawn) == 5 * (k + 2)   # resampled_metrics draws its own; the kept weights are drawn once
