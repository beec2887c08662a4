"""Chart builders the report needs that the dashboard has none of yet: intervals, drift, history.

Same conventions as :mod:`dspark_obs.ui.charts` (a frame in, a Plotly figure
out, no query; title, axis titles with units, a one-line caption in
``fig.layout.meta["caption"]``; colours from :mod:`dspark_obs.ui.palette`), so
they can move there as they are — :func:`report_history` is meant for the
dashboard's Overview (frame: the ``report_history`` canned query).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dspark_obs.ui.charts.base import as_frame, new_figure, no_data, require_columns, sorted_workloads
from dspark_obs.ui.palette import workload_color

__all__ = ["VERDICT_COLORS", "verdict_color", "metric_intervals", "drift_forest", "report_history"]

VERDICT_COLORS = {
    "pass": "#2E7D32",          # green
    "improved": "#1565C0",      # blue
    "warn": "#E69F00",          # amber
    "fail": "#C62828",          # red
    "insufficient": "#9E9E9E",
    "info": "#616161",
}


def verdict_color(verdict: str | None) -> str:
    """Colour of a verdict (pass, improved, warn, fail, insufficient, info); grey otherwise."""
    return VERDICT_COLORS.get(str(verdict), "#9E9E9E")


def metric_intervals(data, *, title: str, y_title: str, limit: float | None = None, limit_kind: str | None = None,
                     percent: bool = True) -> go.Figure:
    """One figure per workload with its 95% CI, tonight's run(s) next to the baseline run(s).

    Columns: run_id, role ('current' | 'baseline'), workload, value, ci_low,
    ci_high.  ``limit`` draws the threshold (``limit_kind`` 'max' or 'min').
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "role", "workload", "value", "ci_low", "ci_high"], "metric_intervals")
    side = {"max": "at most", "min": "at least"}.get(str(limit_kind), "")
    fig = new_figure(
        title, "workload", y_title,
        "Points: each run's figure; bars: its 95% interval. Filled markers are the reported run(s), open ones "
        "the baseline" + (f"; the dashed line is the threshold ({side} {limit:.3g})." if limit is not None else "."))
    if df.empty or df["value"].notna().sum() == 0:
        return no_data(fig)
    order = sorted_workloads(df["workload"])
    for (run, role), sub in df.groupby(["run_id", "role"], sort=False):
        sub = sub.set_index("workload").reindex([w for w in order if w in set(sub["workload"])])
        value = sub["value"].astype(float)
        current = role == "current"
        fig.add_scatter(
            x=list(sub.index), y=value, mode="markers", name=f"{run} ({role})",
            marker=dict(size=11 if current else 9, symbol="circle" if current else "diamond-open",
                        color=[workload_color(w) for w in sub.index], line=dict(width=2, color="#111111")),
            error_y=dict(type="data", array=(sub["ci_high"].astype(float) - value).clip(lower=0),
                         arrayminus=(value - sub["ci_low"].astype(float)).clip(lower=0), thickness=1.5, width=6,
                         color="#111111" if current else "#8A8A8A"),
            hovertemplate="%{x}: %{y:.4f}<extra>" + f"{run} ({role})" + "</extra>")
    if limit is not None:
        fig.add_hline(y=limit, line=dict(color=VERDICT_COLORS["fail"], dash="dash", width=1.5),
                      annotation_text=f"threshold {limit:.3g}", annotation_position="top right",
                      annotation_font=dict(size=11, color=VERDICT_COLORS["fail"]))
    fig.update_layout(scattermode="group")
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=order)
    if percent:
        fig.update_yaxes(tickformat=".0%")
    return fig


