"""Which sampling each request used, and how we know.

The ceiling rule depends on it (greedy: a trimmed draft is accepted iff it is
the target's top-1; sampled: with probability ``min(1, p/q)``), but a
``/generate`` body does not echo its sampling parameters.  Per request, in order:

``recorded``  the run stored a temperature (the driver, a request log, a prompts file);
``override``  the user said so (``estimate --temperature T``, an ingest map's
              ``temperature`` column);
``inferred``  the committed output decides: a sampled request commits a token
              that is not the target's top-1 (certain), a greedy one commits
              the top-1 at every position — which a sampled request also does,
              by luck, with probability ``prod_t p_top1(t)``.  So "greedy" is
              claimed only when that probability is below ``alpha`` (a
              likelihood ratio of at least ``1/alpha`` for greedy);
``unknown``   neither: an all-top-1 output too short or too confident to rule
              luck out, or no top-k logprobs (send ``top_logprobs_num`` >= 1).

A run in which no request shows a sampled token pools its all-top-1 requests
(:func:`pool_run`): if the run were sampled, every one of them being lucky has
probability ``prod`` over all their tokens, so they are called greedy together
when that is below ``alpha``.  A run with a visibly sampled request keeps its
unknown ones unknown (a lucky sampled request cannot hide behind greedy ones).

Logprobs are at the request temperature (SGLang's default), which is the
sampling distribution under the sampled hypothesis.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SOURCES", "GREEDY", "SAMPLED", "UNKNOWN", "KINDS", "GREEDY_CODE", "UNKNOWN_CODE", "DEFAULT_ALPHA",
           "infer_greedy", "pool_run", "kind_codes", "resolve_sampling", "resolve_sampling_codes", "TOKEN_EVIDENCE_SQL"]

SOURCES = ("recorded", "override", "inferred", "unknown")
GREEDY, SAMPLED, UNKNOWN = "greedy", "sampled", "unknown"
KINDS = (GREEDY, SAMPLED, UNKNOWN)
"""The sampling kinds in the order of their codes (:func:`kind_codes`); a stated temperature's kind is its
code ``temperature != 0``."""
GREEDY_CODE, UNKNOWN_CODE = KINDS.index(GREEDY), KINDS.index(UNKNOWN)
_KIND_NAMES = np.array(KINDS, dtype=object)
_SOURCE_NAMES = np.array(SOURCES, dtype=object)
DEFAULT_ALPHA = 1e-3
"""Largest chance that a sampled request commits only top-1 tokens by luck and is called greedy."""
_TIE = 1e-5  # a committed token within this logprob of the top-1 counts as the top-1

TOKEN_EVIDENCE_SQL = f"""
SELECT rid,
       count(*) FILTER (WHERE len(top_logprobs) > 0) AS n_topk,
       count(*) FILTER (WHERE len(top_logprobs) > 0
                        AND (token_id = top_ids[1] OR logprob >= list_max(top_logprobs) - {_TIE})) AS n_top1,
       coalesce(sum(list_max(top_logprobs)) FILTER (WHERE len(top_logprobs) > 0), 0) AS log_p_top1
FROM tokens WHERE run_id = $run GROUP BY rid
"""
"""Per request: tokens with a top-k, of them the top-1, and the summed log p of the top-1."""


def infer_greedy(n_topk: np.ndarray, n_top1: np.ndarray, log_p_top1: np.ndarray, *,
                 alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """``greedy`` / ``sampled`` / ``unknown`` per request from its committed tokens.

    Parameters
    ----------
    n_topk : int [r]
        Committed tokens whose top-k logprobs are known.
    n_top1 : int [r]
        Of those, tokens that are the target's top-1.
    log_p_top1 : float [r]
        ``sum_t log p_top1(t)`` over those tokens: the log-probability that a
        sampled request commits the top-1 everywhere.
    alpha : float
        Greedy is claimed only when ``exp(log_p_top1) <= alpha``.

    >>> infer_greedy(np.array([40, 40, 3, 0]), np.array([40, 39, 3, 0]),
    ...              np.array([-12.0, -11.0, -0.3, 0.0])).tolist()
    ['greedy', 'sampled', 'unknown', 'unknown']
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    n_topk = np.asarray(n_topk, dtype=np.int64)
    n_top1 = np.asarray(n_top1, dtype=np.int64)
    log_p = np.asarray(log_p_top1, dtype=np.float64)
    out = np.full(n_topk.shape, UNKNOWN, dtype=object)
    out[n_top1 < n_topk] = SAMPLED
    out[(n_topk > 0) & (n_top1 == n_topk) & (log_p <= np.log(alpha))] = GREEDY
    return out


