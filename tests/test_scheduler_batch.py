"""The scheduler planned for many steps at once equals the one-step scheduler (which the fidelity tier
checks against SGLang) step by step: budgets, windows, and the replay's lagged history."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs import costtable as ct
from dspark_obs.estimators.replay import schedule as rp
from dspark_obs.scheduler import (
    ScheduleConfig,
    verify_lens_topk,
    verify_lens_topk_steps,
    verify_token_budget,
    verify_token_budgets,
)

ONE_D = ct.SpsCostTable(sample_batch_tokens=[1, 8, 24, 64], sample_steps_per_sec=[90.0, 80.0, 55.0, 20.0],
                        max_batch_tokens=512)
TABLES = [ct.default_additive_table(), ONE_D]


def _survivals(rng: np.random.Generator, steps: int, n: int, gamma: int) -> np.ndarray:
    """Survivals with ties (a few levels), eps crossings and zeros, as float32 cumulative products."""
    levels = np.array([1.0, 0.9, 0.5, 0.5, 0.25, 1e-7, 0.0], dtype=np.float32)
    conf = levels[rng.integers(0, levels.size, size=(steps, n, gamma))]
    conf = np.where(rng.random((steps, n, gamma)) < 0.5, rng.random((steps, n, gamma)).astype(np.float32), conf)
    return np.cumprod(conf.astype(np.float64), axis=-1).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 9), gamma=st.integers(1, 7),
       min_len=st.integers(0, 2), cap=st.integers(0, 8), table=st.sampled_from(TABLES))
def test_batched_budgets_and_windows_equal_the_one_step_scheduler(seed, n, gamma, min_len, cap, table):
    rng = np.random.default_rng(seed)
    max_len = min(cap, gamma + 1)
    if max_len and max_len < min_len:
        max_len = min_len
    cfg = ScheduleConfig(gamma=gamma, min_verify_len=min(min_len, gamma + 1), max_verify_len=max_len)
    hist, surv = _survivals(rng, 12, n, gamma), _survivals(rng, 12, n, gamma)
    budgets = verify_token_budgets(hist, table, cfg)
    assert budgets.tolist() == [verify_token_budget(h, table, cfg).budget for h in hist]
    asked = np.concatenate([budgets[:6], rng.integers(0, n * gamma + 3, size=6)])   # planned and arbitrary
    lens = verify_lens_topk_steps(surv, asked, cfg)
    assert lens.tolist() == [verify_lens_topk(s, int(b), cfg).tolist() for s, b in zip(surv, asked)]


def _log(rng: np.random.Generator, gamma: int = 3) -> rp.StepLog:
    """A small log on two ranks with varying batch sizes, requests joining and leaving, lags 0-2."""
    bs = rng.integers(1, 6, size=14)
    ptr = np.concatenate([[0], np.cumsum(bs)])
    rid = np.concatenate([rng.choice(9, size=b, replace=False) for b in bs])
    rows = int(ptr[-1])
    conf = rng.random((rows, gamma)).astype(np.float32)
    conf[rng.random(rows) < 0.3] = 0.5   # ties across requests
    z = np.zeros(rows, dtype=np.int64)
    return rp.StepLog(
        gamma=gamma, mode="compact", dp_rank=np.repeat([0, 1], 7), segment=np.zeros(14, int),
        forward_ct=np.tile(np.arange(7), 2), budget=np.full(14, -1), lag_steps=rng.integers(0, 3, size=14),
        unknown_history=np.zeros(14, bool), num_verify_tokens=bs, measured_s=np.full(14, np.nan), row_ptr=ptr,
        rid=rid, confidence=conf, verify_len=z + 1, acc_len=z, block_lo=z.astype(float), block_mid=z.astype(float),
        block_hi=z.astype(float), block_source=z)


def _one_step_replay(log: rp.StepLog, table) -> tuple[list[int], list[int]]:
    """The replay as a loop over steps with the one-step scheduler and a dict of the lagged rows."""
    cfg = ScheduleConfig(gamma=log.gamma)
    surv = np.cumprod(log.confidence.astype(np.float64), axis=1).astype(np.float32)
    lag = rp.lag_indices(log.dp_rank, log.segment, log.lag_steps)
    budgets, lens = [], []
    for i in range(log.num_steps):
        lo, hi = log.row_ptr[i], log.row_ptr[i + 1]
        j = lag[i]
        before = {} if j < 0 else {int(r): surv[log.row_ptr[j] + k]
                                    for k, r in enumerate(log.rid[log.row_ptr[j]:log.row_ptr[j + 1]])}
        hist = np.array([before.get(int(r), np.ones(log.gamma, np.float32)) for r in log.rid[lo:hi]])
        budget = verify_token_budget(hist, table, cfg).budget
        budgets.append(budget)
        lens += verify_lens_topk(surv[lo:hi], budget, cfg).tolist()
    return budgets, lens


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), table=st.sampled_from(TABLES))
def test_replay_equals_a_loop_over_steps_with_the_one_step_scheduler(seed, table):
    log = _log(np.random.default_rng(seed))
    budgets, lens = rp.replay_schedule(log, table)
    assert (budgets.tolist(), lens.tolist()) == _one_step_replay(log, table)
