"""Seeded random cases for the fidelity tier: survivals, configs and cost tables.

Every generator takes a ``numpy.random.Generator`` so a failing case is
reproduced from its seed alone.  The shapes are chosen to hit the scheduler's
edge cases: fresh requests (rows of ones), survivals around and below
``survival_eps``, exact ties (values drawn from a small pool, confidences that
are multiples of 0.25), one-probe tables and tables whose interpolation
fractions are not dyadic (so rounding order matters).
"""

from __future__ import annotations

import numpy as np

from dspark_obs.costtable import (
    SpsAdditiveCostTable,
    SpsCostTable,
    default_additive_table,
    uninitialized_table,
)
from dspark_obs.scheduler import ScheduleConfig, survival_from_confidence

EPS32 = float(np.float32(1e-6))
NEAR_EPS = np.array(
    [
        0.0,
        1e-40,  # subnormal in float32
        1e-7,
        np.nextafter(np.float32(1e-6), np.float32(0)),
        np.float32(1e-6),
        np.nextafter(np.float32(1e-6), np.float32(1)),
        2e-6,
        1e-5,
    ],
    dtype=np.float32,
)

CONFIDENCE_KINDS = ("uniform", "high", "quantized", "pool", "near_eps", "fresh", "mixed_fresh")
SURVIVAL_KINDS = CONFIDENCE_KINDS + ("arbitrary", "log_uniform")


def draw_bs(rng: np.random.Generator, *, max_bs: int = 300) -> int:
    """Batch sizes 1..max_bs: 30% in 1..4, 40% in 5..64, 30% in 65..max_bs."""
    u = rng.random()
    lo, hi = (1, 4) if u < 0.3 else (5, 64) if u < 0.7 else (65, max_bs)
    hi = min(hi, max_bs)
    return int(rng.integers(min(lo, hi), hi + 1))


def draw_config(rng: np.random.Generator, gamma: int | None = None) -> ScheduleConfig:
    gamma = int(rng.integers(1, 9)) if gamma is None else gamma
    max_verify_len = 0 if rng.random() < 0.5 else int(rng.integers(1, gamma + 2))
    resolved = max_verify_len or gamma + 1
    u = rng.random()
    if u < 0.5:
        min_verify_len = 1
    elif u < 0.7:
        min_verify_len = 0
    else:
        min_verify_len = int(rng.integers(0, resolved + 1))
    u = rng.random()
    if u < 0.7:
        eps = 1e-6
    elif u < 0.8:
        eps = 0.0
    elif u < 0.9:
        eps = float(rng.choice([1e-3, 0.05, 0.25, 0.5]))
    else:
        eps = float(np.float32(rng.random()))
    return ScheduleConfig(
        gamma=gamma, min_verify_len=min_verify_len, max_verify_len=max_verify_len, survival_eps=eps
    )


def draw_confidence(rng: np.random.Generator, bs: int, gamma: int, kind: str) -> np.ndarray:
    """Per-position confidences ``[bs, gamma]`` float32 in ``[0, 1]``."""
    shape = (bs, gamma)
    if kind == "uniform":
        conf = rng.random(shape)
    elif kind == "high":
        conf = 1.0 - rng.random(shape) ** 3 * 0.5
    elif kind == "quantized":
        conf = rng.integers(0, 5, shape) / 4.0
    elif kind == "pool":
        pool = rng.random(int(rng.integers(1, 4)))
        conf = rng.choice(pool, size=shape)
    elif kind == "near_eps":
        conf = rng.choice(np.array([1e-3, 1e-2, 0.5, 1.0, 1e-6, 0.0]), size=shape)
    elif kind == "fresh":
        conf = np.ones(shape)
    elif kind == "mixed_fresh":
        conf = rng.random(shape)
        conf[rng.random(bs) < 0.5] = 1.0
    else:
        raise ValueError(f"unknown confidence kind {kind!r}; use one of {CONFIDENCE_KINDS}")
    conf = conf.astype(np.float32)
    # Duplicate whole rows now and then: identical requests tie position for position.
    if bs > 1 and rng.random() < 0.2:
        src = rng.integers(0, bs, size=bs)
        mask = rng.random(bs) < 0.3
        conf[mask] = conf[src[mask]]
    return conf


