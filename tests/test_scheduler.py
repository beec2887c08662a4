"""The DSpark scheduler on hand-computed cases (budget argmax, windows, ties, eps, lag)."""

import numpy as np
import pytest

from dspark_obs import costtable as ct
from dspark_obs.emulator.engine import Engine, EngineConfig, GenerateRequest
from dspark_obs.scheduler import (
    ScheduleConfig,
    survival_from_confidence,
    verify_lens_topk,
    verify_token_budget,
)

# bias 1 s, no per-request term, theta(M) = 0.1 s * (M - 1)
LINEAR = ct.SpsAdditiveCostTable(bias_seconds=1.0, bs_probes=[1], alpha_seconds=[0.0],
                                 m_probes=[1, 101], theta_seconds=[0.0, 10.0])
SURV = np.array([[0.9, 0.5], [0.8, 0.1]], dtype=np.float32)


def test_budget_is_the_global_argmax_of_tau_over_step_time():
    # tau = 2 + [0, .9, 1.7, 2.2, 2.3]; T = 1 + 0.1 * (2 + k - 1)
    # ratios: 1.818, 2.417, 2.846, 3.000, 2.867 -> k* = 3
    d = verify_token_budget(SURV, LINEAR, ScheduleConfig(gamma=2))
    assert d.budget == 3
    assert d.predicted_step_seconds == pytest.approx(1.4)
    assert d.predicted_theta == pytest.approx(4.2 / 1.4)


def test_budget_keeps_going_past_a_local_dip():
    # a flat table makes every extra entry worth taking: no early stop at a plateau
    flat = ct.SpsAdditiveCostTable(bias_seconds=1.0, bs_probes=[1], alpha_seconds=[0.0],
                                   m_probes=[1], theta_seconds=[0.0])
    d = verify_token_budget(SURV, flat, ScheduleConfig(gamma=2))
    assert d.budget == 4


def test_one_dimensional_table_uses_the_floor_probe():
    # sps 10 up to 3 batch tokens, 4 from 4 on: tau*sps = 20, 29, 14.8, 16.8, 17.2
    table = ct.SpsCostTable(sample_batch_tokens=[1, 4], sample_steps_per_sec=[10.0, 4.0], max_batch_tokens=8)
    d = verify_token_budget(SURV, table, ScheduleConfig(gamma=2))
    assert d.budget == 1
    assert d.predicted_step_seconds == pytest.approx(0.1)


def test_uninitialised_table_verifies_the_full_window():
    table = ct.uninitialized_table(max_batch_tokens=64)
    conf = np.full((3, 6), 0.3, dtype=np.float32)
    surv = survival_from_confidence(conf)
    cfg = ScheduleConfig(gamma=6)
    d = verify_token_budget(surv, table, cfg)
    assert d.budget == 18
    assert verify_lens_topk(surv, d.budget, cfg).tolist() == [7, 7, 7]


def test_windows_take_the_top_budget_entries():
    # top 3: (r0, p0) .9, (r1, p0) .8, (r0, p1) .5
    assert verify_lens_topk(SURV, 3, ScheduleConfig(gamma=2)).tolist() == [3, 2]
    assert verify_lens_topk(SURV, 0, ScheduleConfig(gamma=2)).tolist() == [1, 1]
    assert verify_lens_topk(SURV, 99, ScheduleConfig(gamma=2)).tolist() == [3, 3]


def test_ties_break_by_position_then_request():
    tied = np.full((3, 2), 0.5, dtype=np.float32)
    # order: (r0,p0) (r1,p0) (r2,p0) (r0,p1) (r1,p1) ...
    assert verify_lens_topk(tied, 2, ScheduleConfig(gamma=2)).tolist() == [2, 2, 1]
    assert verify_lens_topk(tied, 4, ScheduleConfig(gamma=2)).tolist() == [3, 2, 2]


def test_survivals_below_eps_are_never_selected_nor_budgeted():
    tiny = np.array([[1e-7, 1e-8]], dtype=np.float32)
    cfg = ScheduleConfig(gamma=2)
    assert verify_lens_topk(tiny, 2, cfg).tolist() == [1]
    assert verify_token_budget(tiny, LINEAR, cfg).budget == 0


def test_min_and_max_verify_len_clamp():
    cfg = ScheduleConfig(gamma=2, min_verify_len=2, max_verify_len=2)
    assert verify_lens_topk(SURV, 99, cfg).tolist() == [2, 2]


def test_survival_is_a_double_accumulated_cumprod_rounded_to_float32():
    conf = np.array([[0.5, 0.5, 0.2]])
    out = survival_from_confidence(conf)
    assert out.dtype == np.float32
    assert out[0].tolist() == pytest.approx([0.5, 0.25, 0.05])


@pytest.mark.parametrize("kwargs, match", [
    ({"gamma": 0}, "gamma must be >= 1"),
    ({"gamma": 4, "min_verify_len": 6}, "0 <= min <= max <= gamma\\+1"),
    ({"gamma": 4, "survival_eps": -1.0}, "survival_eps"),
])
def test_bad_config_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScheduleConfig(**kwargs)


def test_engine_budgets_from_survivals_two_decode_steps_old():
    """Each step's budget is argmax over the survivals its rids had two decode steps earlier."""
    cfg = EngineConfig(mode="compact", seed=5, lag_steps=2)
    eng = Engine(cfg)
    for i in range(12):
        eng.submit(GenerateRequest(rid=f"poetry-{i:06d}", text=f"[poetry] verse {i}", temperature=0.0,
                                   max_new_tokens=40 + 5 * i))
    # stagger arrivals so fresh requests join mid-stream
    for _ in range(6):
        eng.step()
    for i in range(12, 16):
        eng.submit(GenerateRequest(rid=f"gsm8k-{i:06d}", text=f"[gsm8k] sum {i}", temperature=0.0,
                                   max_new_tokens=30))
    eng.run_until_idle()
    records = eng.dump()[0]["records"]
    sched = ScheduleConfig(gamma=cfg.gamma)
    checked = 0
    for j, rec in enumerate(records):
        lagged = {}
        if j >= 2:
            old = records[j - 2]
            lagged = {q["rid"]: survival_from_confidence(np.asarray(q["confidence"], dtype=np.float32))
                      for q in old["reqs"]}
        hist = np.stack([lagged.get(q["rid"], np.ones(cfg.gamma, dtype=np.float32)) for q in rec["reqs"]])
        assert verify_token_budget(hist, cfg.sps_table, sched).budget == rec["budget"], j
        surv = survival_from_confidence(np.asarray([q["confidence"] for q in rec["reqs"]], dtype=np.float32))
        assert verify_lens_topk(surv, rec["budget"], sched).tolist() == [q["verify_len"] for q in rec["reqs"]]
        checked += 1
    assert checked > 20
    # fresh requests really occurred mid-run (their first budget saw all-ones rows)
    assert any(len(records[j]["reqs"]) > len(records[j - 1]["reqs"]) for j in range(1, len(records)))
