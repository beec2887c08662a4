"""Charts of the confidence head's calibration: reliability diagrams, metrics by position, STS.

Inputs: the ``ui_calibration_bins`` and ``ui_calibration`` frames, and a
before/after table of an STS fit.  ``color_by`` is ``"labels"`` (observed,
reconstructed, companion side by side: the survivorship bias of a compact
run's observed labels shows as their gap) or ``"workload"``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dspark_obs.ui.charts.base import (as_frame, draw_limit, legend_right, new_figure, no_data, require_columns,
                                        tidy_legend,
                                        sorted_workloads)
from dspark_obs.ui.palette import label_color, workload_color

__all__ = ["reliability_diagram", "calibration_metrics", "sts_before_after", "recalibration_held_out",
           "LABEL_ORDER", "METRICS", "RECALIBRATION_ORDER"]

LABEL_ORDER = ("observed", "reconstructed", "companion")
METRICS = {
    "ece": ("ECE (lower is better)", True),
    "brier": ("Brier (lower is better)", False),
    "auroc": ("AUROC (higher is better)", False),
    "log_loss": ("log loss (lower is better)", False),
    "debiased_ece": ("debiased ECE (lower is better)", True),
    "mce": ("MCE (lower is better)", True),
}
"""Metric column -> (panel title, shown as a percentage)."""


RECALIBRATION_ORDER = ("none", "sts", "platt", "isotonic", "beta")
_RECAL_COLORS = {"none": "#BDBDBD", "sts": "#737373", "platt": "#1F3B73", "isotonic": "#3A8F5C", "beta": "#C2571A"}


def _groups(df: pd.DataFrame, color_by: str) -> list[str]:
    if color_by == "labels":
        present = set(df["labels"])
        return [g for g in LABEL_ORDER if g in present] + sorted(present - set(LABEL_ORDER))
    if color_by == "workload":
        return sorted_workloads(df["workload"])
    raise ValueError(f"color_by must be 'labels' or 'workload', got {color_by!r}")


def _color(color_by: str, group: str) -> str:
    return label_color(group) if color_by == "labels" else workload_color(group)


def reliability_diagram(data, *, color_by: str = "labels", max_positions: int = 8, count_row: bool = True) -> go.Figure:
    """Per position k: mean predicted survival vs observed rate per bin, with bin counts below.

    Columns: position, labels, workload, mean_predicted, observed_rate, count
    (and bin_lo, bin_hi for the count bars' widths).  Pass one run and one
    workload (``color_by="labels"``) or one label kind (``color_by="workload"``).
    ``count_row=False`` leaves out the bottom row of bin counts (marker sizes and hovers still carry them):
    half the axes, which is most of what a browser spends drawing this figure.
    """
    df = as_frame(data)
    require_columns(df, ["position", "labels", "workload", "mean_predicted", "observed_rate", "count"],
                    "reliability_diagram")
    positions = sorted(int(p) for p in set(df["position"]))[:max_positions] if not df.empty else []
    cols = max(len(positions), 1)
    rows = 2 if count_row else 1
    fig = make_subplots(rows=rows, cols=cols, shared_xaxes=True, shared_yaxes="rows",
                        row_heights=[0.72, 0.28] if count_row else None, vertical_spacing=0.06, horizontal_spacing=0.02,
                        subplot_titles=[f"k = {k}" for k in positions] or None)
    new_figure("Reliability of survival S_k per draft position", None, None,
               "Points on the diagonal are calibrated; below it the head is over-confident. " + (
                   "Bottom row: request-steps per bin (log scale), so sparse bins can be told from real "
                   "miscalibration." if count_row else
                   "Marker area grows with the request-steps per bin (hover for the count), so sparse bins can "
                   "be told from real miscalibration."),
               height=540 if count_row else 420, fig=fig)
    fig.update_yaxes(title_text="observed rate (first k survive)", row=1, col=1)
    if count_row:
        fig.update_yaxes(title_text="steps per bin", row=2, col=1)
    fig.update_xaxes(title_text="predicted survival S_k", row=rows, col=(cols + 1) // 2)
    if not positions:
        return no_data(fig)
    groups = _groups(df, color_by)
    for col, k in enumerate(positions, start=1):
        fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color="#BDBDBD", dash="dash", width=1),
                        showlegend=False, hoverinfo="skip", row=1, col=col)
        for g in groups:
            sub = df[(df["position"] == k) & (df[color_by] == g)].sort_values("mean_predicted")
            if sub.empty:
                continue
            color = _color(color_by, g)
            counts = sub["count"].astype(float)
            fig.add_scatter(
                x=sub["mean_predicted"], y=sub["observed_rate"], mode="lines+markers", name=str(g),
                legendgroup=str(g), showlegend=col == 1, line=dict(color=color, width=1.5),
                marker=dict(size=5 + 9 * np.sqrt(counts / max(float(counts.max()), 1.0)), color=color),
                customdata=counts, row=1, col=col,
                hovertemplate=f"k={k} " + str(g) + ": predicted %{x:.3f}, observed %{y:.3f}"
                              "<br>%{customdata:.0f} steps<extra></extra>")
            if count_row:
                fig.add_scatter(x=sub["mean_predicted"], y=counts, mode="lines+markers", name=str(g),
                                line=dict(color=color, width=1.2), marker=dict(size=3, color=color),
                                legendgroup=str(g), showlegend=False, row=2, col=col,
                                hovertemplate=f"k={k} " + str(g) + ": %{y:.0f} steps<extra></extra>")
        for row in range(1, rows + 1):
            fig.update_xaxes(range=[0, 1], tickvals=[0, 0.5, 1], row=row, col=col)
    fig.update_yaxes(range=[0, 1.02], row=1)
    if count_row:
        top = float(np.log10(max(float(df["count"].max()), 1.0))) + 0.2
        fig.update_yaxes(type="log", range=[-0.1, top], row=2)
    return legend_right(fig)


def calibration_metrics(data, *, metrics=("ece", "brier", "auroc"), color_by: str = "labels",
                        limits: dict | None = None) -> go.Figure:
    """Calibration metrics by draft position, one panel per metric; ECE with its bootstrap CI.

    Columns: position, labels, workload, the metric columns, and ece_ci_lo /
    ece_ci_hi for the ECE error bars.  Pass one run and one workload
    (``color_by="labels"``) or one label kind (``color_by="workload"``).
    ``limits``: ``{metric: (value, 'max' | 'min')}``, the thresholds a report gates on, drawn in their panels.
    """
    df = as_frame(data)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; choose from {sorted(METRICS)}")
    require_columns(df, ["position", "labels", "workload", *metrics], "calibration_metrics")
    fig = make_subplots(rows=1, cols=len(metrics), horizontal_spacing=0.08,
                        subplot_titles=[METRICS[m][0] for m in metrics] if len(metrics) > 1 else None)
    new_figure("Calibration by draft position" if len(metrics) > 1 else "ECE of survival S_k by draft position",
               "draft position k", METRICS[metrics[0]][0].split(" (")[0] + (" (%)" if METRICS[metrics[0]][1] else ""),
               "Each label mode scores the same predictions against a different truth: a compact run's observed "
               "labels drop the censored tails, so their gap to companion/reconstructed is the survivorship bias. "
               "ECE bars: 95% request-bootstrap CI.",
               height=400, fig=fig)
    if df.empty:
        return no_data(fig)
    groups = _groups(df, color_by)
    for col, metric in enumerate(metrics, start=1):
        for g in groups:
            sub = df[df[color_by] == g].sort_values("position")
            if sub.empty or sub[metric].isna().all():
                continue
            error = None
            if metric == "ece" and {"ece_ci_lo", "ece_ci_hi"} <= set(sub) and sub["ece_ci_lo"].notna().any():
                error = dict(type="data", array=(sub["ece_ci_hi"] - sub["ece"]).clip(lower=0),
                             arrayminus=(sub["ece"] - sub["ece_ci_lo"]).clip(lower=0), thickness=1.2, width=4)
            fig.add_scatter(x=sub["position"], y=sub[metric], mode="lines+markers", name=str(g),
                            legendgroup=str(g), showlegend=col == 1, error_y=error,
                            line=dict(color=_color(color_by, g)), marker=dict(size=7),
                            hovertemplate="k=%{x}: %{y:.4f}<extra>" + str(g) + "</extra>", row=1, col=col)
        fig.update_xaxes(dtick=1, title_text="draft position k", row=1, col=col)
        if METRICS[metric][1]:
            fig.update_yaxes(tickformat=".1%", rangemode="tozero", row=1, col=col)
        value, kind = (limits or {}).get(metric, (None, None))
        draw_limit(fig, value, kind, row=1, col=col, percent=bool(METRICS[metric][1]))
    return legend_right(fig) if len(metrics) > 1 else fig


def sts_before_after(data) -> go.Figure:
    """ECE of survival per position: raw head, as served, and after Sequential Temperature Scaling.

    Columns: position, ece_raw, ece_after, and optionally ece_served and temperature.
    """
    df = as_frame(data)
    require_columns(df, ["position", "ece_raw", "ece_after"], "sts_before_after")
    fig = new_figure(
        "STS: ECE per position before and after", "draft position k", "ECE of survival S_k (%)",
        "Sequential Temperature Scaling fits one temperature per position (c_k = sigmoid(raw_k / T_k)); the "
        "paper reports ECE 3-8% raw and about 1% after. Labels above the bars: the fitted T_k.")
    if df.empty:
        return no_data(fig)
    series = [("ece_raw", "raw head (T = 1)", "#BDBDBD"), ("ece_served", "as served", "#737373"),
              ("ece_after", "after STS", "#1F3B73")]
    for column, name, color in series:
        if column not in df.columns or df[column].isna().all():
            continue
        text = None
        if column == "ece_after" and "temperature" in df.columns:
            text = [f"T={t:.2f}" if pd.notna(t) else "" for t in df["temperature"]]
        fig.add_bar(x=df["position"], y=df[column], name=name, marker_color=color, text=text,
                    textposition="outside", hovertemplate="k=%{x}: %{y:.2%}<extra>" + name + "</extra>")
    fig.update_layout(barmode="group")
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(tickformat=".1%", rangemode="tozero")
    return tidy_legend(fig)


def recalibration_held_out(data, *, metric: str = "ece") -> go.Figure:
    """Held-out ECE (or Brier) of survival per position after each recalibration map, side by side.

    Columns: position, method, and the metric (with ece_ci_lo / ece_ci_hi for
    the ECE's error bars); pass one run, one label kind and one workload.
    """
    if metric not in ("ece", "brier"):
        raise ValueError(f"metric must be 'ece' or 'brier', got {metric!r}")
    df = as_frame(data)
    require_columns(df, ["position", "method", metric], "recalibration_held_out")
    fig = new_figure(
        f"Recalibration, held out: {'ECE' if metric == 'ece' else 'Brier'} per position", "draft position k",
        ("ECE of survival S_k (%)" if metric == "ece" else "Brier score"),
        "Each map is fitted on half of the requests and scored on the other half. STS (the only map SGLang "
        "0.5.23 loads) rescales logits; Platt, isotonic and beta can also remove a bias. ECE bars: 95% "
        "request-bootstrap CI.")
    if df.empty:
        return no_data(fig)
    present = set(df["method"])
    for method in [m for m in RECALIBRATION_ORDER if m in present] + sorted(present - set(RECALIBRATION_ORDER)):
        sub = df[df["method"] == method].sort_values("position")
        error = None
        if metric == "ece" and {"ece_ci_lo", "ece_ci_hi"} <= set(sub) and sub["ece_ci_lo"].notna().any():
            error = dict(type="data", array=(sub["ece_ci_hi"] - sub["ece"]).clip(lower=0),
                         arrayminus=(sub["ece"] - sub["ece_ci_lo"]).clip(lower=0), thickness=1.2, width=3)
        fig.add_bar(x=sub["position"], y=sub[metric], name=method, error_y=error,
                    marker_color=_RECAL_COLORS.get(method, "#999999"),
                    hovertemplate="k=%{x}: %{y:.4f}<extra>" + method + "</extra>")
    fig.update_layout(barmode="group")
    fig.update_xaxes(dtick=1)
    if metric == "ece":
        fig.update_yaxes(tickformat=".1%", rangemode="tozero")
    return tidy_legend(fig)
