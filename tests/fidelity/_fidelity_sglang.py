"""Thin bridge from our numpy types to SGLang's own functions (CPU torch path).

Imported only by fidelity tests, after ``conftest.py`` has stubbed the
torchvision ops, so the SGLang imports below succeed on CPU torch.
"""

from __future__ import annotations

import json
import math
from typing import Optional

import msgspec
import numpy as np
import torch
from sglang.kernels.ops.speculative.dspark import dspark_schedule as sg_schedule
from sglang.srt.speculative.dspark_components import dspark_planner as sg_planner
from sglang.srt.speculative.dspark_components import dspark_sps as sg_sps

from dspark_obs.costtable import CostTable, SpsAdditiveCostTable
from dspark_obs.scheduler import BudgetDecision, ScheduleConfig

REL_TOL = 1e-9


def sg_table(table: CostTable):
    """SGLang's struct of the same kind, built from the same numbers."""
    cls = sg_sps.SpsAdditiveCostTable if isinstance(table, SpsAdditiveCostTable) else sg_sps.SpsCostTable
    return cls(**msgspec.structs.asdict(table))


def sg_cfg(cfg: ScheduleConfig) -> sg_planner.DSparkScheduleConfig:
    out = sg_planner.DSparkScheduleConfig(
        gamma=cfg.gamma,
        min_verify_len=cfg.min_verify_len,
        max_verify_len=cfg.max_verify_len,
        survival_eps=cfg.survival_eps,
    )
    out.validate()
    return out


def sg_budget(history_survival: np.ndarray, table: CostTable, cfg: ScheduleConfig):
    return sg_planner.compute_verify_token_budget(
        history_survival_probs=torch.from_numpy(np.array(history_survival, dtype=np.float32)),
        sps_table=sg_table(table),
        cfg=sg_cfg(cfg),
    )


def sg_lens_from_confidence(confidence: np.ndarray, budget: int, cfg: ScheduleConfig) -> np.ndarray:
    return sg_schedule.schedule_verify_lens_topk(
        confidence=torch.from_numpy(np.array(confidence, dtype=np.float32)), budget=budget, cfg=sg_cfg(cfg)
    ).numpy()


def sg_lens_from_survival(survival: np.ndarray, budget: int, cfg: ScheduleConfig) -> np.ndarray:
    return sg_schedule.schedule_verify_lens_topk_from_survival(
        survival_probs=torch.from_numpy(np.array(survival, dtype=np.float32)), budget=budget, cfg=sg_cfg(cfg)
    ).numpy()


def sg_survival(confidence: np.ndarray) -> np.ndarray:
    """SGLang's ``compute_sort_survival`` (CPU torch: float64-accumulated cumprod)."""
    return sg_schedule.compute_sort_survival(
        torch.from_numpy(np.array(confidence, dtype=np.float32))
    ).numpy()


def _close(a: Optional[float], b: Optional[float]) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a == b or math.isclose(a, b, rel_tol=REL_TOL)


def decision_mismatch(ours: BudgetDecision, theirs) -> Optional[str]:
    """``None`` when the decisions agree (budget exact, floats to 1e-9 relative)."""
    problems = []
    if ours.budget != theirs.budget:
        problems.append(f"budget ours={ours.budget} sglang={theirs.budget}")
    if not _close(ours.predicted_step_seconds, theirs.predicted_step_seconds):
        problems.append(
            f"predicted_step_seconds ours={ours.predicted_step_seconds!r} "
            f"sglang={theirs.predicted_step_seconds!r}"
        )
    if not _close(ours.predicted_theta, theirs.predicted_theta):
        problems.append(f"predicted_theta ours={ours.predicted_theta!r} sglang={theirs.predicted_theta!r}")
    return "; ".join(problems) or None


def describe(*, cfg: ScheduleConfig, table: CostTable | None = None, **arrays) -> str:
    """A repro block for an assertion message: config, table JSON, arrays as lists."""
    lines = [f"cfg={cfg!r}"]
    if table is not None:
        lines.append(f"table={type(table).__name__} {msgspec.json.encode(table).decode()}")
    for name, value in arrays.items():
        if isinstance(value, np.ndarray):
            text = json.dumps(value.tolist())
            lines.append(f"{name} shape={value.shape}: {text[:2000]}{' ...' if len(text) > 2000 else ''}")
        else:
            lines.append(f"{name}={value!r}")
    return "\n".join(lines)
