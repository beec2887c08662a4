"""Tests for the block-accept (ceiling) estimator's pure functions.

Hand-computed cases for every category and for the greedy / temperature rules,
SGLang's interval rule against a line-by-line port of its analyzer, invariances,
empty inputs and input errors.  The store / CLI layer is in test_ceiling_run.py,
the emulator acceptance criteria in test_ceiling_emulator.py, and real-SGLang
sampling semantics in test_ceiling_sampling.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dspark_obs.estimators.ceiling import estimate_ceiling
from dspark_obs.estimators.ceiling.evidence import (
    Evidence, check_alignment, draft_evidence, token_index,
)
from dspark_obs.estimators.ceiling.jsonl import logprobs_from_sglang_jsonl
from dspark_obs.estimators.ceiling.prior import AcceptanceModel, fit_acceptance_model
from dspark_obs.estimators.ceiling.stats import summarize
from dspark_obs.estimators.ceiling.validation import _from_sums, equal_count_bins, stat_sums, validate, validate_parts
from dspark_obs.estimators.ceiling.walk import CATEGORIES, sglang_interval, walk_blocks

NAN = math.nan
G = 4  # gamma of the hand-computed cases


def _raw_head(gamma: int = G) -> AcceptanceModel:
    """A model that returns the head's confidence unchanged (for hand computation)."""
    return AcceptanceModel(gamma=gamma, draft_coef=None, prior_coef={True: None, False: None},
                           base_rate={True: 0.5, False: 0.5}, n_train={True: 0, False: 0})


def _ev(realised, p_draft=None) -> Evidence:
    realised = np.atleast_2d(np.asarray(realised, dtype=np.int64))
    p = np.full(realised.shape, NAN) if p_draft is None else np.atleast_2d(np.asarray(p_draft, dtype=float))
    return Evidence(realised=realised, p_draft=p, p_topk=np.full(realised.shape, NAN),
                    topk_state=np.zeros(realised.shape, np.int8))


def _one(drafts, window, correct, realised, *, greedy=True, eos=False, conf=None, p=None, q=None,
         method="default"):
    est = estimate_ceiling(np.array([drafts]), np.array([window]), np.array([correct]), _ev(realised, p),
                           greedy=np.array([greedy]), natural_end=np.array([eos]),
                           confidence=None if conf is None else np.array([conf]),
                           q_draft=None if q is None else np.array([q]), method=method, model=_raw_head())
    return est.category[0], float(est.lo[0]), float(est.mid[0]), float(est.hi[0])


# -- categories and the greedy rule ------------------------------------------------------

D = [5, 6, 7, 8]


def test_uncensored_step_is_exact_in_window():
    assert _one(D, 3, 1, [5, 9, -1, -1]) == ("exact_in_window", 1.0, 1.0, 1.0)
    assert _one(D, 4, 4, [5, 6, 7, 8]) == ("exact_in_window", 4.0, 4.0, 4.0)  # full window: nothing hidden


def test_greedy_tail_matching_to_gamma_is_resolved_exact():
    assert _one(D, 1, 1, [5, 6, 7, 8]) == ("censored_resolved_exact", 4.0, 4.0, 4.0)


def test_greedy_divergence_rejects_the_draft_and_ends_the_block():
    # d_2 equals the realised token (accepted), d_3 does not (rejected): exactly 2.
    assert _one(D, 1, 1, [5, 6, 9, 8]) == ("censored_diverged", 2.0, 2.0, 2.0)


def test_divergence_at_gamma_counts_as_resolved_like_sglang():
    assert _one(D, 1, 1, [5, 6, 7, 9]) == ("censored_resolved_exact", 3.0, 3.0, 3.0)


def test_window_zero_is_censored():
    assert _one(D, 0, 0, [5, 9, 7, 8]) == ("censored_diverged", 1.0, 1.0, 1.0)


def test_greedy_eos_accepts_nothing_past_the_end():
    # Output ends after d_2's position with EOS: hi = lo.
    assert _one(D, 1, 1, [5, 6, -1, -1], eos=True) == ("censored_eos", 2.0, 2.0, 2.0)


