"""The drafter map q̂ = g(c): fitted on verified drafts, it recovers the head's transform of q."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_obs.estimators.ceiling.drafter import fit_drafter_map

GAMMA = 3


def _verified(q, p, rng, window):
    """Outcomes of drafts verified in order, accepted with probability min(1, p/q)."""
    acc = rng.random(q.shape) < np.minimum(1.0, p / q)
    correct = np.minimum(np.cumprod(acc, axis=1).sum(axis=1), window)
    return correct


@pytest.mark.parametrize("scale, shift", [(1.0, 0.0), (0.5, 1.0), (2.0, -0.5)])
def test_recovers_the_inverse_of_a_logit_affine_head(scale, shift):
    rng = np.random.default_rng(1)
    n = 20_000
    q = rng.uniform(0.05, 0.95, (n, GAMMA))
    p = np.clip(q * rng.lognormal(0.0, 0.8, (n, GAMMA)), 0.0, 1.0)
    head = 1.0 / (1.0 + np.exp(-(scale * np.log(q / (1 - q)) + shift)))   # a separate head: c = h(q)
    window = np.full(n, GAMMA)
    correct = _verified(q, p, rng, window)
    m = fit_drafter_map(head, p, np.ones((n, GAMMA), np.int8), window, correct, np.ones(n, bool))
    grid_q = np.array([[0.1, 0.3, 0.6], [0.8, 0.5, 0.2]])
    grid_c = 1.0 / (1.0 + np.exp(-(scale * np.log(grid_q / (1 - grid_q)) + shift)))
    np.testing.assert_allclose(m.q(grid_c), grid_q, atol=0.04)
    # The band widens around the estimate, and never crosses it.
    assert np.all(m.q(grid_c, z=2.0) >= m.q(grid_c)) and np.all(m.q(grid_c, z=-2.0) <= m.q(grid_c))


def test_only_verified_drafts_of_sampled_steps_are_used():
    rng = np.random.default_rng(2)
    n = 4_000
    q = rng.uniform(0.1, 0.9, (n, GAMMA))
    p = rng.uniform(0.0, 1.0, (n, GAMMA))
    window = rng.integers(1, GAMMA + 1, n)
    correct = _verified(q, p, rng, window)
    sampled = rng.random(n) < 0.5
    m = fit_drafter_map(q, p, np.ones((n, GAMMA), np.int8), window, correct, sampled)
    offset = np.arange(1, GAMMA + 1)[None, :]
    expected = ((offset <= np.minimum(correct + 1, window)[:, None]) & sampled[:, None]).sum()
    assert m.n_train == expected


def test_too_few_drafts_keep_the_raw_head():
    q = np.full((5, GAMMA), 0.4)
    m = fit_drafter_map(q, q, np.ones((5, GAMMA), np.int8), np.full(5, GAMMA), np.full(5, GAMMA), np.ones(5, bool))
    assert not m.fitted
    np.testing.assert_allclose(m.q(q), q)


def test_the_binned_prior_is_each_bins_verified_rate_shrunk_to_the_pooled_one():
    from dspark_obs.estimators.ceiling.prior import fit_binned_prior

    # 2 positions, all windows full: position 1 accepts every low-confidence draft, position 2 none
    n = 200
    conf = np.column_stack([np.r_[np.full(n // 2, 0.1), np.full(n // 2, 0.9)]] * 2)
    correct = np.r_[np.full(n // 2, 1), np.full(n // 2, 2)]        # low: d_1 accepted, d_2 rejected; high: both
    prior = fit_binned_prior(conf, np.full(n, 2), correct, np.ones(n, bool), n_bins=2)
    # low bin: position 1 saw 100 of 100, position 2 saw 0 of 100; pooled 0.5, overall 0.75
    pooled = (100 + 20 * 0.75) / (200 + 20)
    np.testing.assert_allclose(prior.prior(np.array([[0.1, 0.1]]))[0],
                               [(100 + 20 * pooled) / 120, (0 + 20 * pooled) / 120])
    assert fit_binned_prior(conf[:10], np.full(10, 2), correct[:10], np.ones(10, bool)) is None
