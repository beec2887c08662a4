"""Collection figures per run: records lost to gaps, and dead letters.

``lost_record_share`` = forward_cts lost to gaps / (decode steps + lost), an
upper bound (prefill batches advance forward_ct too); Wilson interval; drift:
two-proportion z-test.  ``dead_letters`` is a count with its exact Poisson
interval; drift: the conditional binomial test of two Poisson rates with the
decode steps as exposure.  The gaps by reason and dead letters by reason go to
the report's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from dspark_obs import sql as sqlmod
from dspark_obs.report.inputs import RunInfo
from dspark_obs.report.model import Drift, Figure
from dspark_obs.report.stats import Z95, poisson_interval, poisson_rate_test, two_sided_p, wilson_interval

__all__ = ["CollectionSection", "collection_section"]


@dataclass
class CollectionSection:
    figures: list[Figure] = field(default_factory=list)
    losses: pd.DataFrame = field(default_factory=pd.DataFrame)  # report_collection rows of the runs
    notes: list[str] = field(default_factory=list)


def _totals(losses: pd.DataFrame, run: str) -> tuple[int, int, int]:
    """(gaps, lost forward_cts, dead letters) of one run."""
    sub = losses[losses["run_id"] == run]
    gaps = sub[sub["kind"] == "gap"]
    return (int(gaps["count"].sum()), int(gaps["missing_forward_cts"].fillna(0).sum()),
            int(sub[sub["kind"] == "dead_letter"]["count"].sum()))


def collection_section(con, runs: list[RunInfo], baselines: dict[str, list[RunInfo]]) -> CollectionSection:
    out = CollectionSection()
    ids = sorted({r.run_id for r in runs} | {b.run_id for bs in baselines.values() for b in bs})
    losses = sqlmod.query(con, "report_collection", {"runs": ids}).to_pandas()
    out.losses = losses[losses["run_id"].isin([r.run_id for r in runs])].reset_index(drop=True)
    for run in runs:
        gaps, lost, dead = _totals(losses, run.run_id)
        total = run.steps + lost
        base = baselines.get(run.run_id, [])
        base_ids = [b.run_id for b in base]
        b_lost = sum(_totals(losses, b.run_id)[1] for b in base)
        b_total = sum(b.steps for b in base) + b_lost
        b_dead = sum(_totals(losses, b.run_id)[2] for b in base)
        b_steps = sum(b.steps for b in base)

        share = lost / total if total else None
        lo, hi = wilson_interval(lost, total) if total else (None, None)
        drift = Drift(test="two-proportion z-test", baseline_runs=base_ids)
        if base and b_total:
            p_b = b_lost / b_total
            drift.baseline_value, drift.baseline_n = p_b, b_total
            drift.baseline_ci = wilson_interval(b_lost, b_total)
            if share is not None:
                drift.delta = share - p_b
                pooled = (lost + b_lost) / (total + b_total)
                se0 = math.sqrt(pooled * (1 - pooled) * (1 / total + 1 / b_total))
                drift.p_value = two_sided_p(drift.delta / se0) if se0 > 0 else (1.0 if drift.delta == 0 else 0.0)
                s = math.sqrt(share * (1 - share) / total + p_b * (1 - p_b) / b_total)
                drift.delta_ci = (drift.delta - Z95 * s, drift.delta + Z95 * s)
        out.figures.append(Figure("lost_record_share", run.run_id, share, ci_low=lo, ci_high=hi,
                                  ci_method="Wilson" if lo is not None else None, n=total,
                                  detail={"gaps": gaps, "lost_forward_cts": lost, "decode_steps": run.steps},
                                  drift=drift))

        d_lo, d_hi = poisson_interval(dead)
        drift = Drift(test="conditional binomial test of two Poisson rates", baseline_runs=base_ids)
        if base and b_steps and run.steps:
            drift.baseline_value = b_dead * run.steps / b_steps  # the baseline's rate at this run's exposure
            drift.baseline_n = b_steps
            drift.delta = dead - drift.baseline_value
            drift.p_value = poisson_rate_test(dead, run.steps, b_dead, b_steps)
        out.figures.append(Figure("dead_letters", run.run_id, float(dead), ci_low=d_lo, ci_high=d_hi,
                                  ci_method="exact Poisson", n=run.steps,
                                  detail={"per_1000_steps": dead * 1000 / run.steps if run.steps else None},
                                  drift=drift))
    return out
