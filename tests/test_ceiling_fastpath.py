"""The estimator's fast kernels against the implementations they replaced (kept here as references):
the same numbers to float round-off, on random inputs and on a small generated store."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.estimators.ceiling import drafter as cd
from dspark_obs.estimators.ceiling.inputs import codes


def _reference_q(m: cd.DrafterMap, confidence: np.ndarray, z: float = 0.0) -> np.ndarray:
    """The drafter map's q through the full design matrix (the implementation before the closed form)."""
    c = np.asarray(confidence, dtype=np.float64)
    n, gamma = c.shape
    offset = np.broadcast_to(np.arange(1, gamma + 1)[None, :], c.shape).reshape(-1)
    x = cd._design(np.where(np.isnan(c), 0.5, c).reshape(-1), offset, gamma)
    eta = x @ m.coef
    if z:
        eta = eta + z * np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", x, m.cov, x), 0.0))
    return cd._sigmoid(eta).reshape(n, gamma)


def _fitted(gamma: int = 5, n: int = 6000, seed: int = 1) -> tuple[cd.DrafterMap, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.02, 0.98, (n, gamma))
    p = rng.uniform(0.0, 1.0, (n, gamma))
    acc = rng.random((n, gamma)) < np.minimum(1.0, p / q) ** 1.3
    correct = np.argmin(np.column_stack([acc, np.zeros(n, bool)]), axis=1)
    m = cd.fit_drafter_map(q ** 0.8, p, np.ones((n, gamma), np.int8), np.full(n, gamma), correct, np.ones(n, bool))
    conf = rng.uniform(0.0, 1.0, (n, gamma))
    conf[rng.random((n, gamma)) < 0.05] = np.nan
    conf[:3, 0] = [0.0, 1.0, 1e-9]
    return m, conf


@pytest.mark.parametrize("z", [0.0, 1.96, -1.96])
def test_drafter_q_in_closed_form_is_the_design_matrix_product(z):
    m, conf = _fitted()
    assert m.fitted and np.abs(m.coef[2:]).max() > 1e-3       # per-position offsets that matter
    fast, ref = m.q(conf, z=z), _reference_q(m, conf, z)
    assert fast.shape == ref.shape and np.isfinite(fast).all()
    np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=1e-15)


def _reference_nll(theta, x, log_p, y, penalty):
    """The drafter fit's likelihood as first written (every term computed on every draft)."""
    eta = x @ theta
    log_q = -np.logaddexp(0.0, -eta)
    u = cd._SHARP * (log_q - log_p)
    log_a = -np.logaddexp(0.0, u) / cd._SHARP
    s = cd._sigmoid(u)
    a = np.exp(log_a)
    one_minus = np.maximum(-np.expm1(log_a), 1e-12)
    ll = np.where(y, log_a, np.log(one_minus))
    d_logq = np.where(y, -s, (a / one_minus) * s)
    grad_eta = d_logq * (1.0 - np.exp(log_q))
    return float(-ll.sum() + 0.5 * np.sum(penalty * theta * theta)), -(x.T @ grad_eta) + penalty * theta


def test_drafter_likelihood_is_bit_identical_to_the_reference():
    rng = np.random.default_rng(3)
    n, gamma = 5000, 4
    c = rng.uniform(0.0, 1.0, n)
    x = cd._design(c, rng.integers(1, gamma + 1, n), gamma)
    log_p = np.log(rng.uniform(1e-6, 1.0, n))
    y = rng.random(n) < 0.6
    theta = rng.normal(0.0, 0.5, x.shape[1])
    f, g = cd._nll(theta, x, log_p, y, cd._penalty(gamma))
    rf, rg = _reference_nll(theta, x, log_p, y, cd._penalty(gamma))
    assert f == rf and np.array_equal(g, rg)


# The estimate of a 6,000-step generated store (seed 4, bootstrap 100, seed 3) by the implementation
# before the fast kernels: sums of lo/mid/hi over the steps in (rid, dp_rank, forward_ct) order (plain and
# weighted by row number mod 97) and the float figures of the summary's first row, in column-name order.
PINNED = {'one': {'lo': [20387.67930460871, 978444.8781152371],
         'mid': [20437.72796271822, 980854.8887272394],
         'hi': [23606.543132691717, 1134314.5778865404],
         'summary_star': [4.926570714020579,
                          5.062746021681749,
                          4.803359424659215,
                          4.391164222323474,
                          4.5115555830196366,
                          4.24921790513737,
                          4.3994890157548605,
                          4.518987229817219,
                          4.25790058827927,
                          0.38739188290086496,
                          4.219560878243513,
                          4.347655931571236,
                          4.0754249284265605,
                          3.8980372588157017,
                          0.9591024919332647,
                          0.8564904724162431,
                          0.9609207637447088,
                          0.9630020521060672,
                          0.9545492766962049]},
 'chunks': {'lo': [20364.371399242827, 977316.6501324554],
            'mid': [20442.855106726085, 981103.5407869741],
            'hi': [23607.163974570944, 1134360.787567706],
            'summary_star': [4.9266739811328915,
                             5.062854614714096,
                             4.803512627405054,
                             4.387287325223356,
                             4.507749650440126,
                             4.245382243080968,
                             4.400341834119443,
                             4.519771928348489,
                             4.258764707003118,
                             0.38739188290086496,
                             4.219560878243513,
                             4.347655931571236,
                             4.0754249284265605,
                             3.8980372588157017,
                             0.9589166108700494,
                             0.8564725196760884,
                             0.9617698968527655,
                             0.9628196040265371,
                             0.9543475673042311]}}
