"""Acceptance probabilities for drafts nobody verified, learnt from drafts that were.

Under speculative sampling a draft ``d ~ q`` is accepted with probability
``a(d) = min(1, p(d) / q(d))``.  For a trimmed draft the target's ``p(d)`` is
often known (the tokens table's logprob or top-k) but the drafter's ``q(d)`` is
not (SGLang logs it only to its block-accept JSONL).  Without ``q``, ``a`` is
only bounded: ``p(d) <= a <= 1`` (``q <= 1``).  For a point estimate we need
``E[a | what we can see]``, and the run itself answers that: every draft inside
a verify window was accepted with probability ``a(d)``, and we saw the outcome.
So a logistic regression of *in-window outcomes* on features visible for
trimmed drafts too — the head's confidence ``c_k`` (SGLang's conditional
acceptance, the prior), its position ``k``, and whether ``d_k`` is in the
target's top-k there and with what probability — estimates ``E[a | features]``
for the trimmed drafts (empirical Bayes; the head's confidence is the prior,
the top-k evidence updates it).

What the model must not see: whether ``d_k`` equals the realised token.  Inside
the window that *is* the outcome; outside it, equality is not acceptance (the
realised token came from another verify).  Only the top-k enters, the same way
on both sides.

Assumptions: given the features, trimmed drafts are accepted like verified ones
(the scheduler trims on survival, which the features carry); one model per run
and per sampling kind (greedy / temperature).  Position-specific slopes on
``logit(c_k)`` recover a per-position miscalibration of the head (STS-like),
shrunk towards the common slope where a position has few verified drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from dspark_obs.estimators.ceiling.fit_parts import FitPart, LocalParts, Parts, summed

__all__ = ["AcceptanceModel", "fit_acceptance_model", "fit_acceptance_parts", "training_mask", "BinnedPrior",
           "fit_binned_prior", "fit_binned_parts"]

_EPS_C = 1e-4
_MIN_ROWS = 50
_RIDGE_POSITION = 10.0
_RIDGE_EVIDENCE = 1.0


def _logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, _EPS_C, 1.0 - _EPS_C)
    return np.log(c) - np.log1p(-c)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _design(c: np.ndarray, offset: np.ndarray, gamma: int, p_topk: np.ndarray | None,
            topk_state: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Features (flat rows) and their ridge penalties."""
    lc = _logit(c)
    cols = [np.ones_like(lc), lc]
    pen = [1e-6, 1e-6]
    for k in range(1, gamma + 1):
        cols.append(lc * (offset == k))
        pen.append(_RIDGE_POSITION)
    if topk_state is not None:
        in_top = (topk_state == 1).astype(np.float64)
        logp = np.log(np.clip(np.nan_to_num(p_topk, nan=1.0), 1e-6, 1.0))
        cols += [in_top, in_top * logp, (topk_state == 2).astype(np.float64)]
        pen += [_RIDGE_EVIDENCE] * 3
    return np.stack(cols, axis=-1), np.asarray(pen)


