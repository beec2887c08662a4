"""Every chart of a report, drawn by the dashboard's chart builders (and :mod:`dspark_obs.report.charts`).

This module only shapes frames for the builders; the HTML embeds the figures
and the PNGs are the same figure objects exported, so each chart has one code
path wherever it appears.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from dspark_obs.report import charts as rc
from dspark_obs.report.metrics import info
from dspark_obs.report.model import Figure
from dspark_obs.ui import charts as uc

__all__ = ["Chart", "build_charts", "history_frame", "newest_sweep", "sweep_charts", "HISTORY_METRICS"]

HISTORY_METRICS = ("debiased_ece", "ece", "utilisation", "estimator_coverage", "costmodel_mape")
_MAX_BASELINE_RUNS_DRAWN = 3


@dataclass
class Chart:
    name: str  # file stem of the PNG, unique in a report
    section: str
    run_id: str | None
    figure: go.Figure

    @property
    def caption(self) -> str:
        return uc.caption_of(self.figure)

    @property
    def title(self) -> str:
        return str(self.figure.layout.title.text or self.name)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def history_frame(previous: pd.DataFrame, figures: list[Figure], started: dict[str, object]) -> pd.DataFrame:
    """The history chart's frame: earlier reports (``report_history_overview``) plus tonight's figures."""
    rows = []
    current_runs = {f.run_id for f in figures}
    for metric in HISTORY_METRICS:
        for run in sorted(current_runs):
            sel = [f for f in figures if f.metric == metric and f.run_id == run and f.workload in ("*", None)
                   and f.value is not None]
            if not sel:
                continue
            verdicts = [f.verdict for f in sel]
            worst = next((v for v in ("fail", "warn", "pass") if v in verdicts), verdicts[0])
            one = len(sel) == 1
            rows.append({"metric": metric, "run_id": run, "run_started_at": started.get(run),
                         "value": sum(f.value for f in sel) / len(sel), "ci_low": sel[0].ci_low if one else None,
                         "ci_high": sel[0].ci_high if one else None, "verdict": worst})
    now = pd.DataFrame(rows, columns=["metric", "run_id", "run_started_at", "value", "ci_low", "ci_high", "verdict"])
    if previous is not None and not previous.empty:
        previous = previous[~previous["run_id"].isin(current_runs)][now.columns]
        now = pd.concat([previous, now], ignore_index=True) if not now.empty else previous
    if not now.empty:
        now["run_started_at"] = pd.to_datetime(now["run_started_at"], utc=True)
        now = now.sort_values(["metric", "run_started_at"], kind="stable").reset_index(drop=True)
    return now


def _ceiling_frame(summary: pd.DataFrame, runs: list[str]) -> pd.DataFrame:
    sub = summary[summary["run_id"].isin(runs)].copy()
    sub["ceiling_len"] = sub["ceiling_len_mid"]
    sub["ceiling_source"] = ["exact" if m in ("cap-accept", "static") else "estimate" for m in sub["mode"]]
    sub["mode"] = sub["mode"].fillna("unknown")
    return sub[["run_id", "mode", "workload", "mean_acc_len", "ceiling_len", "ceiling_len_lo", "ceiling_len_hi",
                "ceiling_source", "utilisation"]]


def _interval_frame(figures: list[Figure], metric: str, summary: pd.DataFrame, baseline_runs: list[str]
                    ) -> pd.DataFrame:
    rows = [{"run_id": f.run_id, "role": "current", "workload": f.workload, "value": f.value,
             "ci_low": f.ci_low, "ci_high": f.ci_high} for f in figures if f.metric == metric and f.workload]
    base = summary[summary["run_id"].isin(baseline_runs)]
    for r in base.to_dict("records"):
        rows.append({"run_id": r["run_id"], "role": "baseline", "workload": r["workload"], "value": r[metric],
                     "ci_low": r[f"{metric}_ci95_low"], "ci_high": r[f"{metric}_ci95_high"]})
    return pd.DataFrame(rows, columns=["run_id", "role", "workload", "value", "ci_low", "ci_high"])


def _forest_frame(figures: list[Figure]) -> pd.DataFrame:
    rows = []
    for f in figures:
        d = f.drift
        if d is None or d.verdict not in ("pass", "improved", "warn", "fail") or not d.min_delta:
            continue
        if f.workload not in (None, "*") and d.verdict == "pass" and not (f.threshold and f.threshold.in_scope):
            continue  # keep the chart legible: per-workload rows only when in scope or not passing
        rows.append({"label": f"{f.metric} · {f.label}", "delta": d.delta,
                     "delta_low": d.delta_ci[0] if d.delta_ci[0] is not None else d.delta,
                     "delta_high": d.delta_ci[1] if d.delta_ci[1] is not None else d.delta,
                     "min_delta": d.min_delta, "better": info(f.metric).better, "verdict": d.verdict})
    return pd.DataFrame(rows, columns=["label", "delta", "delta_low", "delta_high", "min_delta", "better", "verdict"])


def newest_sweep(points: pd.DataFrame) -> pd.DataFrame:
    """The rows of the most recently started sweep among ``sweep_points`` rows (empty when none)."""
    if points.empty:
        return points
    newest = points.sort_values("started_at", kind="stable")["sweep_id"].iloc[-1]
    return points[points["sweep_id"] == newest].reset_index(drop=True)


def sweep_charts(sweep: pd.DataFrame | None) -> list[Chart]:
    """Fig. 1 and Fig. 3 of one sweep, one pair per clock (a figure never mixes clocks)."""
    out: list[Chart] = []
    if sweep is None or sweep.empty:
        return out
    for clock, sub in sweep.groupby("clock", sort=True):
        name = _slug(f"{sub['sweep_id'].iloc[0]}-{clock}")
        out.append(Chart(f"sweep-fig1-{name}", "throughput", None, uc.sweep_throughput(sub)))
        out.append(Chart(f"sweep-fig3-{name}", "throughput", None, uc.trim_gap_by_batch(uc.trim_gap_frame(sub))))
    return out


def build_charts(*, runs: list[str], baselines: dict[str, list[str]], figures: list[Figure], calibration,
                 ceiling, costmodel, sts, history: pd.DataFrame, limits: dict[str, tuple[float | None, str | None]],
                 sweep: pd.DataFrame | None = None) -> list[Chart]:
    """The report's charts in page order (``sweep``: the newest sweep's ``sweep_points`` rows, for Fig. 1 and 3)."""
    out: list[Chart] = []
    for run in runs:
        if run not in calibration.labels:
            continue
        rows = calibration.rows[calibration.rows["run_id"] == run]
        out.append(Chart(f"calibration-metrics-{_slug(run)}", "calibration", run,
                         uc.calibration_metrics(rows, metrics=("ece", "debiased_ece", "brier", "auroc"),
                                                color_by="workload")))
        bins = calibration.bins[calibration.bins["run_id"] == run]
        out.append(Chart(f"reliability-{_slug(run)}", "calibration", run,
                         uc.reliability_diagram(bins, color_by="workload")))
        label_bins = calibration.label_bins[calibration.label_bins["run_id"] == run]
        if label_bins["labels"].nunique() > 1:
            out.append(Chart(f"reliability-by-labels-{_slug(run)}", "calibration", run,
                             uc.reliability_diagram(label_bins, color_by="labels")))
    if not ceiling.summary.empty:
        drawn_base = list(dict.fromkeys(b for run in runs for b in baselines.get(run, [])))[-_MAX_BASELINE_RUNS_DRAWN:]
        frame = _ceiling_frame(ceiling.summary, [*runs, *drawn_base])
        if not frame.empty:
            out.append(Chart("accept-vs-ceiling", "ceiling", None, uc.accept_vs_ceiling(frame)))
        limit, kind = limits.get("utilisation", (None, None))
        intervals = _interval_frame(figures, "utilisation", ceiling.summary, drawn_base)
        if not intervals.empty:
            out.append(Chart("utilisation-intervals", "ceiling", None, rc.metric_intervals(
                intervals, title="Utilisation against the ceiling per workload, with 95% intervals",
                y_title="utilisation (accepted / full-block, %)", limit=limit, limit_kind=kind)))
    if not ceiling.validation.empty:
        out.append(Chart("estimator-coverage", "estimator", None, uc.validation_coverage(ceiling.validation)))
        out.append(Chart("estimator-bias", "estimator", None, uc.validation_bias(ceiling.validation)))
    if not costmodel.errors.empty:
        out.append(Chart("costmodel-error", "costmodel", None, uc.error_by_batch(costmodel.errors)))
    if not sts.frame.empty:
        for run, sub in sts.frame.groupby("run_id", sort=False):
            out.append(Chart(f"sts-{_slug(str(run))}", "sts", str(run),
                             uc.sts_before_after(sub.drop(columns=["run_id"]))))
    out += sweep_charts(sweep)
    forest = _forest_frame(figures)
    if not forest.empty:
        out.append(Chart("drift", "drift", None, rc.drift_forest(forest)))
    if history is not None and not history.empty:
        present = [m for m in HISTORY_METRICS if m in set(history["metric"])]
        out.append(Chart("history", "history", None, rc.report_history(history, metrics=present)))
    return out
