"""Ceiling figures per run and workload (utilisation, accept length, ceiling) and estimator coverage.

From ``ceiling_summary`` (``dspark-obs estimate``): the figures with their
request-bootstrap 95% CIs; drift is a z-test on the difference with standard
errors read off those CIs.  Several baseline runs pool into a step-weighted
mean whose standard error combines theirs.

From ``ceiling_validation``: the share of censored steps whose truth lies in the
estimate's ``[lo, hi]`` (Wilson interval; drift: two-proportion z-test) and the
estimate's bias, whenever a truth exists (a cap-accept companion, the run's own
cap-accept/static steps, or the emulator's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dspark_obs import sql as sqlmod
from dspark_obs.report.inputs import RunInfo
from dspark_obs.report.model import Drift, Figure
from dspark_obs.report.stats import Z95, difference_ztest, se_from_ci, two_sided_p, wilson_interval

__all__ = ["CeilingSection", "ceiling_section", "pool_estimates", "coverage_drift"]

# figure -> (value column, CI column prefix or None)
_CEILING_METRICS = {
    "utilisation": ("utilisation", "utilisation"),
    "mean_acc_len": ("mean_acc_len", "mean_acc_len"),
    "ceiling_len": ("ceiling_len_mid", "ceiling_len_mid"),
    "mean_window": ("mean_window", None),
    "censored_share": ("censored_share", None),
}
_CI_Z_TEST = "z-test on the difference (SEs from the 95% CIs)"


@dataclass
class CeilingSection:
    figures: list[Figure] = field(default_factory=list)
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)  # report_ceiling rows, runs and baselines
    validation: pd.DataFrame = field(default_factory=pd.DataFrame)  # report_validation rows of the runs
    notes: list[str] = field(default_factory=list)


def pool_estimates(values, ses, weights) -> tuple[float, float | None]:
    """Weighted mean of independent estimates and its standard error (None if any SE is unknown).

    >>> v, se = pool_estimates([0.9, 0.8], [0.01, 0.02], [1, 1])
    >>> round(v, 3), round(se, 4)
    (0.85, 0.0112)
    """
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    value = float(np.dot(w, np.asarray(values, dtype=np.float64)))
    if any(s is None or not math.isfinite(s) for s in ses):
        return value, None
    return value, float(math.sqrt(np.sum((w * np.asarray(ses, dtype=np.float64)) ** 2)))


def _f(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) or pd.isna(x) else float(x)


def ceiling_section(con, runs: list[RunInfo], baselines: dict[str, list[RunInfo]]) -> CeilingSection:
    out = CeilingSection()
    ids = sorted({r.run_id for r in runs} | {b.run_id for bs in baselines.values() for b in bs})
    summary = sqlmod.query(con, "report_ceiling", {"runs": ids}).to_pandas()
    out.summary = summary
    validation = sqlmod.query(con, "report_validation", {"runs": ids}).to_pandas()
    out.validation = validation[validation["run_id"].isin([r.run_id for r in runs])].reset_index(drop=True)
    for run in runs:
        rows = summary[summary["run_id"] == run.run_id]
        if rows.empty:
            out.notes.append(f"{run.run_id}: no ceiling summary (dspark-obs estimate failed or was not run)")
            continue
        base_ids = [b.run_id for b in baselines.get(run.run_id, [])]
        base_rows = summary[summary["run_id"].isin(base_ids)]
        for row in rows.to_dict("records"):
            out.figures += _ceiling_figures(run.run_id, row, base_rows[base_rows["workload"] == row["workload"]],
                                            base_ids)
        out.figures += _validation_figures(run.run_id, out.validation[out.validation["run_id"] == run.run_id])
    coverage_drift(out.figures, validation, baselines)
    return out


def _ceiling_figures(run_id: str, row: dict, base: pd.DataFrame, base_ids: list[str]) -> list[Figure]:
    figures = []
    detail = {"method": row["method"], "requests": int(row["requests"]),
              "ceiling_source": "exact" if row.get("mode") in ("cap-accept", "static") else "estimate"}
    for metric, (column, ci) in _CEILING_METRICS.items():
        value = _f(row[column])
        lo = _f(row[f"{ci}_ci95_low"]) if ci else None
        hi = _f(row[f"{ci}_ci95_high"]) if ci else None
        drift = None
        if ci:
            drift = Drift(test=_CI_Z_TEST, baseline_runs=base_ids)
            usable = base[base[column].notna()] if not base.empty else base
            if base_ids and usable.empty:
                drift.verdict, drift.note = "no_baseline", f"the baseline has no {row['workload']} rows"
            elif not usable.empty and value is not None:
                ses = [se_from_ci(_f(r[f"{ci}_ci95_low"]), _f(r[f"{ci}_ci95_high"])) for r in usable.to_dict("records")]
                b_value, b_se = pool_estimates(usable[column], ses, usable["steps"])
                se = se_from_ci(lo, hi)
                drift.baseline_value, drift.baseline_n = b_value, int(usable["steps"].sum())
                if b_se is not None:
                    drift.baseline_ci = (b_value - Z95 * b_se, b_value + Z95 * b_se)
                drift.delta, s, drift.p_value = difference_ztest(value, se, b_value, b_se)
                if s is not None:
                    drift.delta_ci = (drift.delta - Z95 * s, drift.delta + Z95 * s)
        figures.append(Figure(metric, run_id, value, workload=row["workload"], ci_low=lo, ci_high=hi,
                              ci_method="request bootstrap (estimate)" if lo is not None else None,
                              n=int(row["steps"]), detail=dict(detail), drift=drift))
    return figures


def _validation_figures(run_id: str, rows: pd.DataFrame) -> list[Figure]:
    figures = []
    for row in rows[rows["group_kind"].isin(["overall", "workload"])].to_dict("records"):
        workload = "*" if row["group_kind"] == "overall" else str(row["group"])
        n_cov = _f(row.get("coverage_n"))   # coverage is over greedy steps (a sampled realisation is one draw)
        n = int(n_cov) if n_cov is not None else int(row["n"])
        detail = {"truth_source": row["truth_source"], "companion_run": row["companion_run"],
                  "method": row["method"], "mae": _f(row["mae"]), "steps": "censored, greedy"}
        coverage = _f(row["coverage"])
        lo, hi = wilson_interval(coverage * n, n) if coverage is not None and n else (None, None)
        figures.append(Figure("estimator_coverage", run_id, coverage, workload=workload, ci_low=_f(lo),
                              ci_high=_f(hi), ci_method="Wilson" if lo is not None else None, n=n,
                              detail=dict(detail), drift=Drift(test="two-proportion z-test", baseline_runs=[])))
        figures.append(Figure("estimator_bias", run_id, _f(row["bias"]), workload=workload, n=n, detail=detail))
    return figures


def coverage_drift(figures: list[Figure], baseline_validation: pd.DataFrame, baselines: dict[str, list[RunInfo]]
                   ) -> None:
    """Fill the coverage figures' drift from the baseline runs' validation rows (pooled counts)."""
    for fig in figures:
        if fig.metric != "estimator_coverage" or fig.value is None:
            continue
        base_ids = [b.run_id for b in baselines.get(fig.run_id, [])]
        fig.drift.baseline_runs = base_ids
        if not base_ids:
            continue
        kind, group = ("overall", "*") if fig.workload == "*" else ("workload", fig.workload)
        rows = baseline_validation[baseline_validation["run_id"].isin(base_ids)
                                   & (baseline_validation["group_kind"] == kind)
                                   & (baseline_validation["group"] == group)]
        counts = rows["coverage_n"] if "coverage_n" in rows else rows["n"]
        n_b = float(counts.fillna(0).sum()) if not rows.empty else 0.0
        if n_b == 0:
            fig.drift.verdict, fig.drift.note = "no_baseline", "the baseline has no truth to validate against"
            continue
        x_b = float((rows["coverage"].fillna(0) * counts.fillna(0)).sum())
        p_b, p = x_b / n_b, fig.value
        se = math.sqrt(max(p * (1 - p), 0.0) / fig.n) if fig.n else None
        se_b = math.sqrt(max(p_b * (1 - p_b), 0.0) / n_b)
        pooled = (p * fig.n + x_b) / (fig.n + n_b)  # the z-test's SE under 'no difference'
        se0 = math.sqrt(max(pooled * (1 - pooled), 0.0) * (1 / fig.n + 1 / n_b))
        fig.drift.baseline_value, fig.drift.baseline_n = p_b, int(n_b)
        fig.drift.baseline_ci = wilson_interval(x_b, n_b)
        fig.drift.delta = p - p_b
        if se0 > 0:
            fig.drift.p_value = two_sided_p(fig.drift.delta / se0)
        else:
            fig.drift.p_value = 1.0 if fig.drift.delta == 0 else 0.0
        if se is not None:
            s = math.sqrt(se * se + se_b * se_b)
            fig.drift.delta_ci = (fig.drift.delta - Z95 * s, fig.drift.delta + Z95 * s)
