"""What a full-block verify is expected to accept, given what the step showed.

One home for the rule every judge of a sampled ceiling uses (the emulators'
truth columns, the estimators' validation).  A compact step that accepted its
whole window of ``w`` drafts has *shown* that ``d_1..d_w`` were accepted, so the
question it can be asked is the full-block acceptance expected **given that**::

    E[full | window accepted] = w + sum_{k>w} prod_{w<i<=k} a_i

with ``a_i`` the probability that a full verify accepts ``d_i`` given
``d_1..d_{i-1}`` were accepted (``min(1, p_i(d_i) / q_i(d_i))`` under
speculative sampling; ``1[d_i == argmax p_i]`` under greedy decoding).  It is
larger than the unconditional ``sum_k prod_{i<=k} a_i`` whenever a window draft
had ``a_i < 1``.  A step rejected inside its window has shown its full-block
acceptance: ``correct_drafts``.

Where the full-block acceptance is *known* (:func:`known_block_accept`; in SQL
the ``known_block_accept`` macro of ``sql/macros/acceptance.sql``): a static
step verified the whole block (``correct_drafts``), a cap-accept step too
(``correct_drafts + cap_trim``) — the part the run's mode decides,
:func:`mode_block_accept` (the ``mode_block_accept`` macro) — then a truth
column says it (the emulator's ``emu_block_accept``, a paired cap-accept
companion), and last a step rejected inside its window (``correct_drafts <
window``) or whose window was the whole block (``window >= gamma``) showed it
(``correct_drafts``).  ``tests/test_acceptance.py`` holds both languages to
one table of cases.
"""

from __future__ import annotations

import numpy as np

__all__ = ["censored", "expected_given_window", "known_block_accept", "mode_block_accept"]


def expected_given_window(accept_prob: np.ndarray, window: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """``E[full-block accepted drafts | what the window showed]`` per request-step.

    Parameters
    ----------
    accept_prob : float [n, gamma]
        ``a_k`` of each drafted position (conditional on the earlier drafts).
    window, correct : int [n]
        Drafts verified (``verify_len - 1``) and accepted (``correct_drafts``).

    Returns float [n]: ``correct`` where a window draft was rejected
    (``correct < window``), else ``w + sum_{k>w} prod_{w<i<=k} a_i``.

    >>> a = np.array([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])
    >>> expected_given_window(a, np.array([1, 2]), np.array([1, 0])).tolist()
    [1.75, 0.0]
    """
    a = np.asarray(accept_prob, dtype=np.float64)
    window = np.asarray(window, dtype=np.int64)
    correct = np.asarray(correct, dtype=np.int64)
    if a.ndim != 2 or a.shape[0] != window.shape[0] or window.shape != correct.shape:
        raise ValueError(f"accept_prob must be [n, gamma] with window and correct [n]; got {a.shape}, "
                         f"{window.shape}, {correct.shape}")
    tail = np.arange(1, a.shape[1] + 1)[None, :] > window[:, None]
    chain = np.cumprod(np.where(tail, np.clip(a, 0.0, 1.0), 1.0), axis=1)
    extra = np.where(tail, chain, 0.0).sum(axis=1)
    return np.where(correct < window, correct, window + extra).astype(np.float64)


def censored(window: np.ndarray, correct: np.ndarray, gamma) -> np.ndarray:
    """Steps whose full-block acceptance the window hides: it accepted all of a window short of the
    block (``correct == window < gamma``), so the drafts beyond it were never checked.

    >>> censored(np.array([2, 2, 4]), np.array([2, 1, 4]), 4).tolist()
    [True, False, False]
    """
    window = np.asarray(window)
    return (np.asarray(correct) == window) & (window < gamma)


def mode_block_accept(mode: str, correct: np.ndarray, cap_trim: np.ndarray) -> np.ndarray | None:
    """Full-block accepted drafts per request-step that the run's mode alone shows, or None (compact).

    A static step verified the whole block (``correct``); a cap-accept step
    verified it and trimmed the commit (``correct + cap_trim``).

    >>> mode_block_accept("cap-accept", np.array([1, 2]), np.array([2, 0])).tolist()
    [3.0, 2.0]
    >>> mode_block_accept("compact", np.array([1]), np.array([0])) is None
    True
    """
    if mode == "static":
        return np.asarray(correct, dtype=np.float64).copy()
    if mode == "cap-accept":
        return np.asarray(correct, dtype=np.float64) + np.asarray(cap_trim, dtype=np.float64)
    return None


def known_block_accept(mode: str, window: np.ndarray, correct: np.ndarray, cap_trim: np.ndarray, *, gamma: int,
                       truth: np.ndarray | None = None) -> np.ndarray:
    """Full-block accepted drafts per request-step where the step shows them, NaN elsewhere.

    The run's mode first (static: ``correct``; cap-accept: ``correct + cap_trim``),
    then ``truth`` (NaN where unknown), then the window unless :func:`censored`: a
    draft rejected inside it (``correct < window``) or a window of the whole block.

    >>> known_block_accept("compact", np.array([1, 1, 3]), np.array([0, 1, 3]), np.zeros(3), gamma=3).tolist()
    [0.0, nan, 3.0]
    """
    window = np.asarray(window, dtype=np.int64)
    correct = np.asarray(correct, dtype=np.float64)
    shown_by_mode = mode_block_accept(mode, correct, cap_trim)
    known = np.full(window.size, np.nan) if shown_by_mode is None else shown_by_mode
    if truth is not None:
        known = np.where(np.isnan(known), np.asarray(truth, dtype=np.float64), known)
    return np.where(np.isnan(known) & ~censored(window, correct, gamma), correct, known)
