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

import numpy as np

__all__ = ["AcceptanceModel", "fit_acceptance_model", "training_mask", "BinnedPrior", "fit_binned_prior"]

_EPS_C = 1e-4
_MIN_ROWS = 50
_RIDGE_POSITION = 10.0
_RIDGE_EVIDENCE = 1.0
_BLOCK_ROWS = 32_768  # steps whose design matrix is built at once when applying a model


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


def _fit_logistic(x: np.ndarray, y: np.ndarray, penalty: np.ndarray, iters: int = 50) -> np.ndarray:
    """Ridge-penalised logistic regression by damped Newton steps."""
    beta = np.zeros(x.shape[1])

    def loss(b: np.ndarray) -> float:
        z = x @ b
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(penalty * b * b))

    current = loss(beta)
    for _ in range(iters):
        p = _sigmoid(x @ beta)
        grad = x.T @ (p - y) + penalty * beta
        hess = (x * (p * (1 - p))[:, None]).T @ x + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-4:
            trial = beta - t * step
            new = loss(trial)
            if new <= current:
                break
            t *= 0.5
        if t <= 1e-4:
            break
        beta, improvement = trial, current - new
        current = new
        if improvement < 1e-9 * max(1.0, abs(current)):
            break
    return beta


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
        confidence = np.asarray(confidence, dtype=np.float64)
        greedy = np.asarray(greedy, dtype=bool)
        if len(confidence) > _BLOCK_ROWS:  # the design matrix holds ~10 values per draft: bound it
            return np.concatenate([self.prior(confidence[i:i + _BLOCK_ROWS], greedy[i:i + _BLOCK_ROWS])
                                   for i in range(0, len(confidence), _BLOCK_ROWS)])
        c = self._impute(confidence, greedy[:, None])
        offset = np.broadcast_to(np.arange(1, self.gamma + 1)[None, :], c.shape)
        out = np.clip(c, 0.0, 1.0)
        for kind in (True, False):
            coef, rows = self.prior_coef.get(kind), greedy == kind
            if coef is not None and rows.any():
                x, _ = _design(c[rows], offset[rows], self.gamma, None, None)
                out[rows] = _sigmoid(x @ coef)
        return out

    def draft(self, confidence: np.ndarray, p_topk: np.ndarray, topk_state: np.ndarray) -> np.ndarray:
        """``[n, gamma]`` acceptance probability of temperature drafts given the top-k evidence."""
        if len(confidence) > _BLOCK_ROWS:
            return np.concatenate([self.draft(confidence[i:i + _BLOCK_ROWS], p_topk[i:i + _BLOCK_ROWS],
                                              topk_state[i:i + _BLOCK_ROWS])
                                   for i in range(0, len(confidence), _BLOCK_ROWS)])
        greedy = np.zeros(len(confidence), dtype=bool)
        if self.draft_coef is None:
            return self.prior(confidence, greedy)
        c = self._impute(np.asarray(confidence, dtype=np.float64), False)
        offset = np.broadcast_to(np.arange(1, self.gamma + 1)[None, :], c.shape)
        x, _ = _design(c, offset, self.gamma, np.asarray(p_topk), np.asarray(topk_state))
        return _sigmoid(x @ self.draft_coef)


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
    n, gamma = confidence.shape
    greedy = np.asarray(greedy, dtype=bool)
    verified, accepted = training_mask(window, correct, gamma)
    offset = np.broadcast_to(np.arange(1, gamma + 1)[None, :], (n, gamma))
    prior_coef: dict[bool, np.ndarray | None] = {}
    base_rate: dict[bool, float] = {}
    n_train: dict[bool, int] = {}
    draft_coef = None
    for kind in (True, False):
        sel = verified & (greedy == kind)[:, None]
        y = accepted[sel].astype(np.float64)
        n_train[kind] = int(y.size)
        base_rate[kind] = float(y.mean()) if y.size else 0.5
        c = confidence[sel]
        c = np.where(np.isnan(c), base_rate[kind], c)
        usable = y.size >= _MIN_ROWS and 0 < y.sum() < y.size
        if not usable:
            prior_coef[kind] = None
            continue
        x, pen = _design(c, offset[sel], gamma, None, None)
        prior_coef[kind] = _fit_logistic(x, y, pen)
        if not kind and (topk_state[sel] != 0).any():
            x, pen = _design(c, offset[sel], gamma, p_topk[sel], topk_state[sel])
            draft_coef = _fit_logistic(x, y, pen)
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
        b = np.clip(np.searchsorted(self.edges, np.nan_to_num(c, nan=0.5), side="right") - 1, 0, self.rate.shape[1] - 1)
        k = np.broadcast_to(np.arange(c.shape[1])[None, :], c.shape)
        return np.where(np.isnan(c), self.fallback, self.rate[k, b])


_PSEUDO = 20.0


def fit_binned_prior(confidence: np.ndarray, window: np.ndarray, correct: np.ndarray, sampled: np.ndarray,
                     *, n_bins: int = 10) -> BinnedPrior | None:
    """:class:`BinnedPrior` from the verified drafts of sampled steps; None with fewer than 50 of them."""
    c = np.asarray(confidence, dtype=np.float64)
    n, gamma = c.shape
    verified, accepted = training_mask(window, correct, gamma)
    use = verified & np.asarray(sampled, dtype=bool)[:, None] & ~np.isnan(c)
    if use.sum() < _MIN_ROWS:
        return None
    inner = np.unique(np.quantile(c[use], np.linspace(0, 1, n_bins + 1)[1:-1]))
    edges = np.concatenate([[-np.inf], inner, [np.inf]])
    nb = edges.size - 1
    b = np.clip(np.searchsorted(edges, c, side="right") - 1, 0, nb - 1)
    k = np.broadcast_to(np.arange(gamma)[None, :], c.shape)
    cell = (k * nb + b)[use]
    y = accepted[use].astype(np.float64)
    hits = np.bincount(cell, weights=y, minlength=gamma * nb).reshape(gamma, nb)
    count = np.bincount(cell, minlength=gamma * nb).reshape(gamma, nb).astype(np.float64)
    overall = float(y.mean())
    pooled = (hits.sum(0) + _PSEUDO * overall) / (count.sum(0) + _PSEUDO)
    rate = (hits + _PSEUDO * pooled[None, :]) / (count + _PSEUDO)
    return BinnedPrior(edges=edges, rate=rate, fallback=overall)