def test_greedy_length_cut_leaves_an_interval_up_to_gamma():
    cat, lo, mid, hi = _one(D, 1, 1, [5, 6, -1, -1], eos=False, conf=[0.9, 0.8, 0.5, 0.4])
    assert (cat, lo, hi) == ("censored_at_end", 2.0, 4.0)
    assert mid == pytest.approx(2 + 0.5 + 0.5 * 0.4)  # the head's conditional confidences for d_3, d_4


def test_missing_tokens_are_at_end_not_eos():
    assert _one(D, 2, 2, [-1, -1, -1, -1], eos=False)[0] == "censored_at_end"


# -- temperature rules ------------------------------------------------------------------------

P = [NAN, 0.5, 0.4, 0.3]
Q = [NAN, 0.5, 0.8, 0.6]   # a_2 = 1, a_3 = 0.5, a_4 = 0.5


def test_sglang_rule_with_known_p_and_q():
    # walk: d_2 matches (a=1: extra 1), d_3 diverges (a=.5: prod .5, extra 1.5); tail .5 * (4 - 3)
    cat, lo, mid, hi = _one(D, 1, 1, [5, 6, 9, 8], greedy=False, p=P, q=Q, method="sglang")
    assert (cat, lo, hi, mid) == ("censored_diverged", 2.5, 3.0, 2.75)


def test_default_with_known_q_keeps_sglang_bounds_and_uses_the_head_for_the_tail():
    cat, lo, mid, hi = _one(D, 1, 1, [5, 6, 9, 8], greedy=False, p=P, q=Q, conf=[0.9, 0.8, 0.7, 0.6])
    assert (lo, hi) == (2.5, 3.0)
    assert mid == pytest.approx(2.5 + 0.5 * 0.6)


def test_sglang_rule_at_end_and_eos():
    # Output ends after d_2 (matched, a=1): at end tail = prod * (4 - 3 + 1); at EOS hi = lo.
    assert _one(D, 1, 1, [5, 6, -1, -1], greedy=False, p=P, q=Q, method="sglang") == (
        "censored_at_end", 2.0, 3.0, 4.0)
    assert _one(D, 1, 1, [5, 6, -1, -1], greedy=False, p=P, q=Q, eos=True, method="sglang") == (
        "censored_eos", 2.0, 2.0, 2.0)


def test_sglang_rule_without_q_uses_the_confidence_as_acceptance():
    cat, lo, mid, hi = _one(D, 1, 1, [5, 6, 7, 8], greedy=False, conf=[0.9, 0.8, 0.5, 0.5], method="sglang")
    assert lo == hi == pytest.approx(1 + 0.8 + 0.4 + 0.2)


def test_default_without_q_bounds_hold_for_any_drafter():
    # p(d_2) = .5 known (realised), d_3 diverges with p unknown: a_2 in [.5, 1], a_3 in [0, 1].
    cat, lo, mid, hi = _one(D, 1, 1, [5, 6, 9, 8], greedy=False, p=[NAN, 0.5, NAN, NAN],
                            conf=[0.9, 0.8, 0.3, 0.6])
    assert cat == "censored_diverged"
    assert lo == pytest.approx(1 + 0.5)                  # d_3 may be rejected for sure
    assert hi == pytest.approx(4.0)                      # q unknown: every draft may be accepted
    # mid: a_2 = c_2 = .8 (>= p), a_3 = c_3 = .3, then d_4 with c_4 = .6 after the divergence
    assert mid == pytest.approx(1 + 0.8 + 0.8 * 0.3 + 0.8 * 0.3 * 0.6)


def test_default_mid_never_below_the_target_probability():
    # A head that says .2 for a draft the target gives .9: a = min(1, p/q) >= p = .9.
    _, lo, mid, hi = _one(D, 3, 3, [5, 6, 7, 8], greedy=False, p=[NAN, NAN, NAN, 0.9], conf=[0.9] * 3 + [0.2])
    assert lo == pytest.approx(3.9) and mid == pytest.approx(3.9) and hi == 4.0