def draw_survival(rng: np.random.Generator, bs: int, gamma: int, kind: str) -> np.ndarray:
    """Lagged survivals ``[bs, gamma]`` float32, as the budget planner receives them."""
    if kind == "arbitrary":  # not monotone: the budget must not rely on it
        surv = rng.random((bs, gamma))
    elif kind == "log_uniform":
        surv = 10.0 ** rng.uniform(-9, 0, (bs, gamma))
    elif kind == "near_eps":
        surv = rng.choice(NEAR_EPS, size=(bs, gamma))
        surv[rng.random(bs) < 0.3] = 1.0
    else:
        return survival_from_confidence(draw_confidence(rng, bs, gamma, kind))
    return surv.astype(np.float32)


def _increasing_ints(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[int]:
    n = min(n, hi - lo + 1)
    return sorted(int(v) for v in rng.choice(np.arange(lo, hi + 1), size=n, replace=False))


def draw_additive_table(rng: np.random.Generator) -> SpsAdditiveCostTable:
    u = rng.random()
    if u < 0.05:
        return default_additive_table()
    n_bs = 1 if rng.random() < 0.15 else int(rng.integers(2, 8))
    n_m = 1 if rng.random() < 0.15 else int(rng.integers(2, 9))
    bs_probes = _increasing_ints(rng, n_bs, 1, 512)
    m_probes = _increasing_ints(rng, n_m, 1, 3000)
    if rng.random() < 0.3:
        # Dyadic values on probes three apart: exact ties in theta, and
        # interpolation fractions like 1/3 whose rounding depends on op order.
        m_probes = [1 + 3 * i * int(rng.integers(1, 4)) for i in range(n_m)]
        m_probes = sorted(set(m_probes))
        theta = [float(v) / 1024 for v in np.cumsum(rng.integers(0, 8, len(m_probes)))]
        alpha = [float(v) / 1024 for v in rng.integers(0, 8, n_bs)]
        bias = float(rng.integers(1, 16)) / 1024
    else:
        scale = 10.0 ** rng.uniform(-4, -1)
        theta = list(np.sort(rng.random(n_m)) * scale) if rng.random() < 0.8 else list(rng.random(n_m) * scale)
        alpha = list(np.sort(rng.random(n_bs)) * scale / 4)
        bias = float(rng.uniform(1e-4, 2e-2))
    return SpsAdditiveCostTable(
        bias_seconds=bias,
        bs_probes=bs_probes,
        alpha_seconds=[float(v) for v in alpha],
        m_probes=m_probes,
        theta_seconds=[float(v) for v in theta],
    )


def draw_sps_table(rng: np.random.Generator) -> SpsCostTable:
    u = rng.random()
    if u < 0.1:
        return uninitialized_table(max_batch_tokens=int(rng.integers(1, 4000)))
    n = 1 if u < 0.2 else int(rng.integers(2, 13))
    probes = _increasing_ints(rng, n, 1, 3000)
    v = rng.random()
    if v < 0.3:
        sps = [2.0 ** -int(k) for k in rng.integers(0, 6, n)]  # dyadic: exact ties in tau * sps
    elif v < 0.4:
        sps = list(rng.random(n) * 100)
        sps[int(rng.integers(0, n))] = 0.0  # a dead probe: predicted_step_seconds None
    elif v < 0.8:
        sps = list(np.sort(rng.uniform(5, 200, n))[::-1])  # realistic: slower with more tokens
    else:
        sps = list(rng.uniform(1, 200, n))
    return SpsCostTable(
        sample_batch_tokens=probes,
        sample_steps_per_sec=[float(s) for s in sps],
        max_batch_tokens=probes[-1] + int(rng.integers(0, 100)),
    )


def draw_budget(rng: np.random.Generator, num_candidates: int) -> int:
    u = rng.random()
    if u < 0.1:
        return 0
    if u < 0.2:
        return num_candidates
    if u < 0.3:
        return num_candidates + int(rng.integers(1, 10))
    if u < 0.4:
        return 1
    return int(rng.integers(0, num_candidates + 1))
