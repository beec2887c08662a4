"""The drafter map: the drafter's probability of its draft, learnt from the confidence head.

Under speculative sampling a draft ``d ~ q`` is accepted with probability
``a = min(1, p(d) / q(d))``.  The target's ``p(d)`` of a trimmed draft is in the
tokens table (the realised token's logprob, or the top-k), the drafter's
``q(d)`` is not — but the head's confidence ``c`` is, and for a drafter whose
confidence *is* its probability of the token (a real drafter's softmax), or a
separate head that is a monotone transform of it, ``q`` is a monotone function
of ``c``.  The run shows that function: every verified draft was accepted with
probability ``min(1, p / q)``, ``p`` known, outcome seen.  So ``q̂ = g(c)`` is
fitted by maximum likelihood on the verified drafts::

    logit q̂_k = alpha + alpha_k + (beta + beta_k) * logit(c_k)

**Family, and why**: logit-affine per position ``k`` (shared slope and
intercept plus ridge-shrunk per-position offsets) contains the identity
(``c = q``), SGLang's STS temperature (``c = sigmoid(logit(q) / T_k)``) and any
Platt-like separate head, with few parameters, so positions with few verified
drafts borrow from the others.  ``min(1, r)`` is smoothed (a softplus of
``log q̂ - log p`` with sharpness 40) so the likelihood has a gradient; at
``p = q`` the smoothed acceptance is ``2^(-1/40)`` = 0.983, not 1 (with 20 it
was 0.966: on the real-model emulator's fully-walked steps the mean bias
was -0.09 drafts, with 40 it is -0.05).

Which verified drafts are used: sampled steps' drafts up to the first
rejection inside the window **whose draft is in the target's top-k** there.
That event does not depend on the outcome (the top-k is the target's, on the
prefix both outcomes share), so the fit is the likelihood of the outcome given
``(p, c)`` with nothing selected by it.  The obvious alternative — every draft
whose ``p`` is known — is selected by the outcome: an accepted draft is the
realised token, so its ``p`` is always known, a rejected one's only when it is
in the top-k; the fit then sees acceptances at low ``p`` without their
rejections and pulls ``q̂`` down (measured on the real-model emulator with a
separate head: a mean ceiling bias of +0.2 drafts).  Runs collected without
top-k logprobs fall back to it.

The per-position offsets carry a ridge penalty of 500: a position needs
thousands of verified drafts to move far from the common map (on the
real-model emulator, 500 drafts per position with a penalty of 5 fitted noise
and raised the ceiling's error from 0.28 to 0.30 drafts).  The parameters'
uncertainty (the inverse of the penalised information) gives a band of ``q̂``
per draft, which :meth:`DrafterMap.accept` (``z``) turns into ``a`` bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from dspark_obs.estimators.ceiling.fit_parts import FitPart, LocalParts, Parts, summed

__all__ = ["DrafterMap", "fit_drafter_map", "fit_drafter_parts", "import_optimiser"]

_EPS = 1e-6
_SHARP = 40.0
_MIN_ROWS = 50
_RIDGE = 500.0         # on the per-position offsets (intercept and slope): see the module docstring


def _logit(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, _EPS, 1.0 - _EPS)
    return np.log(x) - np.log1p(-x)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _design(c: np.ndarray, offset: np.ndarray, gamma: int) -> np.ndarray:
    """Flat rows: ``[1, z, onehot_k, z * onehot_k]`` with ``z = logit(c)``."""
    z = _logit(c)
    hot = (offset[:, None] == np.arange(1, gamma + 1)[None, :]).astype(np.float64)
    return np.column_stack([np.ones_like(z), z, hot, hot * z[:, None]])


def _penalty(gamma: int) -> np.ndarray:
    return np.concatenate([[1e-6, 1e-6], np.full(2 * gamma, _RIDGE)])


def _nll_terms(theta: np.ndarray, x: np.ndarray, log_p: np.ndarray, y: np.ndarray) -> tuple:
    """Unpenalised negative log-likelihood of the outcomes and its gradient (one part's terms)."""
    eta = x @ theta
    log_q = -np.logaddexp(0.0, -eta)
    u = _SHARP * (log_q - log_p)
    log_a = -np.logaddexp(0.0, u) / _SHARP            # smooth min(0, log p - log q)
    s = _sigmoid(u)                                    # d(-log_a)/d log_q
    # Rejected drafts' terms only where a draft was rejected (the same values as computing them everywhere).
    rejected = ~y
    la = log_a[rejected]
    one_minus = np.maximum(-np.expm1(la), 1e-12)
    ll = log_a.copy()
    ll[rejected] = np.log(one_minus)
    d_logq = -s                                        # d ll / d log q
    d_logq[rejected] = (np.exp(la) / one_minus) * s[rejected]
    grad_eta = d_logq * (1.0 - np.exp(log_q))          # d log q / d eta = 1 - q
    return -ll.sum(), -(x.T @ grad_eta)


def _penalised(terms: tuple, theta: np.ndarray, penalty: np.ndarray) -> tuple[float, np.ndarray]:
    f, g = terms
    return float(f + 0.5 * np.sum(penalty * theta * theta)), g + penalty * theta


def _nll(theta: np.ndarray, x: np.ndarray, log_p: np.ndarray, y: np.ndarray,
         penalty: np.ndarray) -> tuple[float, np.ndarray]:
    """Penalised negative log-likelihood of the outcomes and its gradient."""
    return _penalised(_nll_terms(theta, x, log_p, y), theta, penalty)


@dataclass(frozen=True)
class DrafterMap:
    """Fitted ``q̂ = g(c)`` per position; ``coef is None`` means too few verified drafts."""

    gamma: int
    coef: np.ndarray | None
    cov: np.ndarray | None       # covariance of coef (inverse penalised information)
    n_train: int

    @property
    def fitted(self) -> bool:
        return self.coef is not None

    def q(self, confidence: np.ndarray, *, z: float = 0.0) -> np.ndarray:
        """``[n, gamma]`` drafter probability of each draft; ``z`` standard errors up (or down)."""
        c = np.asarray(confidence, dtype=np.float64)
        return self.q_at(c, np.arange(c.shape[1]), z=z)

    def q_at(self, confidence: np.ndarray, position: np.ndarray, *, z: float = 0.0) -> np.ndarray:
        """:meth:`q` of drafts given by confidence and position (0-based), broadcast together.

        The design row of position ``k`` is ``u_k + l w_k`` (``l = logit(c)``, ``u_k`` the
        intercept's and ``w_k`` the slope's indicator), so ``eta`` and its variance are
        per-position polynomials in ``l``: a few passes over the drafts, no design matrix.
        """
        c = np.asarray(confidence, dtype=np.float64)
        if self.coef is None:
            return np.clip(c, _EPS, 1.0)
        gamma, k = self.gamma, np.arange(self.gamma)
        l = _logit(np.where(np.isnan(c), 0.5, c))
        b = self.coef
        eta = (b[0] + b[2 + k])[position] + (b[1] + b[2 + gamma + k])[position] * l
        if z:
            u, w = np.zeros((gamma, b.size)), np.zeros((gamma, b.size))
            u[:, 0], u[k, 2 + k], w[:, 1], w[k, 2 + gamma + k] = 1.0, 1.0, 1.0, 1.0
            cu, cw = u @ self.cov, w @ self.cov
            var = (cu * u).sum(1)[position] + l * (2.0 * (cu * w).sum(1))[position] + l * l * (cw * w).sum(1)[position]
            eta = eta + z * np.sqrt(np.maximum(var, 0.0))
        return _sigmoid(eta)

    def accept(self, confidence: np.ndarray, p: np.ndarray, *, z: float = 0.0) -> np.ndarray:
        """``min(1, p / q̂)`` (``z > 0`` raises ``q̂``: a lower acceptance)."""
        c = np.asarray(confidence, dtype=np.float64)
        return self.accept_at(c, np.arange(c.shape[1]), p, z=z)

    def accept_at(self, confidence: np.ndarray, position: np.ndarray, p: np.ndarray, *, z: float = 0.0) -> np.ndarray:
        """:meth:`accept` of drafts given by confidence, position (0-based) and target probability."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.minimum(1.0, np.asarray(p, dtype=np.float64) / self.q_at(confidence, position, z=z))


def fit_drafter_map(confidence: np.ndarray, p_draft: np.ndarray, topk_state: np.ndarray, window: np.ndarray,
                    correct: np.ndarray, sampled: np.ndarray) -> DrafterMap:
    """Fit :class:`DrafterMap` on the verified drafts of sampled steps (see the module docstring).

    ``confidence``, ``p_draft`` (target probability of the draft, NaN unknown) and
    ``topk_state`` (0 no top-k, 1 in, 2 below) are ``[n, gamma]``; ``window``,
    ``correct``, ``sampled`` are ``[n]``.

    >>> rng = np.random.default_rng(0)
    >>> q = rng.uniform(0.05, 0.95, (4000, 2)); p = rng.uniform(0.0, 1.0, (4000, 2))
    >>> acc = rng.random((4000, 2)) < np.minimum(1, p / q)
    >>> correct = np.where(acc[:, 0], np.where(acc[:, 1], 2, 1), 0)
    >>> m = fit_drafter_map(q, p, np.ones((4000, 2), np.int8), np.full(4000, 2), correct, np.ones(4000, bool))
    >>> bool(np.abs(m.q(np.array([[0.2, 0.8]])) - [[0.2, 0.8]]).max() < 0.05)
    True
    """
    c = np.asarray(confidence, dtype=np.float64)
    part = FitPart(c, np.asarray(window), np.asarray(correct), ~np.asarray(sampled, dtype=bool),
                   np.asarray(p_draft, dtype=np.float64), np.asarray(topk_state), np.asarray(p_draft, dtype=np.float64))
    return fit_drafter_parts(LocalParts([part]), c.shape[1])


def _candidates(part: FitPart) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(drafts in the top-k, drafts whose p is known, accepted)`` among the part's verified sampled drafts."""
    offset = np.arange(1, part.gamma + 1)[None, :]
    correct = np.asarray(part.correct, dtype=np.int64)
    verified = offset <= np.minimum(correct[:, None] + 1, np.asarray(part.window, dtype=np.int64)[:, None])
    candidates = verified & ~np.asarray(part.greedy, dtype=bool)[:, None] & ~np.isnan(part.conf)
    known = candidates & ~np.isnan(part.p_draft)
    return known & (np.asarray(part.topk_state) == 1), known, offset <= correct[:, None]


def _use_counts(part: FitPart) -> tuple[int, int, int, int]:
    in_topk, known, accepted = _candidates(part)
    return int(in_topk.sum()), int(accepted[in_topk].sum()), int(known.sum()), int(accepted[known].sum())


def _part_rows(part: FitPart, topk_only: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    in_topk, known, accepted = _candidates(part)
    use = in_topk if topk_only else known
    offset = np.broadcast_to(np.arange(1, part.gamma + 1)[None, :], part.conf.shape)
    return (_design(part.conf[use], offset[use], part.gamma), np.log(np.clip(part.p_draft[use], 1e-12, 1.0)),
            accepted[use])


def _part_nll(part: FitPart, topk_only: bool, thetas: list) -> list:
    """One part's :func:`_nll_terms` at each of ``thetas`` (its rows built once, kept on the part)."""
    x, log_p, y = part.cached(("drafter", topk_only), lambda: _part_rows(part, topk_only))
    return [_nll_terms(theta, x, log_p, y) for theta in thetas]


def import_optimiser():
    """SciPy's ``minimize``, imported on first use: 0.6 s that a command (and each worker forked from it)
    pays only when it fits, and that ``--jobs`` spends in a thread while its workers read the sample."""
    from scipy.optimize import minimize  # at call time: start-up cost, see the docstring
    return minimize


def fit_drafter_parts(parts: Parts, gamma: int) -> DrafterMap:
    """:func:`fit_drafter_map` on a sample held in parts (:mod:`~dspark_obs.estimators.ceiling.fit_parts`)."""
    n_topk, hit_topk, n_known, hit_known = summed(parts.map(_use_counts) or [(0, 0, 0, 0)])
    # Without top-k logprobs: every draft whose p is known (selected by the outcome; see the docstring).
    topk_only = n_topk > 0
    n, hits = (n_topk, hit_topk) if topk_only else (n_known, hit_known)
    if n < _MIN_ROWS or hits == n or hits == 0:
        return DrafterMap(gamma=gamma, coef=None, cov=None, n_train=n)
    penalty = _penalty(gamma)

    def nll(thetas: list) -> list:
        per_part = parts.map(_part_nll, topk_only, thetas)
        return [_penalised(summed([terms[i] for terms in per_part]), theta, penalty) for i, theta in enumerate(thetas)]

    theta0 = np.zeros(2 + 2 * gamma)
    theta0[1] = 1.0                                     # start at the identity, c = q
    res = import_optimiser()(lambda t: nll([t])[0], theta0, jac=True, method="L-BFGS-B", options={"maxiter": 200})
    theta = res.x
    return DrafterMap(gamma=gamma, coef=theta, cov=_covariance(theta, nll), n_train=n)


def _covariance(theta: np.ndarray, nll: Callable[[list], list]) -> np.ndarray:
    """Inverse of the penalised observed information, by differences of the analytic gradient (one pass
    over the parts for all ``2k`` points)."""
    k = theta.size
    step = 1e-4
    points = [theta + e for e in np.eye(k) * step] + [theta - e for e in np.eye(k) * step]
    grads = [g for _, g in nll(points)]
    h = np.empty((k, k))
    for j in range(k):
        h[:, j] = (grads[j] - grads[k + j]) / (2 * step)
    h = 0.5 * (h + h.T)
    try:
        return np.linalg.inv(h)
    except np.linalg.LinAlgError:
        return np.linalg.pinv(h)