# -- SGLang fidelity: the analyzer's evaluate_block, ported line by line --------------------

def _analyzer(drafts, realised, a, w, gamma, eos):
    """SGLang's block-accept analyzer ``evaluate_block`` (acc_len units), one block."""
    base, prod, lo_extra, tail, category = w + 1.0, 1.0, 0.0, 0.0, "censored_resolved_exact"
    for offset in range(w + 1, gamma + 1):
        if realised[offset - 1] < 0:  # no pg entry for this offset
            category = "censored_eos" if eos else "censored_at_end"
            tail = 0.0 if eos else prod * (gamma - offset + 1)
            break
        prod *= a[offset - 1]
        lo_extra += prod
        if drafts[offset - 1] != realised[offset - 1]:
            if offset < gamma:
                category, tail = "censored_diverged", prod * (gamma - offset)
            break
    return base + lo_extra, base + lo_extra + tail, category


def test_sglang_interval_matches_the_analyzer_on_random_blocks():
    rng = np.random.default_rng(3)
    n, gamma = 3000, 6
    drafts = rng.integers(0, 3, size=(n, gamma))
    realised = np.where(rng.random((n, gamma)) < 0.7, drafts, rng.integers(0, 3, size=(n, gamma)))
    cut = rng.integers(0, gamma + 3, size=n)            # the output ends somewhere (or not)
    realised = np.where(np.arange(gamma)[None] >= cut[:, None], -1, realised)
    window = rng.integers(0, gamma, size=n)
    eos = rng.random(n) < 0.5
    a = rng.random((n, gamma))
    walk = walk_blocks(drafts, window, window, realised, eos)
    lo, mid, hi = sglang_interval(walk, a)
    for i in range(n):
        ref_lo, ref_hi, ref_cat = _analyzer(drafts[i], realised[i], a[i], window[i], gamma, eos[i])
        assert (lo[i] + 1, hi[i] + 1, CATEGORIES[walk.category[i]]) == pytest.approx((ref_lo, ref_hi, ref_cat)), i
        assert mid[i] == pytest.approx((lo[i] + hi[i]) / 2)


# -- invariances -------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["default", "sglang"])
def test_invariances_on_random_steps(method):
    rng = np.random.default_rng(7)
    n, gamma = 2000, 6
    drafts = rng.integers(0, 4, size=(n, gamma))
    window = rng.integers(0, gamma + 1, size=n)
    correct = np.minimum(window, rng.integers(0, gamma + 1, size=n))
    realised = np.where(rng.random((n, gamma)) < 0.6, drafts, rng.integers(0, 4, size=(n, gamma)))
    realised = np.where(rng.random((n, gamma)) < 0.1, -1, realised)
    p = np.where(rng.random((n, gamma)) < 0.5, rng.random((n, gamma)), NAN)
    q = np.where(rng.random((n, gamma)) < 0.3, rng.random((n, gamma)), NAN)
    ev = Evidence(realised=realised, p_draft=p, p_topk=np.where(rng.random((n, gamma)) < .5, p, NAN),
                  topk_state=rng.integers(0, 3, size=(n, gamma)).astype(np.int8))
    greedy = rng.random(n) < 0.3
    est = estimate_ceiling(drafts, window, correct, ev, greedy=greedy, natural_end=rng.random(n) < .5,
                           confidence=rng.random((n, gamma)), q_draft=q, method=method)
    assert np.all(est.lo <= est.mid + 1e-12) and np.all(est.mid <= est.hi + 1e-12)
    assert np.all(est.lo >= 0) and np.all(est.hi <= gamma)
    unc = ~est.walk.censored
    assert np.array_equal(est.lo[unc], correct[unc]) and np.array_equal(est.hi[unc], correct[unc])
    assert np.all(est.lo[est.walk.censored] >= window[est.walk.censored])   # the window was accepted
    exact = greedy & (est.walk.category != CATEGORIES.index("censored_at_end"))
    assert np.array_equal(est.lo[exact], est.hi[exact])                      # greedy is exact inside the output