PINNED_OPTS = {"one": {}, "chunks": {"chunk_rows": 1500, "fit_rows": 2500}}


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    from bench.gen_store import generate
    from dspark_obs.store import Store

    root = tmp_path_factory.mktemp("pinned")
    generate(root, rows=6000, seed=4)
    return Store(root)


@pytest.mark.parametrize("variant", ["one", "chunks"])
def test_the_estimate_equals_the_previous_implementation_on_a_generated_store(small_store, variant):
    from dspark_obs.estimators import ceiling

    r = ceiling.estimate_run(small_store, "bench", write=False, n_bootstrap=100, seed=3, **PINNED_OPTS[variant])
    t = r.table.sort_by([(k, "ascending") for k in ("rid", "dp_rank", "forward_ct")])
    weight = np.arange(t.num_rows) % 97
    for col in ("lo", "mid", "hi"):
        v = t.column(col).to_numpy()
        assert [float(v.sum()), float((weight * v).sum())] == pytest.approx(PINNED[variant][col], rel=1e-12), col
    row = r.summary.to_pylist()[0]
    floats = [row[k] for k in sorted(row) if isinstance(row[k], float)]
    assert floats == pytest.approx(PINNED[variant]["summary_star"], rel=1e-12)


def test_token_lookup_by_arithmetic_finds_the_rows_a_binary_search_finds():
    """Gapless requests are looked up by offset, requests with gaps (and misses) by search: the same rows."""
    from dspark_obs.estimators.ceiling.evidence import token_index

    rng = np.random.default_rng(5)
    codes, pos = [], []
    for c in range(40):
        n = int(rng.integers(0, 30))
        p = np.arange(n) + int(rng.integers(0, 3))            # gapless, from 0, 1 or 2
        if c % 3 == 0 and n > 4:
            p = np.delete(p, rng.integers(1, n - 1, 2))       # with gaps
        codes += [c] * p.size
        pos += p.tolist()
    index = token_index(np.array(codes), np.array(pos), np.arange(len(codes)))
    q_code = rng.integers(-1, 45, (3000, 6))
    q_pos = rng.integers(-2, 35, (3000, 6))
    row, found = index.find(q_code, q_pos)
    key = np.where((q_pos >= 0) & (q_pos < index.stride) & (q_code >= 0), q_code * index.stride + q_pos, -1)
    at = np.clip(np.searchsorted(index.key, key), 0, index.key.size - 1)
    want = (key >= 0) & (index.key[at] == key)
    assert found.any() and (~found).any() and index._runs[3][:-1].sum() < 40   # both paths taken
    assert np.array_equal(found, want) and np.array_equal(row, np.where(want, at, 0))


def test_evidence_of_the_used_cells_is_the_full_evidence_there():
    from dspark_obs.estimators.ceiling.evidence import draft_evidence, token_index, used_cells

    rng = np.random.default_rng(6)
    t, k, n, gamma = 400, 3, 300, 4
    ids = rng.integers(10, 20, t)
    top = rng.integers(10, 20, (t, k))
    top[rng.random(t) < 0.1] = -1                                  # no top-k at some positions
    index = token_index(np.zeros(t), np.arange(t), ids, logprob=np.log(rng.uniform(0.1, 1, t)), top_ids=top,
                        top_logprobs=np.log(rng.uniform(0.01, 1, (t, k))).astype(np.float32))
    window = rng.integers(1, gamma + 1, n)
    correct = np.minimum(window, rng.integers(0, gamma + 1, n))
    greedy = rng.random(n) < 0.4
    first = rng.integers(0, t - 2, n)
    drafts = np.where(rng.random((n, gamma)) < 0.5, ids[np.minimum(first[:, None] + np.arange(gamma), t - 1)],
                      rng.integers(10, 20, (n, gamma)))
    cells = used_cells(window, correct, greedy, gamma)
    full = draft_evidence(index, np.zeros(n), first, drafts)
    part = draft_evidence(index, np.zeros(n), first, drafts, cells=cells)
    assert cells.any() and (~cells).any() and np.array_equal(part.realised, full.realised)
    for name in ("p_draft", "p_topk", "topk_state"):
        a, b = getattr(part, name), getattr(full, name)
        assert np.array_equal(a[cells], b[cells], equal_nan=True), name
    assert np.isnan(part.p_draft[~cells]).all() and (part.topk_state[~cells] == 0).all()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, "r0", "r1", "r2", "r3"]), st.integers(1, 6)), max_size=30),
       st.booleans())
def test_codes_of_runs_of_values_are_the_lookup_of_every_value(runs, with_dictionary):
    """``codes`` looks up the first value of each run: the same codes (and dictionary) as hashing every value."""
    values = pa.chunked_array([pa.array([v for v, k in runs for _ in range(k)], pa.string())])
    dictionary = pa.array(["r1", "r3", "r9"]) if with_dictionary else None
    got, got_dictionary = codes(values, dictionary)
    flat = values.combine_chunks()
    if dictionary is None:
        encoded = pc.dictionary_encode(flat)
        expected, expected_dictionary = pc.fill_null(encoded.indices, -1), encoded.dictionary
    else:
        expected, expected_dictionary = pc.fill_null(pc.index_in(flat, value_set=dictionary), -1), dictionary
    assert got.tolist() == expected.to_pylist()
    assert got_dictionary.equals(expected_dictionary)
