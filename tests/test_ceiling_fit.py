"""Tests for dspark_obs.estimators.ceiling.fit: a fit survives its file exactly, and a wrong file is refused."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_obs.estimators.ceiling.drafter import DrafterMap
from dspark_obs.estimators.ceiling.fit import CeilingFit
from dspark_obs.estimators.ceiling.prior import AcceptanceModel, BinnedPrior


def _fit() -> CeilingFit:
    rng = np.random.default_rng(0)
    model = AcceptanceModel(gamma=3, draft_coef=rng.normal(size=5), prior_coef={True: None, False: rng.normal(size=4)},
                            base_rate={True: 0.7, False: float(np.float64(1) / 3)}, n_train={True: 0, False: 12})
    drafter = DrafterMap(gamma=3, coef=rng.normal(size=(3, 2)), cov=rng.normal(size=(3, 2, 2)), n_train=9)
    binned = BinnedPrior(edges=np.array([-np.inf, 0.2, 0.5, np.inf]), rate=rng.uniform(size=(3, 3)), fallback=0.61)
    return CeilingFit(model, drafter, True, binned, {"run_id": "r", "gamma": 3})


def test_a_fit_round_trips_exactly(tmp_path):
    fit = _fit()
    fit.save(tmp_path / "fit.json")
    back = CeilingFit.load(tmp_path / "fit.json")
    assert back.gamma == 3 and back.use_drafter is True and back.meta == {"run_id": "r", "gamma": 3}
    assert back.acceptance.prior_coef[True] is None and back.acceptance.base_rate == fit.acceptance.base_rate
    assert np.array_equal(back.acceptance.draft_coef, fit.acceptance.draft_coef)
    assert np.array_equal(back.acceptance.prior_coef[False], fit.acceptance.prior_coef[False])
    assert np.array_equal(back.drafter.cov, fit.drafter.cov) and back.drafter.cov.shape == (3, 2, 2)
    assert np.array_equal(back.binned.edges, fit.binned.edges) and np.array_equal(back.binned.rate, fit.binned.rate)
    conf = np.array([[0.9, 0.4, 0.1]])
    assert np.array_equal(back.binned.prior(conf), fit.binned.prior(conf))


def test_a_file_that_is_not_a_fit_is_refused_with_the_fix(tmp_path):
    (tmp_path / "x.json").write_text('{"coef": 1}')
    with pytest.raises(ValueError, match="estimate --data D --run R --fit-out FILE"):
        CeilingFit.load(tmp_path / "x.json")
    with pytest.raises(ValueError, match="missing.json"):
        CeilingFit.load(tmp_path / "missing.json")