def test_empty_input_gives_empty_results():
    ev = _ev(np.zeros((0, G), dtype=np.int64))
    est = estimate_ceiling(np.zeros((0, G), np.int64), np.zeros(0), np.zeros(0), ev, greedy=np.zeros(0, bool),
                           natural_end=np.zeros(0, bool))
    assert est.lo.shape == est.mid.shape == est.hi.shape == (0,)
    assert summarize(np.zeros(0), np.zeros(0), acc_len=np.zeros(0), window=np.zeros(0), censored=np.zeros(0, bool),
                     lo=np.zeros(0), mid=np.zeros(0), hi=np.zeros(0)) == []
    assert validate(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), censored=np.zeros(0, bool),
                    category=np.zeros(0), workload=np.zeros(0), greedy=np.zeros(0, bool)) == []
    assert token_index(np.zeros(0), np.zeros(0), np.zeros(0)).find(np.array([0]), np.array([0]))[1].tolist() == [False]


# -- input errors --------------------------------------------------------------------------------

def test_bad_inputs_name_the_problem():
    ev = _ev([[5, 6, 7, 8]])
    kw = dict(greedy=np.array([True]), natural_end=np.array([False]))
    with pytest.raises(ValueError, match=r"0 <= correct_drafts <= window <= gamma=4.*correct_drafts=3, window=2"):
        estimate_ceiling(np.array([D]), np.array([2]), np.array([3]), ev, **kw)
    with pytest.raises(ValueError, match=r"method 'best' is not one of default, sglang"):
        estimate_ceiling(np.array([D]), np.array([2]), np.array([1]), ev, method="best", **kw)
    with pytest.raises(ValueError, match=r"drafts must be a 2-D array"):
        estimate_ceiling(np.array(D), np.array([2]), np.array([1]), ev, **kw)
    with pytest.raises(ValueError, match=r"confidence has shape \(1, 3\), expected \(1, 4\)"):
        estimate_ceiling(np.array([D]), np.array([2]), np.array([1]), ev, confidence=np.ones((1, 3)), **kw)
    with pytest.raises(ValueError, match=r"holds a \(rid, pos\) twice"):
        token_index(np.array([0, 0]), np.array([3, 3]), np.array([1, 2]))
    with pytest.raises(ValueError, match=r"must be >= 0"):
        token_index(np.array([0]), np.array([-1]), np.array([1]))


# -- evidence: positions, the prefill token, top-k, alignment --------------------------------

def _tokens():
    # request 0: output positions 0..5 (0 = the prefill token), top-2 at every position
    ids = np.array([100, 11, 12, 13, 14, 2])
    top = np.stack([ids, ids + 1000], axis=1)
    top_lp = np.log(np.tile([0.6, 0.3], (6, 1)))
    return token_index(np.zeros(6), np.arange(6), ids, logprob=np.log(np.full(6, 0.6)), top_ids=top,
                       top_logprobs=top_lp)


def test_first_draft_sits_after_the_prefill_token():
    # First decode step: prefix_len = prompt_tokens, so first_pos = 1 (position 0 is the prefill token).
    ev = draft_evidence(_tokens(), np.array([0]), np.array([1]), np.array([[11, 1012, 77, 1014]]))
    assert ev.realised.tolist() == [[11, 12, 13, 14]]
    assert ev.topk_state.tolist() == [[1, 1, 2, 1]]            # 1012, 1014 are in the top-2; 77 is not
    np.testing.assert_allclose(ev.p_draft, [[0.6, 0.3, NAN, 0.3]])
    np.testing.assert_allclose(ev.p_topk, [[0.6, 0.3, NAN, 0.3]])


def test_positions_past_the_output_and_unknown_requests_have_no_token():
    ev = draft_evidence(_tokens(), np.array([0, -1]), np.array([4, 1]), np.array([[14, 2, 5, 5]] * 2))
    assert ev.realised.tolist() == [[14, 2, -1, -1], [-1, -1, -1, -1]]