def drift_forest(data) -> go.Figure:
    """Every drift test as its change against the baseline, in units of the figure's material change.

    Columns: label, delta, delta_low, delta_high, min_delta, better ('lower' |
    'higher'), verdict.  The x axis is ``delta / min_delta`` signed so that right
    is worse: beyond the shaded band (+-1) a change is material, and only a
    significant material change is a verdict.
    """
    df = as_frame(data)
    require_columns(df, ["label", "delta", "delta_low", "delta_high", "min_delta", "better", "verdict"],
                    "drift_forest")
    fig = new_figure(
        "Drift against the baseline", "change in units of the material change (right = worse)", None,
        "One row per drift test. 0 = unchanged; inside the shaded band the change is too small to matter whatever "
        "its significance; bars are 95% intervals. Colour: the verdict after the false-discovery-rate adjustment.",
        height=max(320, 160 + 20 * len(df)))
    if df.empty:
        return no_data(fig, "No drift tests: no baseline")
    df = df.copy()
    sign = np.where(df["better"] == "higher", -1.0, 1.0)
    scale = df["min_delta"].astype(float).where(df["min_delta"].astype(float) > 0, np.nan)
    x = sign * df["delta"].astype(float) / scale
    lo = sign * df["delta_low"].astype(float) / scale
    hi = sign * df["delta_high"].astype(float) / scale
    left, right = np.fmin(lo, hi), np.fmax(lo, hi)
    fig.add_vrect(x0=-1, x1=1, fillcolor="#9E9E9E", opacity=0.15, line_width=0, layer="below")
    fig.add_vline(x=0, line=dict(color="#8A8A8A", width=1))
    for verdict in ("fail", "warn", "improved", "pass"):
        sel = (df["verdict"] == verdict).to_numpy()
        if not sel.any():
            continue
        fig.add_scatter(
            x=x[sel], y=df["label"][sel], mode="markers", name=verdict,
            marker=dict(color=verdict_color(verdict), size=8),
            error_x=dict(type="data", array=(right[sel] - x[sel]).clip(lower=0),
                         arrayminus=(x[sel] - left[sel]).clip(lower=0), color=verdict_color(verdict), thickness=1.2),
            customdata=df[["delta"]][sel].to_numpy(),
            hovertemplate="%{y}: delta %{customdata[0]:+.4f} (%{x:+.2f} x material)<extra>" + verdict + "</extra>")
    labels = list(df["label"])
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=labels, tickmode="array",
                     tickvals=labels, ticktext=labels, autorange="reversed", automargin=True)
    return fig


def report_history(data, *, metrics=None) -> go.Figure:
    """Figures over nights from the ``reports`` table: one panel per metric, one point per run.

    Columns: metric, run_id, run_started_at, value, ci_low, ci_high, verdict
    (the ``report_history`` canned query, or several of its results stacked).
    """
    df = as_frame(data)
    require_columns(df, ["metric", "run_id", "run_started_at", "value", "ci_low", "ci_high", "verdict"],
                    "report_history")
    names = list(metrics) if metrics else list(dict.fromkeys(df["metric"])) if not df.empty else []
    fig = make_subplots(rows=max(len(names), 1), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=names or None)
    new_figure("History of the nightly reports", None, None,
               "One point per reported run (the newest report of each), at the run's start; bars are 95% "
               "intervals; colour is the figure's verdict that night.", height=max(300, 220 * len(names)), fig=fig)
    fig.update_xaxes(title_text="run started (UTC)", row=max(len(names), 1), col=1)
    if not names:
        return no_data(fig, "No reports yet: run dspark-obs report")
    for row, metric in enumerate(names, start=1):
        sub = df[df["metric"] == metric].sort_values("run_started_at")
        if sub.empty:
            continue
        value = sub["value"].astype(float)
        fig.add_scatter(
            x=sub["run_started_at"], y=value, mode="lines+markers", name=metric, showlegend=False,
            line=dict(color="#8A8A8A", width=1), marker=dict(size=9, color=[verdict_color(v) for v in sub["verdict"]]),
            error_y=dict(type="data", array=(sub["ci_high"].astype(float) - value).clip(lower=0),
                         arrayminus=(value - sub["ci_low"].astype(float)).clip(lower=0), color="#BDBDBD"),
            customdata=sub[["run_id", "verdict"]].to_numpy(),
            hovertemplate="%{customdata[0]}: %{y:.4f} (%{customdata[1]})<extra>" + metric + "</extra>",
            row=row, col=1)
    for verdict in ("pass", "warn", "fail"):
        fig.add_scatter(x=[None], y=[None], mode="markers", name=verdict, marker=dict(color=verdict_color(verdict),
                        size=9), hoverinfo="skip")
    return fig
