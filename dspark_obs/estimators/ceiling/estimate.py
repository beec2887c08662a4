"""The block-accept (ceiling) estimator: what a full-block verify would have accepted.

Compact mode verifies only a window of each drafted block, so when the whole
window is accepted (a *censored* step) the full-block acceptance — the ceiling —
is hidden.  This module estimates it per request-step from the committed output
(DESIGN.md §3):

* **greedy** requests (temperature 0): a trimmed draft is accepted iff it equals
  the realised token, so the ceiling is exact wherever the output continues
  past the walk; where the output ends first it is an interval (EOS: nothing
  past it is accepted, ``hi = lo``; length cut: up to ``gamma``).
* **temperature** requests: a trimmed draft is accepted with probability
  ``a_k = min(1, p_k / q_k)``.  ``method="sglang"`` is SGLang's own rule
  (``dspark_block_accept_estimator``): walk while the realised token equals the
  draft, ``lo = w + sum prod a``, ``hi = lo + prod * (#unverifiable)``,
  ``mid = (lo + hi) / 2``; ``q_k`` comes from SGLang's JSONL, and without it the
  head's confidence ``c_k`` stands in for ``a_k``.  ``method="default"``
  separates what is known from what is estimated:

  - when the head's confidence is (a monotone map of) the drafter's
    probability of its draft — a real drafter's softmax, or a separate head of
    it — the *drafter map* ``q̂ = g(c)`` is learnt from the verified drafts
    (:mod:`~dspark_obs.estimators.ceiling.drafter`) and the walked drafts get ``a_k = min(1, p_k / q̂_k)``,
    with ``lo``/``hi`` from the map's standard errors (``q̂ ± 1.96 se``);
  - otherwise (a head trained on acceptance, like the emulator's) ``a_k`` comes
    from an acceptance model fitted on the run's verified drafts (confidence as
    the prior, top-k evidence as the update; :mod:`~dspark_obs.estimators.ceiling.prior`), with
    ``lo``/``hi`` bounds that hold for any drafter (``p_k <= a_k <= 1``);
    which of the two explains the verified outcomes better (log-likelihood) is
    chosen per run;
  - ``a_k`` is exact where SGLang's JSONL gives ``q_k``; past a divergence the
    unverifiable rest is accepted in ``mid`` at the verified drafts' rate in
    the same confidence bin and position (:class:`~dspark_obs.estimators.ceiling.prior.BinnedPrior`;
    a drafter's probability is no acceptance probability, so no shape is
    assumed) with the drafter map, else with the head's calibrated conditional
    confidence and between none and all in ``lo``/``hi`` (none after
    EOS).  That band is what the data support: the acceptance ``min(1, p/q̂)``
    of the run's verified drafts spreads over all of [0, 1] at every position
    (its 2.5% and 97.5% quantiles are 0 and 1 on a drafter-probability head),
    so a narrower band past a divergence would be a guess; the drafter map
    narrows the walked part instead.

  Equality of a trimmed draft with the realised token is *not* taken as
  acceptance: the realised token came from another verify, so equality only
  says the draft was not contradicted (the emulator's coupling makes equality
  imply acceptance; real SGLang's does not).

Assumptions: the realised prefix is what the untrimmed trajectory would have
seen up to the walk's position (SGLang's "anchor tokens behave alike");
``tokens.logprob`` / ``top_logprobs`` are at the request temperature (SGLang's
default); ``requests.prompt_tokens`` places output position 0 (the prefill
token) — checked against each step's committed tokens; a request of unknown
temperature gets the temperature rule (its bounds hold for greedy too).

Units: ``lo``/``mid``/``hi`` count *drafts* a full block accepts (0..gamma),
not accept lengths; SGLang's estimator and analyzer report ``lo + 1`` etc.

:func:`estimate_ceiling` is the pure computation; :func:`~dspark_obs.estimators.ceiling.io.estimate_run` reads a
run from the store's views, computes, and writes the ``ceiling``,
``ceiling_summary`` and ``ceiling_validation`` tables (replacing the run's old
results).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa

from dspark_obs import schema
from dspark_obs.estimators.ceiling.drafter import DrafterMap, fit_drafter_map
from dspark_obs.estimators.ceiling.evidence import Evidence
from dspark_obs.estimators.ceiling.fit_parts import FitPart, LocalParts, Parts, summed
from dspark_obs.estimators.ceiling.prior import (
    AcceptanceModel,
    BinnedPrior,
    fit_acceptance_model,
    fit_binned_prior,
    training_mask,
)
from dspark_obs.estimators.ceiling.walk import (
    CATEGORIES,
    Walk,
    ceiling_from_factors,
    position_survival,
    sglang_interval,
    walk_blocks,
)
from dspark_obs.schema import CEILING, CEILING_SUMMARY, CEILING_VALIDATION

__all__ = ["METHODS", "Method", "drafter_explains_better", "drafter_explains_better_parts", "CeilingEstimate", "estimate_ceiling",
           "CEILING", "CEILING_SUMMARY", "CEILING_VALIDATION"]

METHODS = ("default", "sglang")
_Z = 1.96           # the drafter map's band: q̂ +- 1.96 standard errors
_TAIL_LO, _TAIL_HI = 0.0, 1.0   # unverifiable drafts past a divergence: none to all accepted
Method = Literal["default", "sglang"]

_i16, _i32, _i64, _f32, _f64, _str = pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.string()


_f = schema.field  # a documented column


@dataclass(frozen=True)
class CeilingEstimate:
    """Per request-step results of :func:`estimate_ceiling` (arrays of ``n``)."""

    walk: Walk
    lo: np.ndarray
    mid: np.ndarray
    hi: np.ndarray
    model: AcceptanceModel | None = field(default=None, repr=False)
    survival: np.ndarray | None = field(default=None, repr=False)   # [n, gamma] P(first k accepted), for mid

    @property
    def category(self) -> np.ndarray:
        """Category names (object array)."""
        return np.asarray(CATEGORIES, dtype=object)[self.walk.category]


def _as_2d(x: np.ndarray | None, shape: tuple[int, int], name: str) -> np.ndarray:
    if x is None:
        return np.full(shape, np.nan)
    x = np.asarray(x, dtype=np.float64)
    if x.shape != shape:
        raise ValueError(f"{name} has shape {x.shape}, expected {shape} (steps x gamma)")
    return x


def estimate_ceiling(
    drafts: np.ndarray,
    window: np.ndarray,
    correct: np.ndarray,
    evidence: Evidence,
    *,
    greedy: np.ndarray,
    natural_end: np.ndarray,
    confidence: np.ndarray | None = None,
    q_draft: np.ndarray | None = None,
    p_draft: np.ndarray | None = None,
    method: Method = "default",
    model: AcceptanceModel | None = None,
    drafter: DrafterMap | None = None,
    use_drafter: bool | None = None,
    binned_prior: BinnedPrior | None = None,
) -> CeilingEstimate:
    """Ceiling ``(lo, mid, hi)`` in drafts (0..gamma) for each request-step.

    Long: over 60 lines for its documented parameters and example; the body,
    under 60, is the method's one sequence: walk, acceptance factors, ceilings.

    Parameters
    ----------
    drafts : int [n, gamma]; window, correct : int [n]
        ``draft_tokens``, ``verify_len - 1``, ``correct_drafts``.
    evidence : :class:`~dspark_obs.estimators.ceiling.evidence.Evidence`
        Realised tokens and target probabilities at each draft's position.
    greedy, natural_end : bool [n]
        Temperature 0; the output ended with EOS / stop (else length cut or unknown).
    confidence : float [n, gamma], optional
        The head's conditional acceptance ``c_k`` (NaN / None when not sent).
    q_draft, p_draft : float [n, gamma], optional
        Drafter and target probabilities of each draft from SGLang's JSONL
        (NaN unknown); ``p_draft`` overrides the evidence where given.
    method : "default" | "sglang"
        See the module docstring.
    model : AcceptanceModel, optional
        Fitted acceptance model; by default fitted on these steps.
    drafter : DrafterMap, optional
        Fitted drafter map ``q̂ = g(c)``; by default fitted on these steps.
    use_drafter : bool, optional
        Whether the drafter map (rather than the acceptance model) gives the
        walked drafts' ``a_k``; by default the one that explains these steps'
        verified outcomes better (:func:`drafter_explains_better`).
    binned_prior : BinnedPrior, optional
        With the drafter map, the sampled drafts past a divergence are accepted
        at the verified drafts' rate in their confidence bin; by default fitted
        on these steps.

    Returns ``lo``, ``mid``, ``hi`` and ``survival`` (``[n, gamma]``, the
    per-position terms ``mid`` sums: the reconstructed calibration labels).

    >>> from dspark_obs.estimators.ceiling.evidence import Evidence
    >>> ev = Evidence(realised=np.array([[5, 6, 7]]), p_draft=np.full((1, 3), np.nan),
    ...               p_topk=np.full((1, 3), np.nan), topk_state=np.zeros((1, 3), np.int8))
    >>> est = estimate_ceiling(np.array([[5, 6, 8]]), np.array([1]), np.array([1]), ev,
    ...                        greedy=np.array([True]), natural_end=np.array([True]))
    >>> est.category[0], float(est.lo[0]), float(est.hi[0])   # d_2 matches, d_3 does not
    ('censored_resolved_exact', 2.0, 2.0)
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    drafts, window, correct = _checked_steps(drafts, window, correct)
    n, gamma = drafts.shape
    greedy = np.broadcast_to(np.asarray(greedy, dtype=bool), (n,))
    conf = _as_2d(confidence, (n, gamma), "confidence")
    p = evidence.p_draft
    if p_draft is not None:
        p_json = _as_2d(p_draft, (n, gamma), "p_draft")
        p = np.where(np.isnan(p_json), p, p_json)
    q = None if q_draft is None else _as_2d(q_draft, (n, gamma), "q_draft")

    walk = walk_blocks(drafts, window, correct, evidence.realised, natural_end)
    if model is None:
        model = fit_acceptance_model(conf, window, correct, greedy, p_topk=evidence.p_topk,
                                     topk_state=evidence.topk_state)
    if method == "sglang":
        return _sglang_estimate(walk, conf, p, q, greedy, model)
    if drafter is None:
        drafter = fit_drafter_map(conf, p, evidence.topk_state, window, correct, ~greedy)
    if use_drafter is None:
        use_drafter = drafter_explains_better(drafter, model, conf, p, evidence, window, correct, ~greedy)
    if use_drafter:
        binned_prior = binned_prior or fit_binned_prior(conf, window, correct, ~greedy)
    # Only censored steps have a ceiling to estimate; the others accepted ``correct`` drafts.
    rows = np.flatnonzero(walk.censored)
    part = walk.take(rows)
    pick = lambda x: None if x is None else x[rows]  # noqa: E731
    a_lo, a_mid, a_hi = _default_factors(part, pick(conf), pick(p), pick(evidence.p_topk), pick(evidence.topk_state),
                                         greedy[rows], pick(q), model, drafter if use_drafter else None)
    prior = _tail_prior(part, pick(conf), greedy[rows], model, binned_prior if use_drafter else None)
    lo, mid, hi = (np.array(correct, dtype=np.float64) for _ in range(3))
    lo[rows] = ceiling_from_factors(part, a_lo, tail=_TAIL_LO)
    hi[rows] = ceiling_from_factors(part, a_hi, tail=_TAIL_HI)
    mid[rows] = ceiling_from_factors(part, a_mid, tail=prior)
    survival = (np.arange(1, gamma + 1)[None, :] <= correct[:, None]).astype(np.float64)
    survival[rows] = position_survival(part, a_mid, tail=prior)
    return CeilingEstimate(walk=walk, lo=lo, mid=mid, hi=hi, model=model, survival=survival)