def test_alignment_check_catches_a_shifted_prompt_length():
    drafts = np.array([[11, 12, 50, 50]])
    good = draft_evidence(_tokens(), np.array([0]), np.array([1]), drafts)
    shifted = draft_evidence(_tokens(), np.array([0]), np.array([2]), drafts)
    assert check_alignment(good, drafts, np.array([2]), np.array([13])).tolist() == [1]
    assert check_alignment(shifted, drafts, np.array([2]), np.array([13])).tolist() == [-1]


# -- acceptance model ------------------------------------------------------------------------

def test_acceptance_model_recovers_an_over_confident_head():
    rng = np.random.default_rng(0)
    n, gamma = 6000, 4
    c_true = rng.uniform(0.2, 0.95, size=(n, gamma))
    head = 1 / (1 + np.exp(-(np.log(c_true / (1 - c_true)) / 0.6)))   # over-confident, T = 0.6
    accepted = rng.random((n, gamma)) < c_true
    correct = np.cumprod(accepted, axis=1).sum(axis=1)
    model = fit_acceptance_model(head, np.full(n, gamma), correct, np.zeros(n, bool),
                                 p_topk=np.full((n, gamma), NAN), topk_state=np.zeros((n, gamma), np.int8))
    fitted = model.prior(head, np.zeros(n, bool))
    assert np.abs(fitted - c_true).mean() < 0.5 * np.abs(head - c_true).mean()


def test_acceptance_model_without_data_keeps_the_head():
    model = fit_acceptance_model(np.full((3, 2), 0.7), np.zeros(3), np.zeros(3), np.zeros(3, bool),
                                 p_topk=np.full((3, 2), NAN), topk_state=np.zeros((3, 2), np.int8))
    assert model.prior_coef[False] is None
    np.testing.assert_allclose(model.prior(np.array([[0.7, NAN]]), np.array([False])), [[0.7, 0.5]])


# -- summaries ------------------------------------------------------------------------------

def test_equal_count_bins_have_sizes_within_one():
    bins = equal_count_bins(np.random.default_rng(1).random(1003))
    sizes = np.bincount(bins)
    assert len(sizes) == 8 and sizes.max() - sizes.min() <= 1
    assert equal_count_bins(np.array([3.0, 1.0, 2.0]), 8).tolist() == [2, 0, 1]


def _stable_sort_bins(values: np.ndarray, n_bins: int) -> np.ndarray:
    """The bins as first written: a stable sort cut into equal parts."""
    out = np.empty(values.size, dtype=np.int64)
    for b, part in enumerate(np.array_split(np.argsort(values, kind="stable"), max(1, min(n_bins, values.size)))):
        out[part] = b
    return out


@pytest.mark.parametrize("seed, kind", list(enumerate(["uniform", "integers", "rounded", "ints", "nan"])))
def test_equal_count_bins_are_the_stable_sort_cut_in_parts(seed, kind):
    rng = np.random.default_rng(seed)   # str hashes differ between processes: a fixed seed per kind
    for _ in range(60):
        n, n_bins = int(rng.integers(0, 200)), int(rng.integers(1, 12))
        values = {"uniform": rng.random(n), "integers": rng.integers(0, 4, n).astype(float),
                  "rounded": np.round(rng.random(n), 1), "ints": rng.integers(0, 3, n),
                  "nan": np.where(rng.random(n) < 0.1, NAN, rng.integers(0, 3, n))}[kind]
        assert equal_count_bins(values, n_bins).tolist() == _stable_sort_bins(values, n_bins).tolist()


def _sums_of_mask(lo, mid, hi, truth, emu, mask, greedy) -> dict:
    """The validation's sums over ``mask``, each written out: counts, bounds, truth, bias; MAE and coverage over
    the greedy steps with a truth; the same against the emulator's expectation over every step that has one."""
    t, e = mask & ~np.isnan(truth), mask & ~np.isnan(emu)
    x, g = truth[t], t & greedy
    ok_t = (lo[g] <= truth[g] + 1e-9) & (truth[g] <= hi[g] + 1e-9)
    ok_e = (lo[e] <= emu[e] + 1e-6) & (emu[e] <= hi[e] + 1e-6)
    return {"n": int(t.sum()), "coverage_n": int(g.sum()), "coverage": int(ok_t.sum()), "lo": lo[t].sum(),
            "mid": mid[t].sum(), "hi": hi[t].sum(), "truth": x.sum(), "bias": (mid[t] - x).sum(),
            "mae": np.abs(mid[g] - truth[g]).sum(), "emu_n": int(e.sum()), "emu_coverage": int(ok_e.sum()),
            "emu_lo": lo[e].sum(), "emu_mid": mid[e].sum(), "emu_hi": hi[e].sum(), "emu": emu[e].sum(),
            "emu_bias": (mid[e] - emu[e]).sum(), "emu_mae": np.abs(mid[e] - emu[e]).sum()}


