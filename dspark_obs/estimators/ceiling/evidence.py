"""What the committed output says about each drafted position.

The tokens table holds, per request and output position, the committed token,
the target's logprob of it and the target's top-k logprobs.  For every draft
``d_k`` of every request-step this module finds the output position
(``first_pos + k - 1``) and returns, as ``[n, gamma]`` arrays:

* ``realised`` — the committed token there (``-1`` if the output has none);
* ``p_draft`` — the target's probability of the *draft* token there, when it is
  knowable: the realised token's logprob if ``d_k`` is the realised token, else
  its top-k logprob if ``d_k`` is in the top-k; NaN otherwise;
* ``p_topk`` / ``topk_state`` — the same from the top-k alone (state 0: no top-k
  at this position, 1: ``d_k`` in the top-k, 2: ``d_k`` below the top-k), which
  is what the acceptance model may look at without seeing the outcome.

Probabilities are at the request's temperature: SGLang 0.5.23 returns
temperature-scaled logprobs unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set
(``sglang/srt/layers/sampler.py``), and the emulator does the same.

Requests become integer codes, tokens are sorted by ``(code, pos)`` and looked up
by offset (a binary search for requests with gaps).  The target probabilities are
looked up only where a caller reads them (:func:`used_cells`: sampled steps'
verified drafts and censored steps' drafts), which is where the top-k comparison
is needed.

The lookups are compiled (numba): each cell takes a branch (gapless request or
search, a hit in the top-k or not, the realised token or the top-k's logprob), and
numpy needed several dozen passes over ``[steps, gamma]`` and ``[cells, k]`` arrays
for them: 88 against 20 ms for a chunk of 150k request-steps.  The kernels gather
values only; every probability is still ``numpy.exp`` of the stored logprob (the
same bits as the rest of the project).  numba is imported on the first lookup
(:mod:`~dspark_obs.estimators.compiled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs.acceptance import censored
from dspark_obs.estimators.compiled import jit
from dspark_obs.estimators.ceiling.walk import NO_TOKEN

__all__ = ["TokenIndex", "Evidence", "token_index", "draft_evidence", "padded_lists", "check_alignment", "Aligned",
           "align_requests", "MISALIGNED_SHARE", "used_cells"]


def padded_lists(column: pa.Array | pa.ChunkedArray, *, fill, dtype=None) -> np.ndarray:
    """A list column as a 2-D array padded with ``fill`` (null lists become all ``fill``); ``dtype``
    None keeps the values' own type (no widening copy of a large top-k)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    n = len(column)
    if n == 0:
        return np.full((0, 0), fill, dtype=dtype)
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    width = int(lengths.max()) if n else 0
    if width == 0:
        return np.full((n, 0), fill, dtype=dtype or column.type.value_type.to_pandas_dtype())
    values = pc.list_flatten(column)
    if values.null_count:
        values = pc.fill_null(values, fill)
    values = values.to_numpy(zero_copy_only=False)
    dtype = dtype or values.dtype
    if values.size == n * width:  # every list full (the usual case): no scatter needed
        return np.asarray(values, dtype=dtype).reshape(n, width)
    out = np.full((n, width), fill, dtype=dtype)
    rows = np.repeat(np.arange(n), lengths)
    starts = np.cumsum(lengths) - lengths
    cols = np.arange(len(values)) - np.repeat(starts, lengths)
    vals = np.asarray(values, dtype=dtype)
    out[rows, cols] = vals
    return out