def _fit_logistic(terms: Callable[[np.ndarray], tuple], n_coef: int, penalty: np.ndarray,
                  iters: int = 50) -> np.ndarray:
    """Ridge-penalised logistic regression by damped Newton steps.

    ``terms(beta)`` is ``(sum of log(1 + e^z) - y z, X'(p - y), X' W X)`` over the data at ``beta``
    (unpenalised; summed over the fit's parts), so one call per trial point serves the line
    search and, once accepted, the next step."""
    beta = np.zeros(n_coef)

    def penalised(b: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        loss, grad, hess = terms(b)
        return float(loss + 0.5 * np.sum(penalty * b * b)), grad + penalty * b, hess + np.diag(penalty)

    current, grad, hess = penalised(beta)
    for _ in range(iters):
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-4:
            trial = beta - t * step
            new, trial_grad, trial_hess = penalised(trial)
            if new <= current:
                break
            t *= 0.5
        if t <= 1e-4:
            break
        beta, improvement = trial, current - new
        current, grad, hess = new, trial_grad, trial_hess
        if improvement < 1e-9 * max(1.0, abs(current)):
            break
    return beta


def _logistic_terms(part: FitPart, spec: tuple, beta: np.ndarray) -> tuple:
    """One part's :func:`_fit_logistic` terms for the model ``spec`` = (greedy, base rate, with evidence)."""
    x, y = part.cached(("acceptance", spec), lambda: _part_design(part, *spec))
    z = x @ beta
    p = _sigmoid(z)
    return np.sum(np.logaddexp(0.0, z) - y * z), x.T @ (p - y), (x * (p * (1 - p))[:, None]).T @ x


def _part_design(part: FitPart, kind: bool, base_rate: float, evidence: bool) -> tuple[np.ndarray, np.ndarray]:
    n, gamma = part.conf.shape
    sel, accepted = _selection(part, kind)
    c = part.conf[sel]
    c = np.where(np.isnan(c), base_rate, c)
    offset = np.broadcast_to(np.arange(1, gamma + 1)[None, :], (n, gamma))[sel]
    x, _ = _design(c, offset, gamma, part.p_topk[sel] if evidence else None,
                   part.topk_state[sel] if evidence else None)
    return x, accepted[sel].astype(np.float64)


def _selection(part: FitPart, kind: bool) -> tuple[np.ndarray, np.ndarray]:
    verified, accepted = training_mask(part.window, part.correct, part.gamma)
    return verified & (np.asarray(part.greedy, dtype=bool) == kind)[:, None], accepted


def _kind_counts(part: FitPart, kind: bool) -> tuple[int, int, bool]:
    """Verified drafts of a sampling kind, how many were accepted, and whether any has top-k evidence."""
    sel, accepted = _selection(part, kind)
    return int(sel.sum()), int(accepted[sel].sum()), bool((part.topk_state[sel] != 0).any())


def training_mask(window: np.ndarray, correct: np.ndarray, gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """Verified drafts ``[n, gamma]`` (offsets up to the first rejection inside the
    window) and their outcome (accepted)."""
    offset = np.arange(1, gamma + 1)[None, :]
    verified = offset <= np.minimum(np.asarray(correct)[:, None] + 1, np.asarray(window)[:, None])
    return verified, offset <= np.asarray(correct)[:, None]


@dataclass(frozen=True)
class AcceptanceModel:
    """Fitted acceptance probabilities; ``None`` coefficients fall back to the raw head."""

    gamma: int
    draft_coef: np.ndarray | None     # temperature drafts, with top-k evidence
    prior_coef: dict[bool, np.ndarray | None]   # by greedy: confidence (and position) only
    base_rate: dict[bool, float]      # in-window acceptance rate, for missing confidences
    n_train: dict[bool, int]

    def _impute(self, c: np.ndarray, greedy: np.ndarray | bool) -> np.ndarray:
        fill = np.where(greedy, self.base_rate[True], self.base_rate[False])
        return np.where(np.isnan(c), fill, c)

    def prior(self, confidence: np.ndarray, greedy: np.ndarray) -> np.ndarray:
        """``[n, gamma]`` acceptance probability of a draft from the head's confidence alone."""
        c = np.asarray(confidence, dtype=np.float64)
        greedy = np.broadcast_to(np.asarray(greedy, dtype=bool)[:, None], c.shape)
        return self.prior_at(c, np.broadcast_to(np.arange(1, self.gamma + 1)[None, :], c.shape), greedy)

    def prior_at(self, confidence: np.ndarray, offset: np.ndarray, greedy: np.ndarray) -> np.ndarray:
        """:meth:`prior` of drafts given one by one: confidence, offset (1..gamma) and greedy per draft."""
        greedy = np.asarray(greedy, dtype=bool)
        c = self._impute(np.asarray(confidence, dtype=np.float64), greedy)
        out = np.clip(c, 0.0, 1.0)
        for kind in (True, False):
            coef, rows = self.prior_coef.get(kind), greedy == kind
            if coef is not None and rows.any():
                out[rows] = _sigmoid(_linear(coef, c[rows], np.asarray(offset)[rows], self.gamma))
        return out

    def draft(self, confidence: np.ndarray, p_topk: np.ndarray, topk_state: np.ndarray) -> np.ndarray:
        """``[n, gamma]`` acceptance probability of temperature drafts given the top-k evidence."""
        c = np.asarray(confidence, dtype=np.float64)
        return self.draft_at(c, np.broadcast_to(np.arange(1, self.gamma + 1)[None, :], c.shape), p_topk, topk_state)

    def draft_at(self, confidence: np.ndarray, offset: np.ndarray, p_topk: np.ndarray,
                 topk_state: np.ndarray) -> np.ndarray:
        """:meth:`draft` of drafts given one by one (confidence, offset 1..gamma and the top-k evidence)."""
        c = np.asarray(confidence, dtype=np.float64)
        if self.draft_coef is None:
            return self.prior_at(c, offset, np.zeros(c.shape, dtype=bool))
        return _sigmoid(_linear(self.draft_coef, self._impute(c, False), np.asarray(offset), self.gamma,
                                np.asarray(p_topk), np.asarray(topk_state)))


def _linear(coef: np.ndarray, c: np.ndarray, offset: np.ndarray, gamma: int, p_topk: np.ndarray | None = None,
            topk_state: np.ndarray | None = None) -> np.ndarray:
    """``_design(c, offset, ...) @ coef`` draft by draft, without the design matrix: its nonzero terms in a
    fixed order, so a draft's value does not depend on the drafts computed beside it (a BLAS product's
    rounding can, by where the draft falls in the kernel's blocks)."""
    lc = _logit(c)
    eta = coef[0] + coef[1] * lc + coef[1 + offset] * lc
    if topk_state is not None:
        in_top = topk_state == 1
        logp = np.log(np.clip(np.nan_to_num(p_topk, nan=1.0), 1e-6, 1.0))
        eta = eta + coef[gamma + 2] * in_top + coef[gamma + 3] * (in_top * logp) + coef[gamma + 4] * (topk_state == 2)
    return eta


def fit_acceptance_model(
    confidence: np.ndarray,
    window: np.ndarray,
    correct: np.ndarray,
    greedy: np.ndarray,
    *,
    p_topk: np.ndarray,
    topk_state: np.ndarray,
) -> AcceptanceModel:
    """Fit on the run's verified in-window drafts (see the module docstring).

    ``confidence``, ``p_topk``, ``topk_state`` are ``[n, gamma]`` (NaN / 0 where
    unknown); ``window``, ``correct``, ``greedy`` are ``[n]``.  A sampling kind
    with fewer than 50 verified drafts, or only one outcome, keeps the raw head.
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    part = FitPart(confidence, np.asarray(window), np.asarray(correct), np.asarray(greedy, dtype=bool),
                   np.asarray(p_topk), np.asarray(topk_state), np.full(confidence.shape, np.nan))
    return fit_acceptance_parts(LocalParts([part]), confidence.shape[1])


def fit_acceptance_parts(parts: Parts, gamma: int) -> AcceptanceModel:
    """:func:`fit_acceptance_model` on a sample held in parts (:mod:`~dspark_obs.estimators.ceiling.fit_parts`)."""
    prior_coef: dict[bool, np.ndarray | None] = {}
    base_rate: dict[bool, float] = {}
    n_train: dict[bool, int] = {}
    draft_coef = None
    for kind in (True, False):
        n, hits, has_topk = summed(parts.map(_kind_counts, kind) or [(0, 0, False)])
        n_train[kind] = n
        base_rate[kind] = hits / n if n else 0.5
        if not (n >= _MIN_ROWS and 0 < hits < n):
            prior_coef[kind] = None
            continue
        for evidence in ((False, True) if not kind and has_topk else (False,)):
            spec = (kind, base_rate[kind], evidence)
            pen = _design(np.full(1, 0.5), np.ones(1), gamma, np.ones(1) if evidence else None,
                          np.ones(1) if evidence else None)[1]
            coef = _fit_logistic(lambda b, spec=spec: summed(parts.map(_logistic_terms, spec, b)), pen.size, pen)
            if evidence:
                draft_coef = coef
            else:
                prior_coef[kind] = coef
    return AcceptanceModel(gamma=gamma, draft_coef=draft_coef, prior_coef=prior_coef,
                           base_rate=base_rate, n_train=n_train)


@dataclass(frozen=True)
class BinnedPrior:
    """Acceptance rate of verified drafts per position and bin of the confidence, shrunk to the pooled bin.

    No shape is assumed between confidence and acceptance: a drafter's
    probability of its draft is not an acceptance probability (a draft it was
    unsure of is often accepted, ``min(1, p/q)`` being large when ``q`` is
    small), so a logistic in ``logit(c)`` extrapolates badly to the low
    confidences of trimmed drafts.  Bins are equal-mass over the verified
    drafts' confidences; a bin's rate borrows ``_PSEUDO`` drafts from the
    pooled (all positions) rate of the same bin.
    """

    edges: np.ndarray        # [n_bins + 1] confidence edges (first -inf, last +inf)
    rate: np.ndarray         # [gamma, n_bins] shrunk acceptance rate
    fallback: float          # the verified drafts' overall rate (missing confidences)

    def prior(self, confidence: np.ndarray) -> np.ndarray:
        c = np.asarray(confidence, dtype=np.float64)
        return self.prior_at(c, np.broadcast_to(np.arange(c.shape[1])[None, :], c.shape))

    def prior_at(self, confidence: np.ndarray, position: np.ndarray) -> np.ndarray:
        """:meth:`prior` of drafts given one by one: confidence and position (0-based) per draft."""
        c = np.asarray(confidence, dtype=np.float64)
        b = np.clip(np.searchsorted(self.edges, np.nan_to_num(c, nan=0.5), side="right") - 1, 0, self.rate.shape[1] - 1)
        return np.where(np.isnan(c), self.fallback, self.rate[position, b])


_PSEUDO = 20.0


def fit_binned_prior(confidence: np.ndarray, window: np.ndarray, correct: np.ndarray, sampled: np.ndarray,
                     *, n_bins: int = 10) -> BinnedPrior | None:
    """:class:`BinnedPrior` from the verified drafts of sampled steps; None with fewer than 50 of them."""
    c = np.asarray(confidence, dtype=np.float64)
    greedy = ~np.asarray(sampled, dtype=bool)
    part = FitPart(c, np.asarray(window), np.asarray(correct), greedy, c, c, c)
    return fit_binned_parts(LocalParts([part]), c.shape[1], n_bins=n_bins)


def _binned_cells(part: FitPart) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The part's verified drafts of sampled steps with a confidence: ``(c, position, accepted)``, flat."""
    verified, accepted = training_mask(part.window, part.correct, part.gamma)
    use = verified & ~np.asarray(part.greedy, dtype=bool)[:, None] & ~np.isnan(part.conf)
    k = np.broadcast_to(np.arange(part.gamma)[None, :], part.conf.shape)
    return part.conf[use], k[use], accepted[use]


def fit_binned_parts(parts: Parts, gamma: int, *, n_bins: int = 10) -> BinnedPrior | None:
    """:func:`fit_binned_prior` on a sample held in parts: the cells are gathered (their order does not matter)."""
    cells = parts.map(_binned_cells)
    if not cells or sum(len(c) for c, _, _ in cells) < _MIN_ROWS:
        return None
    c, k, accepted = (np.concatenate(cols) for cols in zip(*cells))
    inner = np.unique(np.quantile(c, np.linspace(0, 1, n_bins + 1)[1:-1]))
    edges = np.concatenate([[-np.inf], inner, [np.inf]])
    nb = edges.size - 1
    b = np.clip(np.searchsorted(edges, c, side="right") - 1, 0, nb - 1)
    cell = k * nb + b
    y = accepted.astype(np.float64)
    hits = np.bincount(cell, weights=y, minlength=gamma * nb).reshape(gamma, nb)
    count = np.bincount(cell, minlength=gamma * nb).reshape(gamma, nb).astype(np.float64)
    overall = float(y.mean())
    pooled = (hits.sum(0) + _PSEUDO * overall) / (count.sum(0) + _PSEUDO)
    rate = (hits + _PSEUDO * pooled[None, :]) / (count + _PSEUDO)
    return BinnedPrior(edges=edges, rate=rate, fallback=overall)