def _validate_by_masks(all_steps, lo, mid, hi, truth, emu, *, category, workload, greedy) -> list[dict]:
    """validate_parts as first written: one mask and its sums, written out, per group."""
    def stats(mask):
        return _from_sums(_sums_of_mask(lo, mid, hi, truth, emu, mask, greedy))

    rows = [{"group_kind": "all_steps", "group": "*", **_from_sums(all_steps)},
            {"group_kind": "overall", "group": "*", **stats(np.ones(lo.size, dtype=bool))}]
    sampling = np.array(["temperature", "greedy"], dtype=object)[greedy.astype(np.intp)]
    for kind, labels in (("sampling", sampling), ("category", category), ("workload", workload)):
        text = np.array([str(x) for x in labels], dtype=object)
        for name in sorted(set(text)):
            rows.append({"group_kind": kind, "group": name, **stats(text == name)})
    bins = equal_count_bins(mid)
    for b in range(int(bins.max()) + 1 if lo.size else 0):
        rows.append({"group_kind": "bin", "group": str(b), "bin": b, **stats(bins == b)})
    return rows


def _same_sums(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key] == (pytest.approx(value, rel=1e-12, abs=1e-9, nan_ok=True)
                            if isinstance(value, float) else value), key


def _same_validation(got: list[dict], want: list[dict]) -> None:
    """The same groups, counts and labels; means to the rounding of sums added in another order."""
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for g, w in zip(got, want):
        for key, value in w.items():
            assert g[key] == (pytest.approx(value, rel=1e-12, abs=1e-9, nan_ok=True)
                              if isinstance(value, float) else value), key


def test_validation_groups_are_the_sums_of_one_mask_per_group():
    """Grouped in one pass (every grouping summed by code, a block of steps at a time), each group has the
    sums of its own mask: the same counts, means to the last bits."""
    rng = np.random.default_rng(7)
    for n in [1, 2, 5, 9, 40, 3000] * 4 + [150_000]:   # the last: three blocks of steps
        lo = rng.random(n) * 3
        mid = np.where(rng.random(n) < 0.5, np.floor(lo + rng.random(n)), lo + rng.random(n))
        hi = mid + rng.random(n)
        if n == 40:   # a bound that is not a number spoils its own groups' sums only
            hi[rng.integers(0, n)] = NAN
        truth = np.where(rng.random(n) < rng.choice([0.0, 0.3, 1.0]), NAN, rng.integers(0, 7, n).astype(float))
        emu = np.where(rng.random(n) < rng.choice([0.0, 0.5, 1.0]), NAN, rng.random(n) * 6)
        codes = rng.integers(0, len(CATEGORIES), n)
        workload = np.array(["gsm8k", "poetry", 1, "1"], dtype=object)[rng.integers(0, 4, n)]
        greedy = rng.random(n) < 0.5
        all_steps = stat_sums(lo, mid, hi, truth, emu, np.ones(n, dtype=bool), greedy)
        _same_sums(all_steps, _sums_of_mask(lo, mid, hi, truth, emu, np.ones(n, dtype=bool), greedy))
        if not (all_steps["n"] or all_steps["emu_n"]):
            continue
        labels = np.asarray(CATEGORIES, dtype=object)[codes]
        want = _validate_by_masks(all_steps, lo, mid, hi, truth, emu, category=labels, workload=workload,
                                  greedy=greedy)
        _same_validation(validate_parts(all_steps, lo, mid, hi, truth, emu, category=labels, workload=workload,
                                        greedy=greedy), want)
        _same_validation(validate_parts(all_steps, lo, mid, hi, truth, emu, category=codes,
                                        category_names=CATEGORIES, workload=workload, greedy=greedy), want)


