"""The compiled loops against the same rules written as whole-array numpy (the oracles below).

Evidence: random token tables with gaps, missing top-k, padding and unknown requests; drafts that hit
the realised token, the top-k, or neither; windows and bonus tokens that agree with the output or not.
The walk: censored and uncensored steps whose output matches, parts from, or runs out before the drafts.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.estimators.ceiling.evidence import check_alignment, draft_evidence, token_index
from dspark_obs.acceptance import censored as censored_rule
from dspark_obs.estimators.ceiling.walk import (AT_END, DIVERGED, EOS, EXACT_IN_WINDOW, NO_TOKEN, RESOLVED_EXACT,
                                                ceiling_from_factors, sglang_interval, walk_blocks)


def _oracle(index, code, first_pos, drafts, cells, correct, bonus):
    """Evidence and alignment by whole-array numpy: searchsorted lookup, [cells, k] comparisons."""
    n, gamma = drafts.shape
    pos = first_pos[:, None] + np.arange(gamma)[None, :]
    codes = np.broadcast_to(code[:, None], pos.shape)
    want = np.where((pos >= 0) & (pos < index.stride) & (codes >= 0), codes * index.stride + pos, -1)
    at_key = np.clip(np.searchsorted(index.key, want), 0, max(index.key.size - 1, 0))
    found = (want >= 0) & (index.key[at_key] == want) if index.key.size else np.zeros(pos.shape, bool)
    realised = np.where(found, index.token_id[at_key] if index.key.size else NO_TOKEN, NO_TOKEN)
    p_draft, p_topk = np.full((n, gamma), np.nan), np.full((n, gamma), np.nan)
    state = np.zeros((n, gamma), np.int8)
    rows, draft, sel = at_key[found & cells], drafts[found & cells], found & cells
    top = np.full(rows.size, np.nan)
    if index.top_ids.shape[1] and rows.size:
        ids = index.top_ids[rows]
        has_top = (ids >= 0).any(axis=1)
        hit = (ids == draft[:, None]) & has_top[:, None]
        in_top = hit.any(axis=1)
        top = np.where(in_top, np.exp(index.top_logprobs[rows, hit.argmax(axis=1)].astype(np.float64)), np.nan)
        p_topk[sel] = top
        state[sel] = np.where(in_top, 1, np.where(has_top, 2, 0))
    p_real = np.where(index.token_id[rows] == draft, np.exp(index.logprob[rows]), np.nan) if rows.size else top
    p_draft[sel] = np.where(np.isnan(p_real), top, p_real)
    offset = np.arange(1, gamma + 1)[None, :]
    known = (offset <= correct[:, None]) & (realised != NO_TOKEN)
    agree = np.where(known, realised == drafts, True).all(axis=1)
    bonus_real = realised[np.arange(n), np.minimum(correct, gamma - 1)]
    bonus_known = (correct < gamma) & (bonus_real != NO_TOKEN)
    agree &= ~bonus_known | (bonus_real == bonus)
    aligned = np.where(known.any(axis=1) | bonus_known, np.where(agree, 1, -1), 0)
    return realised, p_draft, p_topk, state, aligned


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(0, 4), gamma=st.integers(1, 7), narrow=st.booleans())
def test_compiled_lookups_give_what_whole_array_numpy_gives(seed, k, gamma, narrow):
    rng = np.random.default_rng(seed)
    codes, pos = [], []
    for c in range(int(rng.integers(0, 12))):
        p = np.arange(int(rng.integers(0, 25))) + int(rng.integers(0, 3))
        if rng.random() < 0.4 and p.size > 3:
            p = np.delete(p, rng.integers(1, p.size - 1, 2))           # a request with gaps
        codes += [c] * p.size
        pos += p.tolist()
    t = len(codes)
    vocab = 8                                                          # few token ids: hits are common
    token_id = rng.integers(0, vocab, t)
    top = rng.integers(-1, vocab, (t, k))                              # -1: padding
    top[rng.random(t) < 0.2] = -1                                      # no top-k at some positions
    dtype = (np.int32, np.float32) if narrow else (np.int64, np.float64)
    logprob = np.where(rng.random(t) < 0.1, np.nan, np.log(rng.uniform(0.05, 1, t)))
    order = rng.permutation(t)                                         # stored out of order
    index = token_index(np.array(codes, np.int64)[order], np.array(pos, np.int64)[order], token_id[order],
                        logprob=logprob[order], top_ids=top.astype(dtype[0])[order],
                        top_logprobs=np.log(rng.uniform(0.01, 1, (t, k))).astype(dtype[1])[order])
    n = int(rng.integers(0, 40))
    code = rng.integers(-1, 14, n)
    first = rng.integers(-2, 30, n)
    drafts = np.where(rng.random((n, gamma)) < 0.1, -1, rng.integers(0, vocab, (n, gamma)))
    cells = rng.random((n, gamma)) < 0.7
    correct = rng.integers(-1, gamma + 1, n)
    bonus = rng.integers(0, vocab, n)

    want = _oracle(index, code, first, drafts, cells, correct, bonus)
    ev = draft_evidence(index, code, first, drafts, cells=cells)
    got = (ev.realised, ev.p_draft, ev.p_topk, ev.topk_state, check_alignment(ev, drafts, correct, bonus))
    for name, a, b in zip(("realised", "p_draft", "p_topk", "topk_state", "aligned"), got, want):
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), name


def test_an_empty_token_table_holds_nothing_and_finds_nothing():
    index = token_index(np.zeros(0), np.zeros(0), np.zeros(0))
    ev = draft_evidence(index, np.array([0, -1]), np.array([0, 3]), np.array([[1, 2], [3, 4]]))
    assert (ev.realised == NO_TOKEN).all() and np.isnan(ev.p_draft).all() and (ev.topk_state == 0).all()
    assert check_alignment(ev, np.array([[1, 2], [3, 4]]), np.array([1, 2]), np.array([5, 6])).tolist() == [0, 0]


def _walk_oracle(drafts, window, correct, realised, natural_end):
    """The walk by whole-array numpy: reach offset k while every tail offset before it matched."""
    n, gamma = drafts.shape
    offset = np.arange(1, gamma + 1)[None, :]
    censored = censored_rule(window, correct, gamma)
    tail = censored[:, None] & (offset > window[:, None])
    avail = realised != NO_TOKEN
    eq = avail & (drafts == realised)
    reach = np.ones_like(tail)
    reach[:, 1:] = np.logical_and.accumulate(np.where(tail, eq, True), axis=1)[:, :-1]
    reach &= tail
    walked = reach & avail
    diverged, ran_out = walked & ~eq, reach & ~avail
    div_off = np.where(diverged.any(axis=1), diverged.argmax(axis=1) + 1, 0)
    out_off = np.where(ran_out.any(axis=1), ran_out.argmax(axis=1) + 1, 0)
    category = np.full(n, EXACT_IN_WINDOW, dtype=np.int8)
    category[censored] = RESOLVED_EXACT
    category[censored & (div_off > 0) & (div_off < gamma)] = DIVERGED
    category[censored & (out_off > 0) & natural_end] = EOS
    category[censored & (out_off > 0) & ~natural_end] = AT_END
    unverifiable = (((category == DIVERGED)[:, None] & (offset > div_off[:, None]))
                    | ((category == AT_END)[:, None] & (offset >= out_off[:, None])))
    return censored, category, walked, walked & eq, unverifiable, np.maximum(div_off, out_off)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), gamma=st.integers(1, 8), n=st.integers(0, 60))
def test_compiled_walk_gives_what_whole_array_numpy_gives(seed, gamma, n):
    rng = np.random.default_rng(seed)
    window = rng.integers(0, gamma + 1, n)
    correct = np.where(rng.random(n) < 0.6, window, rng.integers(0, gamma + 1, n) % (window + 1))
    drafts = rng.integers(0, 4, (n, gamma))
    realised = np.where(rng.random((n, gamma)) < 0.75, drafts, rng.integers(0, 4, (n, gamma)))
    realised[rng.random((n, gamma)) < 0.1] = NO_TOKEN
    natural_end = rng.random(n) < 0.5
    walk = walk_blocks(drafts, window, correct, realised, natural_end)
    want = _walk_oracle(drafts, window, correct, realised, natural_end)
    got = (walk.censored, walk.category, walk.walked, walk.matched, walk.unverifiable, walk.stop_offset)
    for name, a, b in zip(("censored", "category", "walked", "matched", "unverifiable", "stop_offset"), got, want):
        assert a.shape == b.shape and np.array_equal(a, b), name



def _chain_oracle(factors, mask):
    cum = np.cumprod(np.where(mask, factors, 1.0), axis=1)
    return np.where(mask, cum, 0.0).sum(axis=1), cum[:, -1] if len(cum) else np.ones(0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), gamma=st.integers(1, 7), n=st.integers(0, 50))
def test_compiled_chain_gives_the_ceiling_numpy_s_products_and_row_sums_give(seed, gamma, n):
    """``w + sum_walked prod a + prod_walked a * sum_unverifiable prod tail``, the chains as numpy's cumprod
    and row sums give them (bit for bit below eight offsets)."""
    rng = np.random.default_rng(seed)
    window = rng.integers(0, gamma + 1, n)
    walk = walk_blocks(rng.integers(0, 3, (n, gamma)), window, np.where(rng.random(n) < 0.7, window, 0),
                       rng.integers(-1, 3, (n, gamma)), rng.random(n) < 0.5)
    a, tail = rng.random((n, gamma)), rng.random((n, gamma))
    extra, prod = _chain_oracle(a, walk.walked)
    rest, _ = _chain_oracle(tail, walk.unverifiable)
    want = np.where(walk.censored, walk.window + extra + prod * rest, walk.correct).astype(np.float64)
    assert np.array_equal(ceiling_from_factors(walk, a, tail=tail), want)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), gamma=st.integers(1, 7), n=st.integers(0, 50))
def test_compiled_interval_gives_the_ceilings_of_a_zero_and_a_full_tail(seed, gamma, n):
    """SGLang's rule: ``lo`` the ceiling with nothing unverifiable accepted, ``hi`` that plus the walked
    product per unverifiable offset; bit for bit the whole-array chains' figures, NaN factors included."""
    rng = np.random.default_rng(seed)
    window = rng.integers(0, gamma + 1, n)
    walk = walk_blocks(rng.integers(0, 3, (n, gamma)), window, np.where(rng.random(n) < 0.7, window, 0),
                       rng.integers(-1, 3, (n, gamma)), rng.random(n) < 0.5)
    a = np.where(rng.random((n, gamma)) < 0.1, np.nan, rng.random((n, gamma)))
    extra, prod = _chain_oracle(a, walk.walked)
    lo = np.where(walk.censored, walk.window + extra + prod * 0.0, walk.correct).astype(np.float64)
    hi = np.where(walk.censored, lo + prod * walk.unverifiable.sum(axis=1), lo)
    got = sglang_interval(walk, a)
    for name, x, y in zip(("lo", "mid", "hi"), got, (lo, 0.5 * (lo + hi), hi)):
        assert np.array_equal(x, y, equal_nan=True), name


def test_a_loop_that_cannot_be_cached_is_still_compiled(monkeypatch):
    """A read-only install with a read-only home leaves numba nowhere to cache: the loop is compiled anyway."""
    import numba

    from dspark_obs.estimators import compiled

    real = numba.njit

    def no_locator(*args, cache=False, **kwargs):
        if cache:
            raise RuntimeError("cannot cache function: no locator available")
        return real(*args, **kwargs)

    def twice(x):
        return 2 * x

    monkeypatch.setattr(numba, "njit", no_locator)
    assert compiled.jit(twice)(21) == 42 and compiled.jit(twice) is compiled.jit(twice)