def _sglang_estimate(walk: Walk, conf, p, q, greedy, model: AcceptanceModel) -> CeilingEstimate:
    """SGLang's interval rule: ``a_k`` is the realised equality (greedy), ``min(1, p/q)`` (JSONL) or the
    head's confidence."""
    g = greedy[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        exact = np.full(p.shape, np.nan) if q is None else np.minimum(1.0, p / q)   # NaN unless both are known
    proxy = np.where(np.isnan(conf), model.base_rate[False], conf)
    a = np.where(g, walk.matched.astype(np.float64), np.where(~np.isnan(exact), exact, proxy))
    lo, mid, hi = sglang_interval(walk, a)
    halfway = 0.5 * (position_survival(walk, a, tail=0.0) + position_survival(walk, a, tail=1.0))
    return CeilingEstimate(walk=walk, lo=lo, mid=mid, hi=hi, model=model, survival=halfway)


def _checked_steps(drafts, window, correct) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``drafts [n, gamma]``, ``window`` and ``correct`` as arrays, refused with the bad step when inconsistent."""
    drafts = np.asarray(drafts)
    if drafts.ndim != 2 or drafts.shape[1] < 1:
        raise ValueError(f"drafts must be a 2-D array [steps, gamma], got shape {drafts.shape}")
    n, gamma = drafts.shape
    window = np.asarray(window, dtype=np.int64)
    correct = np.asarray(correct, dtype=np.int64)
    if window.shape != (n,) or correct.shape != (n,):
        raise ValueError(f"window and correct must have shape ({n},), got {window.shape} and {correct.shape}")
    bad = (correct < 0) | (correct > window) | (window > gamma)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"step {i}: need 0 <= correct_drafts <= window <= gamma={gamma}, got "
                         f"correct_drafts={correct[i]}, window={window[i]}")
    return drafts, window, correct


def _default_factors(walk: Walk, conf, p, p_topk, topk_state, greedy, q, model: AcceptanceModel,
                     drafter: DrafterMap | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-draft acceptance ``(a_lo, a_mid, a_hi)`` of the default method on the walked drafts (1 elsewhere).

    A greedy step is decided by whether the draft matched its realised token;
    else ``min(1, p/q)`` from SGLang's JSONL where both are known; else the
    drafter map's band (``drafter`` given) or ``[p, 1]`` around the acceptance
    model's guess.  Only the walked drafts are computed (the chain reads no other).
    """
    m, gamma = walk.walked.shape
    cell = np.flatnonzero(walk.walked)
    g = greedy[cell // gamma]
    p = p.reshape(-1)[cell]
    exact = np.full(cell.size, np.nan)
    if q is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            exact = np.minimum(1.0, p / q.reshape(-1)[cell])    # NaN unless both are known
    eq = walk.matched.reshape(-1)[cell].astype(np.float64)
    lo, mid, hi = eq.copy(), eq.copy(), eq.copy()
    known = ~g & ~np.isnan(exact)
    for a in (lo, mid, hi):
        a[known] = exact[known]
    est = np.flatnonzero(~g & ~known)                      # the drafts to estimate
    at, k, c, pe = cell[est], cell[est] % gamma, conf.reshape(-1)[cell[est]], p[est]
    p_known = ~np.isnan(pe)
    guess_at = ~p_known if drafter is not None else np.ones(est.size, dtype=bool)
    mapped = np.full(est.size, np.nan)
    mapped[guess_at] = model.draft_at(c[guess_at], k[guess_at] + 1, p_topk.reshape(-1)[at[guess_at]],
                                      topk_state.reshape(-1)[at[guess_at]])
    if drafter is not None:
        a_lo, a_hi = np.zeros(est.size), np.ones(est.size)
        ck, kk, pk = c[p_known], k[p_known], pe[p_known]
        mapped[p_known] = drafter.accept_at(ck, kk, pk)
        a_lo[p_known] = drafter.accept_at(ck, kk, pk, z=_Z)
        a_hi[p_known] = drafter.accept_at(ck, kk, pk, z=-_Z)
    else:
        a_lo, a_hi = np.nan_to_num(pe, nan=0.0), np.ones(est.size)
    lo[est], hi[est], mid[est] = a_lo, a_hi, np.clip(mapped, a_lo, a_hi)
    out = tuple(np.ones((m, gamma)) for _ in range(3))
    for full, a in zip(out, (lo, mid, hi)):
        full.reshape(-1)[cell] = a
    return out


def _tail_prior(walk: Walk, conf, greedy, model: AcceptanceModel, binned: BinnedPrior | None) -> np.ndarray:
    """``[m, gamma]`` acceptance of the unverifiable drafts in ``mid`` (0 elsewhere): the acceptance model's
    prior, or with the drafter map the verified drafts' rate in the same confidence bin (sampled steps)."""
    m, gamma = walk.walked.shape
    cell = np.flatnonzero(walk.unverifiable)
    g, k, c = greedy[cell // gamma], cell % gamma, conf.reshape(-1)[cell]
    prior = model.prior_at(c, k + 1, g)
    if binned is not None:
        prior = np.where(g, prior, binned.prior_at(c, k))
    out = np.zeros((m, gamma))
    out.reshape(-1)[cell] = prior
    return out


def drafter_explains_better(drafter: DrafterMap, model: AcceptanceModel, conf, p, evidence: Evidence,
                            window, correct, sampled) -> bool:
    """Does ``min(1, p / q̂(c))`` predict the verified outcomes better than the evidence model?

    Both are judged by log-likelihood on the same verified drafts of sampled
    steps (those whose ``p`` is known); a head that is not a function of the
    drafter's probability (e.g. trained on acceptance) loses here.
    """
    part = FitPart(np.asarray(conf), np.asarray(window), np.asarray(correct), ~np.asarray(sampled, dtype=bool),
                   evidence.p_topk, evidence.topk_state, np.asarray(p))
    return drafter_explains_better_parts(LocalParts([part]), drafter, model)


def _explain_terms(part: FitPart, drafter: DrafterMap, model: AcceptanceModel) -> tuple[float, float, bool]:
    verified, accepted = training_mask(part.window, part.correct, drafter.gamma)
    use = verified & ~np.asarray(part.greedy, dtype=bool)[:, None] & ~np.isnan(part.p_draft) & ~np.isnan(part.conf)
    if not use.any():
        return 0.0, 0.0, False
    a_map = np.clip(drafter.accept(part.conf, part.p_draft), 1e-6, 1 - 1e-6)[use]
    a_ev = np.clip(model.draft(part.conf, part.p_topk, part.topk_state), 1e-6, 1 - 1e-6)[use]
    y = accepted[use]
    ll = lambda a: float(np.where(y, np.log(a), np.log1p(-a)).sum())  # noqa: E731
    return ll(a_map), ll(a_ev), True


def drafter_explains_better_parts(parts: Parts, drafter: DrafterMap, model: AcceptanceModel) -> bool:
    """:func:`drafter_explains_better` on a sample held in parts (:mod:`~dspark_obs.estimators.ceiling.fit_parts`)."""
    if not drafter.fitted:
        return False
    ll_map, ll_ev, used = summed(parts.map(_explain_terms, drafter, model) or [(0.0, 0.0, False)])
    return bool(used) and ll_map >= ll_ev