def test_summary_means_ratio_and_seeded_bootstrap():
    req = np.array([0, 0, 1, 1, 2])
    kw = dict(acc_len=np.array([2, 4, 1, 3, 5.0]), window=np.array([2, 3, 1, 2, 4]),
              censored=np.array([True, False, False, True, True]), lo=np.array([1, 3, 0, 2, 4.0]),
              mid=np.array([2, 3, 0, 2, 5.0]), hi=np.array([3, 3, 0, 2, 6.0]))
    rows = summarize(req, np.array(["a", "a", "b", "b", "a"], dtype=object), seed=1, n_bootstrap=500, **kw)
    assert [r["workload"] for r in rows] == ["*", "a", "b"]
    star = rows[0]
    assert star["mean_acc_len"] == pytest.approx(3.0) and star["ceiling_len_mid"] == pytest.approx(3.4)
    assert star["utilisation"] == pytest.approx(15 / 17) and star["censored_share"] == pytest.approx(0.6)
    assert star["ceiling_len_mid_ci95_low"] <= star["ceiling_len_mid"] <= star["ceiling_len_mid_ci95_high"]
    again = summarize(req, np.array(["a", "a", "b", "b", "a"], dtype=object), seed=1, n_bootstrap=500, **kw)
    assert again == rows


def test_validation_groups_and_coverage():
    rows = validate(np.array([1, 2, 0.0]), np.array([1.5, 2, 0.0]), np.array([2, 3, 0.0]), np.array([2, 4, 0.0]),
                    censored=np.array([True, True, False]), category=np.array(["x", "y", "z"], dtype=object),
                    workload=np.array(["w", "w", "w"], dtype=object), greedy=np.array([True, False, True]),
                    emu_expected=np.array([1.8, 2.9, 0.0]))
    overall = next(r for r in rows if r["group_kind"] == "overall")
    # bias over both censored steps; MAE and coverage over the greedy one only (the sampled step's
    # realisation, 4 outside [2, 3], is one draw, not the estimate's target)
    assert overall["n"] == 2 and overall["bias"] == pytest.approx(-1.25)
    assert overall["coverage_n"] == 1 and overall["coverage"] == 1.0 and overall["mae"] == pytest.approx(0.5)
    sampled = next(r for r in rows if r["group_kind"] == "sampling" and r["group"] == "temperature")
    assert sampled["coverage_n"] == 0 and sampled.get("coverage") is None and sampled["mean_truth"] == 4.0
    assert overall["emu_coverage"] == 1.0 and overall["emu_n"] == 2
    assert {r["group"] for r in rows if r["group_kind"] == "bin"} == {"0", "1"}
    assert next(r for r in rows if r["group_kind"] == "all_steps")["n"] == 3


# -- SGLang JSONL -------------------------------------------------------------------------------

def test_jsonl_gives_q_and_p_per_censored_step():
    rows = [
        {"rid": "r", "fct": 3, "w": 1, "cl": 1, "ct": 0, "trimmed_tokens": [7, 8, 9], "q_lp": [-0.1, -0.2, -0.3],
         "pg": [[3, 2, -0.5, 7, 7]]},
        {"rid": "r", "fct": 4, "w": 4, "cl": 2, "ct": 0, "pg": [[3, 3, -0.6, 8, 1]]},
        {"rid": "r", "eos_end": [3]},
    ]
    t = logprobs_from_sglang_jsonl(rows, gamma=4).to_pylist()
    assert len(t) == 1 and t[0]["forward_ct"] == 3
    assert t[0]["q_logprob"][1:] == [-0.1, -0.2, -0.3] and math.isnan(t[0]["q_logprob"][0])
    assert t[0]["p_logprob"][1:3] == [-0.5, -0.6] and math.isnan(t[0]["p_logprob"][3])


