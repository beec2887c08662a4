"""Tests for dspark_obs.estimators.calibration.resampling: the request bootstrap of every metric equals the
metrics' own formulas with unit weights, and calibrate's bootstrap with the same weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from dspark_obs.estimators import calibration as cal
from dspark_obs.estimators.calibration import metrics, resampling
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


def _clustered_run(rng, requests: int = 200):
    """Steps of ``requests`` requests whose scores and labels share a per-request effect (so steps of one
    request are correlated, as a request's positions and steps are)."""
    g = np.repeat(np.arange(requests), rng.integers(3, 40, requests))
    u = rng.normal(0.0, 1.0, requests)[g]
    score = np.round(1.0 / (1.0 + np.exp(-(0.8 * u + rng.normal(0.0, 1.0, g.size)))), 4)  # ties, as the head's
    y = (rng.random(g.size) < 1.0 / (1.0 + np.exp(-(1.2 * u + 0.5 * rng.normal(0.0, 1.0, g.size))))).astype(float)
    return y, score, g


def test_clustered_auroc_se_is_the_spread_of_auroc_over_runs():
    """The SE the report puts on AUROC estimates what it claims: the standard deviation of AUROC over
    independent runs of the same requests' process (300 simulated runs), where the steps-as-independent
    SE is far too small."""
    rng = np.random.default_rng(7)
    aucs, ses = [], []
    for _ in range(300):
        y, p, g = _clustered_run(rng)
        auc, se = metrics.clustered_auroc(y, p, g)
        assert auc == pytest.approx(metrics.auroc_score(y, p), abs=1e-12)
        aucs.append(auc)
        ses.append(se)
    spread = float(np.std(aucs, ddof=1))   # its own Monte Carlo error is about 4%
    assert 0.9 < np.mean(ses) / spread < 1.15
    y, p, g = _clustered_run(rng)
    assert metrics.clustered_auroc(y, p, np.arange(y.size))[1] < 0.75 * spread   # ignoring the requests understates it


def test_clustered_auroc_se_agrees_with_the_request_bootstrap_and_delong():
    """The same variance the other figures' request bootstrap estimates (2,000 resamples); one step per
    request gives DeLong's unclustered variance, computed here pair by pair."""
    y, p, g = _clustered_run(np.random.default_rng(1))
    _, se = metrics.clustered_auroc(y, p, g)
    sparse_codes = np.where(g % 2 == 0, g, g + 1000)   # cluster numbers given as they are, gaps and all
    assert metrics.clustered_auroc(y, p, sparse_codes, n_groups=int(sparse_codes.max()) + 1) == \
        pytest.approx(metrics.clustered_auroc(y, p, g), rel=1e-12)
    every = np.concatenate([p, [0.0, 0.55555, 1.0]])   # the ranks among a larger set's scores, gaps and all
    ranks = np.unique(every, return_inverse=True)[1][:p.size]
    assert metrics.clustered_auroc(y, p, g, levels=ranks) == pytest.approx(metrics.clustered_auroc(y, p, g), rel=1e-12)
    reps = resampling.resampled_metrics(y, p, g, n_groups=int(g.max()) + 1, n_resamples=2000, seed=0, auroc_levels=None)
    assert se == pytest.approx(float(np.nanstd(reps["auroc"], ddof=1)), rel=0.08)
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 300).astype(float)
    p = np.round(np.clip(rng.normal(0.5 + 0.2 * y, 0.2), 0, 1), 2)
    pos, neg = p[y == 1], p[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    delong = math.sqrt(psi.mean(1).var(ddof=1) / pos.size + psi.mean(0).var(ddof=1) / neg.size)
    auc, se = metrics.clustered_auroc(y, p, np.arange(y.size))
    assert auc == pytest.approx(psi.mean(), abs=1e-12) and se == pytest.approx(delong, rel=1e-9)
    assert all(math.isnan(v) for v in metrics.clustered_auroc([1.0, 1.0], [0.2, 0.3], [0, 1]))   # one class
    assert math.isnan(metrics.clustered_auroc([1.0, 0.0, 1.0], [0.9, 0.2, 0.8], [0, 0, 0])[1])   # one request


def test_resamples_without_auroc_are_the_same_resamples():
    rng = np.random.default_rng(5)
    groups = rng.integers(0, 30, 2000)
    p = np.round(rng.random(2000), 3)
    y = (rng.random(2000) < p).astype(float)
    sums = resampling.RequestSums(y, p, groups, n_groups=30)
    weights = resampling.ResampleWeights(30, 50, 2)
    full, lean = resampling.resampled_sums(sums, weights), resampling.resampled_sums(sums, weights, auroc=False)
    assert "auroc" not in lean and set(lean) == set(resampling.METRICS) - {"auroc"}
    for metric, values in lean.items():
        np.testing.assert_array_equal(values, full[metric])


def test_positions_resampled_together_equal_each_resampled_alone():
    rng = np.random.default_rng(8)
    groups = rng.integers(0, 40, 3000)
    weights = resampling.ResampleWeights(40, 70, 4)
    many = []
    for k, binning in enumerate(["width15", "mass10", "width20"]):   # different bin counts, side by side
        p = rng.random(3000) ** (k + 1)
        y = (rng.random(3000) < p).astype(float)
        many.append(resampling.RequestSums(y, p, groups, n_groups=40, binning=binning))
    together = resampling.resampled_together(many, weights)
    assert len(together) == 3
    for sums, got in zip(many, together):
        alone = resampling.resampled_sums(sums, weights, auroc=False)
        assert set(got) == set(alone)
        for metric in alone:
            assert got[metric].shape == (70,)
            np.testing.assert_allclose(got[metric], alone[metric], rtol=1e-12, atol=1e-15)
    assert not np.allclose(together[0]["ece"], together[1]["ece"])   # each its own sums
