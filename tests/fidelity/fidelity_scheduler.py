"""``dspark_obs.scheduler`` against SGLang 0.5.23's own scheduler code.

* budget: ``verify_token_budget`` vs ``dspark_planner.compute_verify_token_budget``
  for both table kinds; budget exact, predicted step time and theta to 1e-9
  relative;
* windows: ``verify_lens_topk`` vs ``dspark_schedule.schedule_verify_lens_topk``
  (and ``..._from_survival``), exact;
* survival: ``survival_from_confidence`` vs ``compute_sort_survival``, bit for bit.

Each seeded case is reproducible on its own: ``case`` is the last element of the
``numpy.random.default_rng([BASE, case])`` seed, and a failure prints the inputs.

Survival precision: SGLang's ``compute_sort_survival`` is
``torch.cumprod(confidence.float32)``, and CPU torch accumulates a float32
cumprod in double (``at::acc_type<float, false>`` is ``double`` in
``cumprod_cpu_kernel``), rounding only each output.  A float32 running product
differs by an ulp on most rows, which moves survivals across ``survival_eps``
and reorders near-ties, so ``survival_from_confidence`` accumulates in double
too.  In a real server the budget path (``HostConfidenceBudgetPlanner
._two_steps_prior_survival``) and the logged ``ReqDetail.survival`` use this CPU
cumprod; the window path runs the Triton kernel (``tl.cumprod`` in float32) on
GPU, which cannot be checked here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import _fidelity_gen as gen
from ._fidelity_sglang import (
    decision_mismatch,
    describe,
    sg_budget,
    sg_lens_from_confidence,
    sg_lens_from_survival,
    sg_survival,
)
from dspark_obs.costtable import (
    SpsAdditiveCostTable,
    SpsCostTable,
    default_additive_table,
    uninitialized_table,
)
from dspark_obs.scheduler import (
    ScheduleConfig,
    survival_from_confidence,
    verify_lens_topk,
    verify_token_budget,
)

pytestmark = pytest.mark.fidelity

N_BUDGET_CASES = 1200  # per table kind
N_LENS_CASES = 1200
N_SURVIVAL_LENS_CASES = 600
N_CUMPROD_CASES = 1000
N_HOST_BUDGET_CASES = 600  # x2 table kinds

CUMPROD_MISMATCH = (
    "survival_from_confidence multiplies in float32; SGLang's compute_sort_survival is CPU "
    "torch.cumprod, which accumulates float32 in double (acc_type<float,false>) and rounds each "
    "output: an ulp apart on most rows (dspark_schedule.py:50, dspark_planner.py:1025)"
)

FIDELITY_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _budget_case(base: int, case: int, table_kind: str):
    rng = np.random.default_rng([base, case])
    cfg = gen.draw_config(rng)
    bs = gen.draw_bs(rng)
    kind = gen.SURVIVAL_KINDS[case % len(gen.SURVIVAL_KINDS)]
    survival = gen.draw_survival(rng, bs, cfg.gamma, kind)
    table = gen.draw_additive_table(rng) if table_kind == "additive" else gen.draw_sps_table(rng)
    return cfg, survival, table, kind


def _assert_budget_matches(survival, table, cfg, **context) -> None:
    ours = verify_token_budget(survival, table, cfg)
    theirs = sg_budget(survival, table, cfg)
    problem = decision_mismatch(ours, theirs)
    assert problem is None, f"{problem}\n{describe(cfg=cfg, table=table, survival=survival, **context)}"


# --------------------------------------------------------------------------- budget


@pytest.mark.parametrize("case", range(N_BUDGET_CASES))
def test_budget_matches_sglang_additive_table(case):
    cfg, survival, table, kind = _budget_case(101, case, "additive")
    assert isinstance(table, SpsAdditiveCostTable)
    _assert_budget_matches(survival, table, cfg, kind=kind, seed=[101, case])


@pytest.mark.parametrize("case", range(N_BUDGET_CASES))
def test_budget_matches_sglang_sps_table(case):
    cfg, survival, table, kind = _budget_case(202, case, "sps")
    assert isinstance(table, SpsCostTable)
    _assert_budget_matches(survival, table, cfg, kind=kind, seed=[202, case])


def _fresh(bs: int, gamma: int) -> np.ndarray:
    return np.ones((bs, gamma), dtype=np.float32)


TWO_PROBE_TIE = SpsCostTable(sample_batch_tokens=[1, 2], sample_steps_per_sec=[1.0, 0.5], max_batch_tokens=2)
EDGE_TABLES = {
    "uninitialized": uninitialized_table(max_batch_tokens=2400),
    "sps_one_probe": SpsCostTable(sample_batch_tokens=[64], sample_steps_per_sec=[40.0], max_batch_tokens=64),
    "sps_tie_first_wins": TWO_PROBE_TIE,
    "sps_dead_probe": SpsCostTable(sample_batch_tokens=[1, 10], sample_steps_per_sec=[50.0, 0.0], max_batch_tokens=10),
    "additive_default": default_additive_table(),
    "additive_one_probe_each": SpsAdditiveCostTable(
        bias_seconds=0.01, bs_probes=[8], alpha_seconds=[0.001], m_probes=[100], theta_seconds=[0.004]
    ),
    "additive_dyadic_ties": SpsAdditiveCostTable(
        bias_seconds=0.5, bs_probes=[1], alpha_seconds=[0.0], m_probes=[1, 2, 5], theta_seconds=[0.0, 0.5, 2.0]
    ),
}
EDGE_SURVIVALS = {
    "fresh_1x1": (_fresh(1, 1), ScheduleConfig(gamma=1)),
    "fresh_300x8": (_fresh(300, 8), ScheduleConfig(gamma=8)),
    "fresh_max_len_3": (_fresh(17, 8), ScheduleConfig(gamma=8, max_verify_len=3)),
    "fresh_min_0": (_fresh(5, 4), ScheduleConfig(gamma=4, min_verify_len=0)),
    "all_below_eps": (np.full((12, 6), 9e-7, dtype=np.float32), ScheduleConfig(gamma=6)),
    "exactly_eps32": (np.full((4, 3), np.float32(1e-6), dtype=np.float32), ScheduleConfig(gamma=3)),
    "zeros_eps_0": (np.zeros((6, 5), dtype=np.float32), ScheduleConfig(gamma=5, survival_eps=0.0)),
    "quarters": (
        survival_from_confidence(np.tile(np.array([1.0, 0.75, 0.5, 0.25, 0.0], np.float32), (9, 1))),
        ScheduleConfig(gamma=5),
    ),
    "one_request_full_window": (np.ones((1, 8), dtype=np.float32), ScheduleConfig(gamma=8, min_verify_len=9)),
}


@pytest.mark.parametrize("table_name", sorted(EDGE_TABLES))
@pytest.mark.parametrize("survival_name", sorted(EDGE_SURVIVALS))
def test_budget_matches_sglang_on_edge_cases(survival_name, table_name):
    survival, cfg = EDGE_SURVIVALS[survival_name]
    _assert_budget_matches(survival, EDGE_TABLES[table_name], cfg)


def test_uninitialized_table_verifies_the_full_window_like_sglang():
    cfg = ScheduleConfig(gamma=6)
    survival = _fresh(10, 6)
    ours = verify_token_budget(survival, uninitialized_table(max_batch_tokens=70), cfg)
    assert ours.budget == sg_budget(survival, uninitialized_table(max_batch_tokens=70), cfg).budget == 60


def test_exact_theta_tie_takes_the_first_budget_like_sglang():
    # tau = [1, 2], sps = [1.0, 0.5]: theta ties at 1.0 and both take k = 0.
    survival, cfg = _fresh(1, 1), ScheduleConfig(gamma=1)
    assert verify_token_budget(survival, TWO_PROBE_TIE, cfg).budget == 0
    assert sg_budget(survival, TWO_PROBE_TIE, cfg).budget == 0


_POOL = [0.0, 1e-7, float(np.float32(1e-6)), 2e-6, 0.125, 0.25, 0.5, 0.75, 1.0]


@st.composite
def _survival_and_cfg(draw):
    gamma = draw(st.integers(1, 8))
    bs = draw(st.integers(1, 40))
    max_verify_len = draw(st.sampled_from([0, *range(1, gamma + 2)]))
    resolved = max_verify_len or gamma + 1
    min_verify_len = draw(st.integers(0, resolved))
    eps = draw(st.sampled_from([1e-6, 1e-6, 0.0, 0.25]))
    values = draw(st.lists(st.sampled_from(_POOL) | st.floats(0, 1, width=32), min_size=1, max_size=4))
    flat = draw(st.lists(st.sampled_from(values), min_size=bs * gamma, max_size=bs * gamma))
    survival = np.array(flat, dtype=np.float32).reshape(bs, gamma)
    cfg = ScheduleConfig(gamma=gamma, min_verify_len=min_verify_len, max_verify_len=max_verify_len, survival_eps=eps)
    return survival, cfg


_probes = st.lists(st.integers(1, 600), min_size=1, max_size=6, unique=True).map(sorted)
_seconds = st.floats(0, 0.05, allow_nan=False) | st.sampled_from([0.0, 0.5, 1 / 1024, 3 / 1024])


@st.composite
def _tables(draw):
    if draw(st.booleans()):
        bs_probes, m_probes = draw(_probes), draw(_probes)
        return SpsAdditiveCostTable(
            bias_seconds=draw(st.floats(1e-4, 0.05) | st.sampled_from([1 / 256, 0.5])),
            bs_probes=bs_probes,
            alpha_seconds=draw(st.lists(_seconds, min_size=len(bs_probes), max_size=len(bs_probes))),
            m_probes=m_probes,
            theta_seconds=draw(st.lists(_seconds, min_size=len(m_probes), max_size=len(m_probes))),
        )
    probes = draw(_probes)
    sps = draw(
        st.lists(
            st.floats(0, 500, allow_nan=False) | st.sampled_from([1.0, 0.5, 0.25]),
            min_size=len(probes),
            max_size=len(probes),
        )
    )
    return SpsCostTable(sample_batch_tokens=probes, sample_steps_per_sec=sps, max_batch_tokens=probes[-1])


@FIDELITY_SETTINGS
@given(case=_survival_and_cfg(), table=_tables())
def test_budget_matches_sglang_hypothesis(case, table):
    survival, cfg = case
    _assert_budget_matches(survival, table, cfg)


# --------------------------------------------------------------------------- windows


def _lens_case(base: int, case: int):
    rng = np.random.default_rng([base, case])
    cfg = gen.draw_config(rng)
    bs = gen.draw_bs(rng)
    kind = gen.CONFIDENCE_KINDS[case % len(gen.CONFIDENCE_KINDS)]
    confidence = gen.draw_confidence(rng, bs, cfg.gamma, kind)
    num_candidates = bs * min(cfg.resolved_max_verify_len, cfg.gamma)
    budget = gen.draw_budget(rng, num_candidates)
    return cfg, confidence, budget, kind


@pytest.mark.parametrize("case", range(N_LENS_CASES))
def test_verify_lens_match_sglang_given_sglang_survival(case):
    # The top-k itself, isolated from the cumprod: ours on SGLang's own survivals.
    cfg, confidence, budget, kind = _lens_case(303, case)
    ours = verify_lens_topk(sg_survival(confidence), budget, cfg)
    theirs = sg_lens_from_confidence(confidence, budget, cfg)
    assert np.array_equal(ours, theirs), describe(
        cfg=cfg, budget=budget, kind=kind, seed=[303, case], confidence=confidence, ours=ours, sglang=theirs
    )
    assert ours.dtype == theirs.dtype == np.int32


@pytest.mark.parametrize("case", range(N_SURVIVAL_LENS_CASES))
def test_verify_lens_match_sglang_from_survival(case):
    rng = np.random.default_rng([404, case])
    cfg = gen.draw_config(rng)
    bs = gen.draw_bs(rng)
    kind = gen.SURVIVAL_KINDS[case % len(gen.SURVIVAL_KINDS)]
    survival = gen.draw_survival(rng, bs, cfg.gamma, kind)
    budget = gen.draw_budget(rng, bs * min(cfg.resolved_max_verify_len, cfg.gamma))
    ours = verify_lens_topk(survival, budget, cfg)
    theirs = sg_lens_from_survival(survival, budget, cfg)
    assert np.array_equal(ours, theirs), describe(
        cfg=cfg, budget=budget, kind=kind, seed=[404, case], survival=survival, ours=ours, sglang=theirs
    )


@FIDELITY_SETTINGS
@given(case=_survival_and_cfg(), budget_frac=st.floats(0, 1.3))
def test_verify_lens_match_sglang_hypothesis(case, budget_frac):
    survival, cfg = case
    budget = int(budget_frac * survival[:, : cfg.resolved_max_verify_len].size)
    ours = verify_lens_topk(survival, budget, cfg)
    theirs = sg_lens_from_survival(survival, budget, cfg)
    assert np.array_equal(ours, theirs), describe(cfg=cfg, budget=budget, survival=survival, ours=ours, sglang=theirs)


def test_equal_survivals_break_ties_by_position_then_request_like_sglang():
    # Every candidate ties: the budget goes to position 0 of every request, then
    # position 1 from the first request on.
    cfg = ScheduleConfig(gamma=3)
    survival = np.full((4, 3), 0.5, dtype=np.float32)
    for budget in range(14):
        ours = verify_lens_topk(survival, budget, cfg)
        assert np.array_equal(ours, sg_lens_from_survival(survival, budget, cfg)), budget
    assert verify_lens_topk(survival, 6, cfg).tolist() == [3, 3, 2, 2]


# ------------------------------------------------- survival: known cumprod mismatch


def _cumprod_confidence(case: int) -> np.ndarray:
    rng = np.random.default_rng([505, case])
    kind = gen.CONFIDENCE_KINDS[case % len(gen.CONFIDENCE_KINDS)]
    return gen.draw_confidence(rng, gen.draw_bs(rng, max_bs=64), int(rng.integers(1, 9)), kind)


def test_sglang_cpu_survival_is_a_double_accumulated_cumprod():
    # Pins the cause of CUMPROD_MISMATCH: CPU torch's float32 cumprod equals a
    # float64 cumprod rounded to float32, bit for bit.
    for case in range(N_CUMPROD_CASES):
        confidence = _cumprod_confidence(case)
        expected = np.cumprod(confidence.astype(np.float64), axis=1).astype(np.float32)
        assert np.array_equal(sg_survival(confidence).view(np.uint32), expected.view(np.uint32)), case


def test_survival_from_confidence_is_bit_exact_with_sglang():
    mismatched = [
        case
        for case in range(N_CUMPROD_CASES)
        if not np.array_equal(
            survival_from_confidence(_cumprod_confidence(case)).view(np.uint32),
            sg_survival(_cumprod_confidence(case)).view(np.uint32),
        )
    ]
    assert not mismatched, f"{len(mismatched)}/{N_CUMPROD_CASES} cases differ, first seeds {mismatched[:5]}"


def test_survival_from_confidence_is_exact_on_quantized_confidences():
    # Multiples of 0.25 multiply exactly in float32: no rounding, no mismatch.
    rng = np.random.default_rng(606)
    confidence = (rng.integers(0, 5, (300, 8)) / 4.0).astype(np.float32)
    assert np.array_equal(survival_from_confidence(confidence), sg_survival(confidence))


def test_verify_lens_from_confidence_match_sglang():
    # As the emulator calls it: ours on survival_from_confidence(conf), SGLang on conf.
    failures = []
    for case in range(N_LENS_CASES):
        cfg, confidence, budget, kind = _lens_case(303, case)
        ours = verify_lens_topk(survival_from_confidence(confidence), budget, cfg)
        if not np.array_equal(ours, sg_lens_from_confidence(confidence, budget, cfg)):
            failures.append((case, kind))
    assert not failures, f"{len(failures)}/{N_LENS_CASES} cases differ: {failures[:10]}"


def test_budget_from_confidence_matches_sglang_host_planner():
    # As a server runs it: SGLang's host planner cumprods the lagged confidences on
    # CPU (dspark_planner.py:1025); the emulator uses survival_from_confidence.
    failures = []
    for case in range(N_HOST_BUDGET_CASES):
        cfg, confidence, _budget, kind = _lens_case(707, case)
        rng = np.random.default_rng([707, case, 1])
        for table in (gen.draw_additive_table(rng), gen.draw_sps_table(rng)):
            ours = verify_token_budget(survival_from_confidence(confidence), table, cfg)
            theirs = sg_budget(sg_survival(confidence), table, cfg)
            problem = decision_mismatch(ours, theirs)
            if problem:
                failures.append((case, kind, problem))
    assert not failures, f"{len(failures)} of {2 * N_HOST_BUDGET_CASES} decisions differ: {failures[:5]}"
