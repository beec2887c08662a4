"""What the sweep's methods need from the emulator beyond SGLang's three verify modes.

``no-trim`` is compact with SGLang's ``dspark_force_budget_frac`` (the budget a
fixed share of ``bs * gamma``; at 1.0 every block whole through the ragged
path), ``no-spec`` the target without speculation.  The stochastic engine's ranks call in here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np


def check_force_budget_frac(frac: Optional[float]) -> None:
    """SGLang accepts ``dspark_force_budget_frac`` in (0, 1] or null."""
    if frac is not None and not 0.0 < frac <= 1.0:
        raise ValueError(f"force_budget_frac must be in (0, 1] or null, got {frac} "
                         "(1.0 verifies every block whole through the ragged path)")


def forced_budget(decision: Any, *, bs: int, gamma: int, frac: float) -> Any:
    """The planner's decision with its budget replaced by ``ceil(frac * bs * gamma)`` (the forced share)."""
    return dataclasses.replace(decision, budget=int(np.ceil(frac * bs * gamma - 1e-9)))


def decode_without_speculation(rank: Any) -> list[tuple[int, Any]]:
    """One decode step of ``rank`` without speculation: a committed token per request, ``T(bs, 0)``, no record.

    Returns the ``(index in the batch, request)`` pairs that finished; the rank retires them.
    """
    cfg = rank.engine.cfg
    batch = rank.running
    bs = len(batch)
    rank.forward_ct += 1
    rank.dumper.note_non_decode_step()
    finished = []
    prefix_total = 0
    for i, r in enumerate(batch):
        n = len(r.output)
        prefix_total += len(r.input_ids) + n - 1
        r.output.append(int(r.track.realised(np.array([n]))[0]))
        if len(r.output) >= r.end:
            finished.append((i, r))
    true_s = float(cfg.true_cost.step_seconds(num_reqs=bs, budget=0)) + cfg.context_seconds_per_token * prefix_total
    rank.clock += true_s * float(np.exp(rank.noise_rng.normal(0.0, cfg.step_noise))) + cfg.host_overhead_seconds
    return finished
