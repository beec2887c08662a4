"""Cost-model figures per run: MAPE of the fitted additive table and of the server's own prediction.

The values are the ``costmodel_error`` rows of all batch sizes (``bs_bucket =
'*'``).  Their intervals come from the per-step absolute percentage errors
(mean +- 1.96 standard errors; steps are treated as independent, so the
interval is a little narrow when step times drift slowly), recomputed from the
run's steps with the fitted table stored in ``costmodel_fit`` and the steps'
``predicted_step_ms``.  Drift: Welch's t-test on the per-step errors of the run
against those of the baseline runs pooled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dspark_obs import sql as sqlmod
from dspark_obs.estimators import costmodel as cm
from dspark_obs.report.inputs import RunInfo
from dspark_obs.report.model import Drift, Figure
from dspark_obs.report.stats import Z95, welch_ttest

__all__ = ["CostModelSection", "costmodel_section", "step_errors"]

_MODELS = {"fitted": "costmodel_mape", "server": "server_table_mape"}


@dataclass
class CostModelSection:
    figures: list[Figure] = field(default_factory=list)
    errors: pd.DataFrame = field(default_factory=pd.DataFrame)  # report_costmodel_error rows of the runs
    notes: list[str] = field(default_factory=list)


def step_errors(con, run: str, timer: str) -> dict[str, np.ndarray]:
    """Per-step ``|predicted - measured| / measured`` of ``run`` for the fitted table and the server."""
    steps = cm.load_steps(con, [run], timer=timer)
    if steps.num_rows == 0:
        return {}
    measured = steps.column("measured_s").to_numpy(zero_copy_only=False).astype(np.float64)
    out = {}
    table = cm.fitted_table_of(con, run)
    if table is not None:
        bs = steps.column("bs").to_numpy().astype(np.float64)
        m = steps.column("m").to_numpy().astype(np.float64)
        out["fitted"] = np.asarray(table.step_seconds(num_reqs=bs, budget=m - bs), dtype=np.float64)
    out["server"] = steps.column("predicted_s").to_numpy(zero_copy_only=False).astype(np.float64)
    errors = {}
    for model, predicted in out.items():
        ok = np.isfinite(predicted) & np.isfinite(measured) & (measured > 0)
        errors[model] = np.abs(predicted[ok] - measured[ok]) / measured[ok]
    return errors


def costmodel_section(con, runs: list[RunInfo], baselines: dict[str, list[RunInfo]]) -> CostModelSection:
    out = CostModelSection()
    ids = sorted({r.run_id for r in runs} | {b.run_id for bs in baselines.values() for b in bs})
    errors = sqlmod.query(con, "report_costmodel_error", {"runs": ids}).to_pandas()
    out.errors = errors[errors["run_id"].isin([r.run_id for r in runs])].reset_index(drop=True)
    cache: dict[tuple[str, str], dict[str, np.ndarray]] = {}

    def per_step(run: str, timer: str) -> dict[str, np.ndarray]:
        if (run, timer) not in cache:
            try:
                cache[run, timer] = step_errors(con, run, timer)
            except ValueError as exc:
                out.notes.append(f"{run}: per-step cost-model errors unavailable: {exc}")
                cache[run, timer] = {}
        return cache[run, timer]

    for run in runs:
        rows = errors[(errors["run_id"] == run.run_id) & (errors["bs_bucket"] == "*")]
        if rows.empty:
            out.notes.append(f"{run.run_id}: no cost-model error (dspark-obs costmodel failed or was not run)")
            continue
        base_ids = [b.run_id for b in baselines.get(run.run_id, [])]
        for row in rows.to_dict("records"):
            metric = _MODELS.get(row["model"])
            if metric is None or row["mape"] is None or pd.isna(row["mape"]):
                continue
            timer = row["timer"] or "step_gpu_ms"
            ape = per_step(run.run_id, timer).get(row["model"], np.zeros(0))
            lo = hi = None
            if ape.size >= 2:
                se = float(ape.std(ddof=1) / math.sqrt(ape.size))
                lo, hi = max(0.0, float(row["mape"]) - Z95 * se), float(row["mape"]) + Z95 * se
            drift = Drift(test="Welch t-test on per-step errors", baseline_runs=base_ids)
            base_ape = [per_step(b, timer).get(row["model"], np.zeros(0)) for b in base_ids]
            base_ape = np.concatenate(base_ape) if base_ape else np.zeros(0)
            if base_ids and base_ape.size == 0:
                drift.verdict, drift.note = "no_baseline", f"the baseline has no {row['model']} step errors"
            elif base_ape.size:
                drift.baseline_value, drift.baseline_n = float(base_ape.mean()), int(base_ape.size)
                delta, se_d, drift.p_value = welch_ttest(ape, base_ape)
                drift.delta = float(row["mape"]) - drift.baseline_value if ape.size else delta
                if se_d is not None:
                    drift.delta_ci = (drift.delta - Z95 * se_d, drift.delta + Z95 * se_d)
                if base_ape.size >= 2:
                    se_b = float(base_ape.std(ddof=1) / math.sqrt(base_ape.size))
                    drift.baseline_ci = (drift.baseline_value - Z95 * se_b, drift.baseline_value + Z95 * se_b)
            out.figures.append(Figure(metric, run.run_id, float(row["mape"]), ci_low=lo, ci_high=hi,
                                      ci_method="normal, per-step errors" if lo is not None else None,
                                      n=int(row["n"]), detail={"timer": timer, "bias_ms": row["bias_ms"]},
                                      drift=drift))
    return out
