"""The docstring examples of the estimator modules run (doctests): they are part of the API's documentation."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["dspark_obs.acceptance", "dspark_obs.estimators.sampling", "dspark_obs.estimators.ceiling_drafter",
           "dspark_obs.estimators.ceiling_walk", "dspark_obs.estimators.recalibration",
           "dspark_obs.estimators.replay", "dspark_obs.estimators.ceiling"]


@pytest.mark.parametrize("name", MODULES)
def test_doctests_pass(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, name