def test_jsonl_errors_name_the_row():
    with pytest.raises(ValueError, match=r"row 0 .*w=1 plus 2 q_lp values is not gamma=4"):
        logprobs_from_sglang_jsonl([{"rid": "r", "fct": 1, "w": 1, "cl": 1, "q_lp": [0, 0]}], gamma=4)
    with pytest.raises(ValueError, match=r"row 0: expected an object with 'rid'"):
        logprobs_from_sglang_jsonl([[1, 2]], gamma=4)


def test_summary_bootstrap_in_tiles_of_requests_sums_the_whole_draw(monkeypatch):
    """The weights are drawn in tiles of requests (fast: a tile stays in cache); the tiles put together are the
    run's weights, and every workload's resampled sums (a subset of the tiles' columns) are its weights @ sums."""
    from dspark_obs.estimators import stats as bootstrap
    from dspark_obs.estimators.ceiling import stats as ceiling_stats

    monkeypatch.setattr(bootstrap, "UNITS_PER_TILE", 128)   # 500 requests: three full tiles and a partial one
    rng = np.random.default_rng(5)
    r, b = 500, 70
    keys = bootstrap.unit_keys([f"req-{i}" for i in range(r)])
    whole = bootstrap.poisson_weights(keys, b, 11)
    tiled = np.zeros_like(whole)
    for start, lo, hi, w in bootstrap.weight_tiles(keys, b, 11):
        assert hi - lo <= 128 and w.shape[0] <= bootstrap.BLOCK
        tiled[start:start + w.shape[0], lo:hi] = w
    assert np.array_equal(tiled, whole)
    workload = np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, r)]
    totals = ceiling_stats.RequestTotals(np.arange(r), workload, rng.random((r, 6)), rng.integers(1, 9, r).astype(float),
                                         keys)
    got = ceiling_stats.summary_sums(totals, n_bootstrap=b, seed=11)
    for name, mask in [("*", np.ones(r, bool))] + [(w, workload == w) for w in "abc"]:
        np.testing.assert_allclose(got[name].boot_sums, whole[:, mask] @ totals.sums[mask], rtol=1e-12)
        np.testing.assert_allclose(got[name].boot_den, whole[:, mask] @ totals.steps[mask], rtol=1e-12)


def test_summary_bootstrap_in_blocks_draws_the_resamples_of_one_draw():
    """The request bootstrap is drawn 64 resamples at a time (bounded memory); its interval is the
    percentile interval of the Poisson weights drawn per request, and any split of the requests
    sums to the same resamples (what --engine ray merges)."""
    from dspark_obs.estimators import stats as bootstrap
    from dspark_obs.estimators.ceiling import stats as ceiling_stats

    rng = np.random.default_rng(3)
    r, b = 500, 150  # 150 resamples: two full blocks and a partial one
    sums, den = rng.random((r, 2)), rng.integers(1, 9, r).astype(float)
    keys = bootstrap.unit_keys([f"req-{i}" for i in range(r)])
    whole = ceiling_stats.group_sums(sums, den, keys, n_bootstrap=b, seed=7)
    values, ci = ceiling_stats._bootstrap_ratios(whole, [(0, 1)])
    w = bootstrap.poisson_weights(keys, b, 7)
    num, d = w @ sums, w @ den
    boot = np.column_stack([num / d[:, None], num[:, 0] / num[:, 1]])
    np.testing.assert_allclose(ci, np.percentile(boot, [2.5, 97.5], axis=0), rtol=1e-12)
    np.testing.assert_allclose(values, [*(sums.sum(0) / den.sum()), sums[:, 0].sum() / sums[:, 1].sum()])
    odd = np.arange(r) % 3 == 0
    split = (ceiling_stats.group_sums(sums[odd], den[odd], keys[odd], n_bootstrap=b, seed=7)
             + ceiling_stats.group_sums(sums[~odd], den[~odd], keys[~odd], n_bootstrap=b, seed=7))
    np.testing.assert_allclose(ceiling_stats._bootstrap_ratios(split, [(0, 1)])[1], ci, rtol=1e-12)
    assert split.requests == r