def pool_run(kinds: np.ndarray, log_p_top1: np.ndarray, *, alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """:func:`infer_greedy`'s kinds with a run's unknown all-top-1 requests pooled (module docstring).

    >>> pool_run(np.array(['unknown', 'unknown', 'greedy'], dtype=object), np.array([-3.0, -4.0, -9.0])).tolist()
    ['greedy', 'greedy', 'greedy']
    >>> pool_run(np.array(['unknown', 'sampled'], dtype=object), np.array([-30.0, -1.0])).tolist()
    ['unknown', 'sampled']
    """
    kinds = np.asarray(kinds, dtype=object).copy()
    if (kinds == SAMPLED).any():
        return kinds
    open_ = kinds != SAMPLED
    if open_.any() and float(np.sum(np.asarray(log_p_top1, dtype=np.float64)[open_])) <= np.log(alpha):
        candidates = kinds == UNKNOWN
        kinds[candidates & (np.asarray(log_p_top1) < 0)] = GREEDY
    return kinds


def kind_codes(kinds: np.ndarray) -> np.ndarray:
    """Sampling kinds (names) as their codes in :data:`KINDS` (int8; any other name is unknown).

    >>> kind_codes(np.array(['sampled', 'greedy', 'unknown'], dtype=object)).tolist()
    [1, 0, 2]
    """
    kinds = np.asarray(kinds, dtype=object)
    out = np.full(kinds.shape, UNKNOWN_CODE, dtype=np.int8)
    for code, name in enumerate(KINDS[:UNKNOWN_CODE]):
        out[kinds == name] = code
    return out


def resolve_sampling(recorded: np.ndarray, override: np.ndarray, inferred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(sampling, source)`` per request: the first of recorded, override, inferred that is known.

    ``recorded`` / ``override`` are temperatures (NaN unknown; 0 greedy);
    ``inferred`` is :func:`infer_greedy`'s output.

    >>> s, src = resolve_sampling(np.array([0.7, np.nan, np.nan, np.nan]), np.array([0.0, 0.0, np.nan, np.nan]),
    ...                           np.array(['greedy', 'sampled', 'greedy', 'unknown'], dtype=object))
    >>> s.tolist(), src.tolist()
    (['sampled', 'greedy', 'greedy', 'unknown'], ['recorded', 'override', 'inferred', 'unknown'])
    """
    kind, source = resolve_sampling_codes(recorded, override, kind_codes(inferred))
    return _KIND_NAMES[kind], _SOURCE_NAMES[source]


def resolve_sampling_codes(recorded: np.ndarray, override: np.ndarray,
                           inferred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`resolve_sampling` in codes: ``inferred`` and the kinds as codes in :data:`KINDS`, the sources
    as codes in :data:`SOURCES` (int8 each).  A chunk's steps are resolved this way: names cost a Python
    object per step, to fill, compare and write (19 ms per 150k steps, against 1.8 ms in codes)."""
    recorded = np.asarray(recorded, dtype=np.float64)
    override = np.asarray(override, dtype=np.float64)
    has_recorded, has_override = ~np.isnan(recorded), ~np.isnan(override)
    unstated = ~(has_recorded | has_override)
    kind = (np.where(has_recorded, recorded, override) != 0.0).astype(np.int8)
    source = np.where(has_recorded, 0, 1).astype(np.int8)
    if unstated.any():
        from_tokens = np.asarray(inferred)[unstated]
        kind[unstated] = from_tokens
        source[unstated] = np.where(from_tokens != UNKNOWN_CODE, 2, 3)
    return kind, source