@dataclass(frozen=True)
class TokenIndex:
    """Committed tokens sorted by ``key = code * stride + pos`` for vectorised lookup."""

    key: np.ndarray            # [t] int64, sorted
    stride: int
    token_id: np.ndarray       # [t] int64
    logprob: np.ndarray        # [t] float64 (NaN unknown)
    top_ids: np.ndarray        # [t, K] integer (-1 padding), as stored
    top_logprobs: np.ndarray   # [t, K] float (NaN padding), as stored: widened where looked up

    def find(self, code: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row of each ``(code, pos)`` and whether it exists (rows of misses are 0).

        A request whose positions are one run without gaps (the usual case) is looked up by
        arithmetic (its first row plus the offset from its first position); the others by a
        binary search of the sorted keys.  Both give the same rows.
        """
        code, pos = np.broadcast_arrays(np.asarray(code, dtype=np.int64), np.asarray(pos, dtype=np.int64))
        row, found = jit(_rows)(*self._lookup_arrays(), np.ascontiguousarray(code.reshape(-1)),
                                np.ascontiguousarray(pos.reshape(-1)), 1)
        return row.reshape(code.shape), found.reshape(code.shape)

    def _lookup_arrays(self) -> tuple:
        """``(key, stride, start, first, count, dense)``: what the compiled lookups read (:meth:`find`)."""
        if self.key.size == 0:
            return self.key, self.stride, *(np.zeros(1, np.int64),) * 3, np.ones(1, dtype=bool)
        return (self.key, self.stride, *self._runs)

    @cached_property
    def _runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per request code (plus an empty last slot): first row, first position, rows, and whether the
        positions are gapless."""
        codes = int(self.key[-1] // self.stride) + 1
        bounds = np.searchsorted(self.key, np.arange(codes + 1) * self.stride)
        start, count = bounds[:-1], np.diff(bounds)
        held = count > 0
        first = np.where(held, self.key[np.minimum(start, self.key.size - 1)] - np.arange(codes) * self.stride, 0)
        last = np.where(held, self.key[np.maximum(bounds[1:] - 1, 0)] - np.arange(codes) * self.stride, -1)
        dense = ~held | (last - first + 1 == count)
        return (np.append(start, 0), np.append(first, 0), np.append(np.where(held, count, 0), 0),
                np.append(dense, True))


def token_index(code: np.ndarray, pos: np.ndarray, token_id: np.ndarray, *,
                logprob: np.ndarray | None = None, top_ids: np.ndarray | None = None,
                top_logprobs: np.ndarray | None = None) -> TokenIndex:
    """Index the tokens table (arrays of one row per committed token; code = request code)."""
    code = np.asarray(code, dtype=np.int64)
    pos = np.asarray(pos, dtype=np.int64)
    t = code.size
    if t and (pos.min() < 0 or code.min() < 0):
        raise ValueError(f"token positions and request codes must be >= 0, got min pos {pos.min()}, "
                         f"min code {code.min()}")
    stride = int(pos.max()) + 1 if t else 1
    key = code * stride + pos
    logprob = np.full(t, np.nan) if logprob is None else np.asarray(logprob, dtype=np.float64)
    top_ids = np.full((t, 0), -1, np.int64) if top_ids is None else np.asarray(top_ids)
    top_lp = np.full((t, 0), np.nan) if top_logprobs is None else np.asarray(top_logprobs)
    top_ids = top_ids if top_ids.dtype.kind in "iu" else top_ids.astype(np.int64)
    top_lp = top_lp if top_lp.dtype.kind == "f" else top_lp.astype(np.float64)
    token_id = np.asarray(token_id, dtype=np.int64)
    if t and bool(np.all(key[1:] > key[:-1])):   # stored in request order (the usual case): nothing to move
        return TokenIndex(key=key, stride=stride, token_id=token_id, logprob=logprob, top_ids=top_ids,
                          top_logprobs=top_lp)
    order = np.argsort(key, kind="stable")
    if t and np.any(np.diff(key[order]) == 0):
        raise ValueError("the tokens table holds a (rid, pos) twice; collect the run again or "
                         "drop the duplicate part file")
    return TokenIndex(key=key[order], stride=stride, token_id=token_id[order],
                      logprob=logprob[order], top_ids=top_ids[order], top_logprobs=top_lp[order])


@dataclass(frozen=True)
class Evidence:
    """Per drafted position ``[n, gamma]``: see the module docstring."""

    realised: np.ndarray     # int64, NO_TOKEN where the output holds nothing
    p_draft: np.ndarray      # float64 target probability of the draft token, NaN unknown
    p_topk: np.ndarray       # float64, from the top-k only, NaN unless topk_state == 1
    topk_state: np.ndarray   # int8: 0 no top-k, 1 draft in top-k, 2 draft below top-k


def draft_evidence(index: TokenIndex, code: np.ndarray, first_pos: np.ndarray,
                   drafts: np.ndarray, *, cells: np.ndarray | None = None) -> Evidence:
    """Look up every draft's output position (``first_pos + k - 1``) in ``index``.

    ``code`` [n] is the request code of each step (``-1``: no tokens known),
    ``first_pos`` [n] the output position of ``d_1``, ``drafts`` [n, gamma].
    ``cells`` (bool [n, gamma], default all) are the drafts whose target
    probabilities are wanted (:func:`used_cells`); elsewhere ``p_draft`` and
    ``p_topk`` are NaN and ``topk_state`` 0, while ``realised`` is always whole.
    """
    drafts = np.ascontiguousarray(drafts, dtype=np.int64)
    n, gamma = drafts.shape
    code = np.ascontiguousarray(np.broadcast_to(np.asarray(code, dtype=np.int64), (n,)))
    first_pos = np.ascontiguousarray(np.broadcast_to(np.asarray(first_pos, dtype=np.int64), (n,)))
    cells = np.ones((n, gamma), dtype=bool) if cells is None else np.ascontiguousarray(cells, dtype=bool)
    row, found = jit(_rows)(*index._lookup_arrays(), code, first_pos, gamma)
    realised = np.where(found, index.token_id[row] if index.key.size else NO_TOKEN, NO_TOKEN).astype(np.int64)
    state, at, lp_draft, lp_top = jit(_top_hits)(index.token_id, index.logprob, index.top_ids, index.top_logprobs,
                                                 row.reshape(-1), found.reshape(-1), drafts.reshape(-1),
                                                 cells.reshape(-1))
    p_draft = np.full((n, gamma), np.nan)
    p_topk = np.full((n, gamma), np.nan)
    p_draft.reshape(-1)[at] = np.exp(lp_draft)
    p_topk.reshape(-1)[at] = np.exp(lp_top)
    return Evidence(realised=realised, p_draft=p_draft, p_topk=p_topk, topk_state=state.reshape(n, gamma))


def used_cells(window: np.ndarray, correct: np.ndarray, greedy: np.ndarray, gamma: int) -> np.ndarray:
    """``[n, gamma]`` drafts whose target probability the estimate or the fit reads: on sampled steps,
    the verified drafts (the fit: offsets up to the first rejection) and every draft of a censored step
    (the walk).  A greedy step is decided by equality alone."""
    window, correct = np.asarray(window, dtype=np.int64), np.asarray(correct, dtype=np.int64)
    offset = np.arange(1, gamma + 1)[None, :]
    verified = offset <= np.minimum(correct + 1, window)[:, None]
    return ~np.asarray(greedy, dtype=bool)[:, None] & (verified | censored(window, correct, gamma)[:, None])


def check_alignment(evidence: Evidence, drafts: np.ndarray, correct: np.ndarray,
                    bonus: np.ndarray) -> np.ndarray:
    """Per step: +1 the committed tokens agree with the tokens table, -1 they do not, 0 unknown.

    A step committed ``d_1..d_c`` and the bonus token at offsets ``1..c+1``; a
    wrong ``prompt_tokens`` (or a tokens table from another run) shifts every
    position and shows here.
    """
    drafts = np.ascontiguousarray(drafts, dtype=np.int64)
    n = drafts.shape[0]
    correct = np.ascontiguousarray(np.broadcast_to(np.asarray(correct, dtype=np.int64), (n,)))
    bonus = np.ascontiguousarray(np.broadcast_to(np.asarray(bonus, dtype=np.int64), (n,)))
    return jit(_alignment)(np.ascontiguousarray(evidence.realised, dtype=np.int64), drafts, correct, bonus)


MISALIGNED_SHARE = 0.2  # a request whose committed tokens disagree on more of its steps is walked without tokens


@dataclass(frozen=True)
class Aligned:
    """Evidence of some requests' steps and what the alignment check found (see :func:`align_requests`)."""

    evidence: Evidence
    misaligned: np.ndarray   # bool [n_requests + 1] (the last slot: steps without a rid, never misaligned)
    natural_end: np.ndarray  # bool [n] the request ended with EOS / stop, its tokens complete and aligned
    bad_steps: int
    checked_steps: int


def align_requests(index: TokenIndex, code: np.ndarray, n_requests: int, first_pos: np.ndarray, drafts: np.ndarray,
                   correct: np.ndarray, bonus: np.ndarray, *, token_counts: np.ndarray, completion: np.ndarray,
                   stop: np.ndarray, cells: np.ndarray | None = None) -> Aligned:
    """Evidence per drafted position (target probabilities at ``cells``, default all: see
    :func:`draft_evidence`), the requests whose tokens do not line up, and natural ends.

    ``code`` is each step's request code (-1: no rid), ``first_pos`` the
    output position of its ``d_1``; ``token_counts`` / ``completion`` /
    ``stop`` are per step: its request's tokens held, its completion_tokens
    (-1 unknown) and whether it finished with ``stop``.  A request whose
    committed tokens disagree with its tokens on more than 20% of its checked
    steps is walked without tokens.  Every decision is per request, so the
    offline estimator's chunks and the sidecar's live ceiling (one request at a
    time) get what one pass over the run would.
    """
    slot = np.where(code < 0, n_requests, code)
    evidence = draft_evidence(index, code, first_pos, drafts, cells=cells)
    aligned = check_alignment(evidence, drafts, correct, bonus)
    bad = np.bincount(slot[aligned < 0], minlength=n_requests + 1)
    checked = np.bincount(slot[aligned != 0], minlength=n_requests + 1)
    misaligned = (checked > 0) & (bad > MISALIGNED_SHARE * checked)
    misaligned[-1] = False
    if misaligned.any():
        evidence = draft_evidence(index, np.where(misaligned[slot], -1, code), first_pos, drafts, cells=cells)
    natural_end = np.asarray(stop, dtype=bool) & (np.asarray(token_counts) == np.asarray(completion)) & ~misaligned[slot]
    return Aligned(evidence, misaligned, natural_end, int(bad.sum()), int(checked.sum()))


# -- the compiled lookups (see the module docstring) ------------------------------------------------


def _rows(key, stride, start, first, count, dense, code, first_pos, width):
    """Row and presence of ``(code[i], first_pos[i] + j)`` for ``j < width``: ``[n, width]`` each.

    A request whose positions are one run without gaps (the usual case) is looked up by arithmetic (its
    first row plus the offset from its first position); the others by a binary search of the sorted keys.
    """
    n, last, t = code.size, count.size - 1, key.size
    row = np.zeros((n, width), np.int64)
    found = np.zeros((n, width), np.bool_)
    for i in range(n):
        c = code[i]
        for j in range(width):
            pos = first_pos[i] + j
            if t == 0 or pos < 0 or pos >= stride or c < 0:
                continue
            slot = c if c < last else last   # the last slot: no tokens
            if dense[slot]:
                off = pos - first[slot]
                if 0 <= off < count[slot]:
                    row[i, j], found[i, j] = start[slot] + off, True
                continue
            want, lo, hi = c * stride + pos, 0, t
            while lo < hi:
                mid = (lo + hi) >> 1
                if key[mid] < want:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < t and key[lo] == want:
                row[i, j], found[i, j] = lo, True
    return row, found


def _top_hits(token_id, logprob, top_ids, top_logprobs, row, found, drafts, cells):
    """Per wanted cell the output holds: its top-k state, and (as flat indices ``at``) the logprob of the
    draft (the realised token's if it is the draft, else the top-k's) and the top-k's alone (NaN: none)."""
    n, k = row.size, top_ids.shape[1]
    state = np.zeros(n, np.int8)
    at = np.empty(n, np.int64)
    lp_draft, lp_top = np.empty(n), np.empty(n)
    m = 0
    for i in range(n):
        if not (found[i] and cells[i]):
            continue
        r, d, top = row[i], drafts[i], np.nan
        has_top = False
        for q in range(k):
            if top_ids[r, q] >= 0:
                has_top = True
                break
        if has_top:
            state[i] = 2
            for q in range(k):
                if top_ids[r, q] == d:
                    top, state[i] = np.float64(top_logprobs[r, q]), 1
                    break
        real = logprob[r] if token_id[r] == d else np.nan
        at[m], lp_draft[m], lp_top[m] = i, top if np.isnan(real) else real, top
        m += 1
    return state, at[:m], lp_draft[:m], lp_top[:m]


def _alignment(realised, drafts, correct, bonus):
    """:func:`check_alignment` per step."""
    n, gamma = drafts.shape
    out = np.zeros(n, np.int8)
    for i in range(n):
        c, agree, known = correct[i], True, False
        for j in range(min(max(c, 0), gamma)):
            if realised[i, j] != NO_TOKEN:
                known = True
                agree &= realised[i, j] == drafts[i, j]
        b = realised[i, min(c, gamma - 1) % gamma]   # the bonus sits at offset correct + 1
        bonus_known = c < gamma and b != NO_TOKEN
        if bonus_known and b != bonus[i]:
            agree = False
        if known or bonus_known:
            out[i] = 1 if agree else -1
    return out

