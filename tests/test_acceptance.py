"""E[full-block acceptance | what the window showed], by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_obs.acceptance import expected_given_window


def test_a_censored_step_adds_the_chain_beyond_its_window():
    # w = 2 accepted; a_3 = 0.5, a_4 = 0.4: 2 + 0.5 + 0.5 * 0.4 = 2.7 (window factors do not enter)
    a = np.array([[0.1, 0.2, 0.5, 0.4]])
    assert expected_given_window(a, np.array([2]), np.array([2])).tolist() == [pytest.approx(2.7)]


def test_it_is_larger_than_the_unconditional_expectation_when_a_window_draft_was_doubtful():
    a = np.array([[0.5, 1.0, 1.0]])
    unconditional = np.cumprod(a, axis=1).sum()          # 0.5 + 0.5 + 0.5 = 1.5
    assert expected_given_window(a, np.array([1]), np.array([1]))[0] == 3.0 > unconditional


def test_a_step_rejected_inside_its_window_has_shown_its_acceptance():
    a = np.full((2, 3), 0.9)
    assert expected_given_window(a, np.array([3, 2]), np.array([1, 0])).tolist() == [1.0, 0.0]


def test_a_full_window_and_an_empty_one():
    a = np.array([[0.5, 0.5], [0.5, 0.5]])
    assert expected_given_window(a, np.array([2, 0]), np.array([2, 0])).tolist() == [2.0, 0.75]


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="accept_prob must be"):
        expected_given_window(np.ones(3), np.array([1]), np.array([1]))
