"""The ceiling fit as sums over parts (estimators.ceiling.fit_parts): any cut of the sample fits the same
models, and a run's parts do not depend on its chunks."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_obs.estimators.ceiling import estimate_run
from dspark_obs.estimators.ceiling.drafter import fit_drafter_parts
from dspark_obs.estimators.ceiling.estimate import drafter_explains_better_parts
from dspark_obs.estimators.ceiling.fit_parts import FitPart, LocalParts, summed
from dspark_obs.estimators.ceiling.prior import fit_acceptance_parts, fit_binned_parts
from dspark_obs.estimators.chunks import ALL, sample_parts, sample_requests
from dspark_obs.store import Store

GAMMA = 4


def _sample(n: int, seed: int = 0) -> FitPart:
    """Steps whose drafts are accepted with probability min(1, p / q), a head that reports q."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.05, 0.95, (n, GAMMA))
    p = np.clip(q * rng.lognormal(0.0, 0.7, (n, GAMMA)), 0.0, 1.0)
    accept = rng.random((n, GAMMA)) < np.minimum(1.0, p / q)
    window = rng.integers(1, GAMMA + 1, n)
    correct = np.minimum(np.cumprod(accept, axis=1).sum(axis=1), window)
    state = np.where(rng.random((n, GAMMA)) < 0.8, 1, 2).astype(np.int8)
    return FitPart(q, window, correct, rng.random(n) < 0.3, np.where(state == 1, p, np.nan), state, p)


def _fit(parts):
    model = fit_acceptance_parts(parts, GAMMA)
    drafter = fit_drafter_parts(parts, GAMMA)
    return model, drafter, drafter_explains_better_parts(parts, drafter, model), fit_binned_parts(parts, GAMMA)


def test_any_cut_of_the_sample_fits_the_same_models():
    whole = _sample(6000)
    one = _fit(LocalParts([whole]))
    cut = _fit(LocalParts([whole.rows(0, 1000), whole.rows(1000, 1001), whole.rows(1001, 4500),
                           whole.rows(4500, 6000)]))
    (m1, d1, use1, b1), (m2, d2, use2, b2) = one, cut
    assert m1.n_train == m2.n_train and m1.base_rate == m2.base_rate
    assert m1.draft_coef is not None and m1.prior_coef[True] is not None
    np.testing.assert_allclose(m2.draft_coef, m1.draft_coef, rtol=1e-9, atol=1e-9)
    for kind in (True, False):
        np.testing.assert_allclose(m2.prior_coef[kind], m1.prior_coef[kind], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(d2.coef, d1.coef, rtol=1e-6, atol=1e-6)   # L-BFGS stops on a tolerance
    np.testing.assert_allclose(d2.cov, d1.cov, rtol=1e-4)
    assert use1 == use2
    np.testing.assert_array_equal(b2.edges, b1.edges)               # quantiles and counts: exact
    np.testing.assert_array_equal(b2.rate, b1.rate)


def test_empty_parts_add_nothing():
    whole = _sample(3000, seed=1)
    empty = whole.rows(0, 0)
    m1, d1, _, b1 = _fit(LocalParts([whole]))
    m2, d2, _, b2 = _fit(LocalParts([empty, whole, empty]))
    np.testing.assert_array_equal(m2.draft_coef, m1.draft_coef)
    np.testing.assert_array_equal(d2.coef, d1.coef)
    np.testing.assert_array_equal(b2.rate, b1.rate)


def test_summed_adds_in_part_order_and_needs_parts():
    assert summed([(1, 2.0), (3, 4.0)]) == (4, 6.0)
    with pytest.raises(ValueError, match="no parts"):
        summed([])


def test_sample_parts_are_fixed_by_the_sample():
    rids = [f"r{i:03d}" for i in range(40)] + [None]
    counts = np.full(41, 10)
    parts = sample_parts(rids, counts, ALL, part_rows=100)
    assert [p.rows for p in parts] == [100, 100, 100, 100, 10] and parts[-1].on("rid") == "rid IS NULL"
    sample = sample_requests(rids, counts, max_rows=200)
    cut = sample_parts(rids, counts, sample, part_rows=50)
    assert sum(p.rows for p in cut) == sample.rows and all(p.rows <= 50 for p in cut)
    assert all(p.where.count("BETWEEN") == len(p.params) // 2 for p in cut)   # each part its blocks' rid ranges


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> Store:
    """More steps than one fitting part (25k), fewer than the sample's limit: every request is sampled."""
    from bench.gen_store import generate

    root = tmp_path_factory.mktemp("fit-parts")
    generate(root, rows=60_000, seed=4)
    return Store(root)


def test_the_fit_of_a_run_does_not_depend_on_its_chunks(large):
    """One pass (the parts cut from the one chunk) and 20k-step chunks (the parts read on their own):
    the same per-step values, bit for bit."""
    one = estimate_run(large, "bench", n_bootstrap=0, write=False)
    many = estimate_run(large, "bench", n_bootstrap=0, write=False, chunk_rows=20_000)
    assert one.num_rows >= 60_000
    for name in ("lo", "mid", "hi", "category", "survival_mid"):
        assert one.ceiling.column(name).to_pylist() == many.ceiling.column(name).to_pylist(), name
    np.testing.assert_array_equal(one.fit.drafter.coef, many.fit.drafter.coef)
