"""The block-accept walk: align trimmed drafts with the committed output and bound the ceiling.

A request-step drafted ``gamma`` tokens ``d_1..d_gamma`` after its anchor; the
target checked the first ``w = verify_len - 1`` and accepted ``correct_drafts``.
The step is **censored** when ``correct_drafts == w < gamma``: what a full-block
verify would have accepted (the *ceiling*, 0..gamma drafts) is unknown.  The
committed output tells part of it: draft ``d_k`` sits at output position
``first_pos + k - 1`` (``first_pos = prefix_len - prompt_tokens + 1``; output
position 0 comes from prefill), and later steps committed a token there.

The walk (SGLang's ``dspark_block_accept_estimator``, offsets ``k = w+1..gamma``)
compares each trimmed draft with the realised token while the two agree.  It
ends in one of SGLang's analyzer categories:

``exact_in_window``          not censored: the ceiling is ``correct_drafts``.
``censored_resolved_exact``  the walk reached ``gamma`` (or diverged exactly at
                             ``gamma``): nothing is left unverifiable.
``censored_diverged``        the realised token differs from ``d_m`` at ``m < gamma``;
                             drafts after ``m`` were drafted on a prefix the
                             output never took, so their acceptance is unknown.
``censored_eos``             the output ended naturally (finish reason ``stop``)
                             before the walk did: drafts past the end are rejected.
``censored_at_end``          the output ended otherwise (length cut, abort, or the
                             tokens are missing): the rest is unknown.

Per walked draft an acceptance factor ``a_k`` (probability that a full verify
accepts ``d_k`` given ``d_1..d_{k-1}`` were accepted) gives
``extra = sum_k prod_{i<=k} a_i`` and the ceiling ``w + extra`` plus, for the
unverifiable rest, at most ``prod * (#unverifiable offsets)``.  How ``a_k`` is
known — exactly, bounded, or estimated — is the caller's choice
(:func:`ceiling_from_factors`); :func:`walk_blocks` only finds where the walk goes.

Assumption (SGLang's): the realised tokens up to the walk's position are what
the untrimmed trajectory would have seen, so the target's distribution at a
walked position is the one a full verify would have used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dspark_obs import acceptance
from dspark_obs.estimators.compiled import jit

__all__ = [
    "CATEGORIES", "EXACT_IN_WINDOW", "RESOLVED_EXACT", "DIVERGED", "EOS", "AT_END",
    "Walk", "walk_blocks", "ceiling_from_factors", "position_survival", "sglang_interval",
]

CATEGORIES = ("exact_in_window", "censored_resolved_exact", "censored_diverged",
              "censored_eos", "censored_at_end")
"""Category names by code (SGLang's block-accept analyzer vocabulary)."""
EXACT_IN_WINDOW, RESOLVED_EXACT, DIVERGED, EOS, AT_END = range(5)
NO_TOKEN = -1
"""``realised`` value for a position the output does not hold."""


@dataclass(frozen=True)
class Walk:
    """Where the walk of each request-step went; arrays of ``n`` rows, ``[n, gamma]`` masks.

    Column ``j`` of a mask is draft offset ``k = j + 1``.
    """

    gamma: int
    window: np.ndarray          # [n] int, drafts verified (verify_len - 1)
    correct: np.ndarray         # [n] int, accepted within the window
    censored: np.ndarray        # [n] bool
    category: np.ndarray        # [n] int8, index into CATEGORIES
    walked: np.ndarray          # [n, gamma] bool: trimmed draft compared with a realised token
    matched: np.ndarray         # [n, gamma] bool: walked and equal to the realised token
    unverifiable: np.ndarray    # [n, gamma] bool: trimmed drafts the output cannot speak for
    stop_offset: np.ndarray     # [n] int: offset where the walk stopped (diverged / ran out), 0 if none

    def take(self, rows: np.ndarray) -> "Walk":
        """The walk of the steps ``rows`` only."""
        return Walk(self.gamma, *(getattr(self, name)[rows] for name in (
            "window", "correct", "censored", "category", "walked", "matched", "unverifiable", "stop_offset")))

    @property
    def n_walked(self) -> np.ndarray:
        """Trimmed drafts compared with the output, per step."""
        return self.walked.sum(axis=1)

    @property
    def tail_count(self) -> np.ndarray:
        """Unverifiable offsets per step: ``gamma - m`` after a divergence at ``m``,
        ``gamma - o + 1`` when the output ran out at ``o`` (0 at EOS)."""
        return self.unverifiable.sum(axis=1)


def walk_blocks(drafts: np.ndarray, window: np.ndarray, correct: np.ndarray, realised: np.ndarray,
                natural_end: np.ndarray) -> Walk:
    """Walk every censored step's trimmed drafts along the committed output.

    Parameters
    ----------
    drafts : int array [n, gamma]
        The drafted tokens ``d_1..d_gamma`` of each request-step.
    window, correct : int arrays [n]
        ``verify_len - 1`` and ``correct_drafts``; ``0 <= correct <= window <= gamma``.
    realised : int array [n, gamma]
        The committed token at each draft's output position, ``-1`` where the
        output holds none (past its end, or tokens not collected).
    natural_end : bool array [n]
        The request's output ended naturally (EOS / stop), so positions past its
        end can accept nothing.

    >>> w = walk_blocks(np.array([[5, 6, 7, 8]]), np.array([1]), np.array([1]),
    ...                 np.array([[5, 6, 9, 8]]), np.array([False]))
    >>> CATEGORIES[w.category[0]], w.walked[0].tolist(), w.unverifiable[0].tolist()
    ('censored_diverged', [False, True, True, False], [False, False, False, True])
    """
    drafts = np.ascontiguousarray(drafts, dtype=np.int64)
    n, gamma = drafts.shape
    window = np.ascontiguousarray(np.broadcast_to(np.asarray(window, dtype=np.int64), (n,)))
    correct = np.ascontiguousarray(np.broadcast_to(np.asarray(correct, dtype=np.int64), (n,)))
    natural_end = np.ascontiguousarray(np.broadcast_to(np.asarray(natural_end, dtype=bool), (n,)))
    censored = acceptance.censored(window, correct, gamma)
    category, walked, matched, unverifiable, stop = jit(_walk)(
        drafts, window, censored, np.ascontiguousarray(realised, dtype=np.int64), natural_end)
    return Walk(gamma=gamma, window=window, correct=correct, censored=censored, category=category,
                walked=walked, matched=matched, unverifiable=unverifiable, stop_offset=stop)


def _walk(drafts, window, censored, realised, natural_end):
    """:func:`walk_blocks` per step, compiled (:mod:`~dspark_obs.estimators.compiled`): the walk is a loop
    that stops where the draft and the output part, which numpy wrote as some thirty whole-array passes."""
    n, gamma = drafts.shape
    category = np.full(n, EXACT_IN_WINDOW, np.int8)
    walked = np.zeros((n, gamma), np.bool_)
    matched = np.zeros((n, gamma), np.bool_)
    unverifiable = np.zeros((n, gamma), np.bool_)
    stop = np.zeros(n, np.int64)
    for i in range(n):
        if not censored[i]:
            continue
        category[i] = RESOLVED_EXACT
        for j in range(max(window[i], 0), gamma):   # offsets k = j + 1 past the window
            if realised[i, j] == NO_TOKEN:          # the output ran out at k
                stop[i] = j + 1
                category[i] = EOS if natural_end[i] else AT_END
                if not natural_end[i]:
                    unverifiable[i, j:] = True
                break
            walked[i, j] = True
            if drafts[i, j] != realised[i, j]:       # diverged at k: drafts after it were never on the output
                stop[i] = j + 1
                if j + 1 < gamma:
                    category[i] = DIVERGED
                    unverifiable[i, j + 1:] = True
                break
            matched[i, j] = True
    return category, walked, matched, unverifiable, stop


def _chain(walk: Walk, factors: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``sum_k prod_{i<=k} f_i`` and ``prod f_i`` over the (contiguous) offsets in ``mask``."""
    return jit(_chained)(np.ascontiguousarray(factors, dtype=np.float64), np.ascontiguousarray(mask, dtype=bool))


def _chained(factors, mask):
    """:func:`_chain`, compiled: products and sums in offset order (numpy's cumulative product, and its
    row sums of fewer than eight terms, add in that order too)."""
    n, gamma = factors.shape
    total, prod = np.zeros(n), np.ones(n)
    for i in range(n):
        cum, acc = 1.0, 0.0
        for j in range(gamma):
            if mask[i, j]:
                cum *= factors[i, j]
                acc += cum
        total[i], prod[i] = acc, cum
    return total, prod


def ceiling_from_factors(
    walk: Walk,
    a: np.ndarray,
    *,
    tail: np.ndarray | float = 1.0,
) -> np.ndarray:
    """Full-block accepted drafts implied by per-offset acceptance factors.

    ``a`` [n, gamma] is used on walked offsets; ``tail`` ([n, gamma] or a
    scalar) on unverifiable offsets, chained after the walk:
    ``w + sum_walked prod a + prod_walked a * sum_unverifiable prod tail``.
    ``tail=1`` gives the largest value the walk allows (every unverifiable draft
    accepted); ``tail=0`` the smallest.  Steps that are not censored give
    ``correct_drafts``.

    >>> w = walk_blocks(np.array([[5, 6, 7]]), np.array([1]), np.array([1]),
    ...                 np.array([[5, 8, -1]]), np.array([False]))
    >>> float(ceiling_from_factors(w, np.full((1, 3), 0.5))[0])  # 1 + 0.5 + 0.5 * 1
    2.0
    """
    extra, prod = _chain(walk, np.asarray(a, dtype=np.float64), walk.walked)
    tail = np.broadcast_to(np.asarray(tail, dtype=np.float64), walk.walked.shape)
    rest, _ = _chain(walk, tail, walk.unverifiable)
    value = walk.window + extra + prod * rest
    return np.where(walk.censored, value, walk.correct).astype(np.float64)


def position_survival(walk: Walk, a: np.ndarray, *, tail: np.ndarray | float = 1.0) -> np.ndarray:
    """``[n, gamma]`` probability that a full verify accepts the first ``k`` drafts, per offset ``k``.

    The terms :func:`ceiling_from_factors` sums: 1 inside an accepted window,
    then the chained factors (``a`` on walked offsets, ``tail`` on unverifiable
    ones, 0 where nothing more can be accepted); ``1[k <= correct_drafts]``
    for a step rejected inside its window.  Row sums equal
    ``ceiling_from_factors(walk, a, tail=tail)``; these are the per-position
    labels a calibration of the survival needs (a sum alone does not say how
    the acceptance spreads over positions).

    >>> w = walk_blocks(np.array([[5, 6, 7]]), np.array([1]), np.array([1]),
    ...                 np.array([[5, 8, -1]]), np.array([False]))
    >>> position_survival(w, np.full((1, 3), 0.5)).tolist()
    [[1.0, 0.5, 0.5]]
    """
    n, gamma = walk.walked.shape
    offset = np.arange(1, gamma + 1)[None, :]
    tail = np.broadcast_to(np.asarray(tail, dtype=np.float64), walk.walked.shape)
    in_tail = walk.censored[:, None] & (offset > walk.window[:, None])
    f = np.where(walk.walked, np.asarray(a, dtype=np.float64), np.where(walk.unverifiable, tail, 0.0))
    chain = np.cumprod(np.where(in_tail, f, 1.0), axis=1)
    censored = np.where(offset <= walk.window[:, None], 1.0, np.where(in_tail, chain, 0.0))
    return np.where(walk.censored[:, None], censored, (offset <= walk.correct[:, None]).astype(np.float64))


def sglang_interval(walk: Walk, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SGLang's interval rule, in drafts: ``(lo, mid, hi)`` with ``mid = (lo + hi) / 2``.

    ``lo = w + sum_k prod_{i<=k} a_i`` over the walked offsets;
    ``hi = lo + prod * (gamma - m)`` after a divergence at ``m < gamma``,
    ``lo + prod * (gamma - o + 1)`` when the output ran out at ``o`` without
    EOS, ``lo`` otherwise — as ``_finalize_walk_online`` / ``_finalize_at_end_online``
    and the analyzer's ``evaluate_block`` (which add 1 for the bonus token).
    """
    lo, hi = jit(_interval)(np.ascontiguousarray(a, dtype=np.float64), walk.walked, walk.unverifiable,
                            walk.censored, walk.window, walk.correct)
    return lo, 0.5 * (lo + hi), hi


def _interval(factors, walked, unverifiable, censored, window, correct):
    """:func:`sglang_interval`'s ``lo`` and ``hi`` in one compiled pass: the same sums, in the same order, as
    ``ceiling_from_factors(walk, a, tail=0)`` and its chained product, which took three passes over the cells."""
    n, gamma = factors.shape
    lo, hi = np.empty(n), np.empty(n)
    for i in range(n):
        if not censored[i]:
            lo[i] = hi[i] = correct[i]
            continue
        cum, acc, rest = 1.0, 0.0, 0
        for j in range(gamma):
            if walked[i, j]:
                cum *= factors[i, j]
                acc += cum
            elif unverifiable[i, j]:
                rest += 1
        lo[i] = window[i] + acc + cum * 0.0   # the zero tail of ceiling_from_factors, added as it adds it
        hi[i] = lo[i] + cum * rest
    return lo, hi
