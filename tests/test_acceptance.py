"""E[full-block acceptance | what the window showed], by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_obs.acceptance import expected_given_window, known_block_accept, mode_block_accept


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


# (mode, truth, correct_drafts, cap_trim, window) -> full-block accepted drafts where known, gamma = 4.
# Python (known_block_accept) and SQL (the known_block_accept macro) are held to this one table.
KNOWN_CASES = [
    ("static", None, 2, 0, 4, 2.0),          # a static step verified the whole block
    ("cap-accept", None, 1, 2, 1, 3.0),      # cap-accept: what it accepted plus what the cap trimmed
    ("cap-accept", 0, 1, 2, 1, 3.0),         # the mode comes before a truth column
    ("compact", 3, 2, 0, 2, 3.0),            # the emulator's (or a companion's) truth
    ("compact", None, 1, 0, 3, 1.0),         # a draft rejected inside the window shows it
    ("compact", 3, 1, 0, 3, 3.0),            # truth comes before the window
    ("compact", None, 4, 0, 4, 4.0),         # a window of the whole block shows it
    ("compact", None, 3, 0, 4, 3.0),         # ... also when it rejected a draft
    ("compact", None, 2, 0, 2, None),        # the window accepted whole, short of the block: hidden
    ("compact", None, 0, 0, 0, None),        # an empty window shows nothing
]


@pytest.mark.parametrize("mode, truth, correct, cap, window, expected", KNOWN_CASES)
def test_known_block_accept_in_python(mode, truth, correct, cap, window, expected):
    got = known_block_accept(mode, np.array([window]), np.array([correct]), np.array([cap]), gamma=4,
                             truth=np.array([np.nan if truth is None else truth], dtype=float))[0]
    assert (np.isnan(got) if expected is None else got == expected)


@pytest.mark.parametrize("mode, truth, correct, cap, window, expected", KNOWN_CASES)
def test_the_sql_macro_says_what_the_python_rule_says(tmp_path, mode, truth, correct, cap, window, expected):
    from dspark_obs import sql

    con = sql.connect(tmp_path)  # an empty store: the macros exist all the same
    got = con.execute("SELECT known_block_accept($mode, $truth::SMALLINT, $c::SMALLINT, $cap::SMALLINT, "
                      "$w::SMALLINT, 4)",
                      {"mode": mode, "truth": truth, "c": correct, "cap": cap, "w": window}).fetchone()[0]
    assert got == expected


@pytest.mark.parametrize("mode, correct, cap, expected", [
    ("static", 2, 0, 2.0), ("cap-accept", 1, 2, 3.0), ("compact", 1, 2, None), (None, 1, 2, None)])
def test_what_the_mode_alone_shows_in_python_and_sql(tmp_path, mode, correct, cap, expected):
    from dspark_obs import sql

    py = mode_block_accept(mode, np.array([correct]), np.array([cap]))
    assert (py is None if expected is None else py.tolist() == [expected])
    con = sql.connect(tmp_path)
    got = con.execute("SELECT mode_block_accept($mode, $c::SMALLINT, $cap::SMALLINT)",
                      {"mode": mode, "c": correct, "cap": cap}).fetchone()[0]
    assert got == expected
