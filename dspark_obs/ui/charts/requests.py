"""Charts of one request: its step timeline, confidences and survival, and token logprobs.

Inputs: the ``ui_request_steps`` frame (one row per decode step of the
request) and the ``ui_request_tokens`` frame (one row per committed token).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dspark_obs.ui.charts.base import as_frame, new_figure, no_data, require_columns, tidy_legend
from dspark_obs.ui.palette import TOKEN_SOURCE_COLORS, workload_color

__all__ = ["request_timeline", "confidence_heatmap", "token_logprobs"]

_WINDOW_LINE = "#FDB863"  # light orange: readable on the blue heatmap, not a workload colour


def request_timeline(data, *, workload: str | None = None, title: str | None = None) -> go.Figure:
    """Per decode step: the window, the accepted drafts, the estimated ceiling and any known truth.

    Columns: step, window, correct_drafts, and optionally ceiling_lo,
    ceiling_mid, ceiling_hi, truth_block, category.
    """
    df = as_frame(data)
    require_columns(df, ["step", "window", "correct_drafts"], "request_timeline")
    fig = new_figure(
        title or "Request timeline: window, accepted drafts and full-block ceiling", "decode step of the request",
        "drafts",
        "Grey: drafts the target verified (window); coloured: drafts accepted; diamonds: the estimated "
        "full-block acceptance with its [lo, hi]; crosses: the truth where known (cap-accept companion).")
    if df.empty:
        return no_data(fig)
    color = workload_color(workload)
    fig.add_bar(x=df["step"], y=df["window"], name="window (verified)", marker=dict(color="#E0E0E0",
                line=dict(color="#9E9E9E", width=0.5)), hovertemplate="step %{x}: window %{y}<extra></extra>")
    fig.add_bar(x=df["step"], y=df["correct_drafts"], name="accepted", marker_color=color, width=0.5,
                hovertemplate="step %{x}: accepted %{y}<extra></extra>")
    if "ceiling_mid" in df.columns and df["ceiling_mid"].notna().any():
        c = df[df["ceiling_mid"].notna()]
        mid = c["ceiling_mid"].astype(float)
        fig.add_scatter(x=c["step"], y=mid, mode="markers", name="ceiling estimate",
                        marker=dict(symbol="diamond", size=7, color="#111111"),
                        error_y=dict(type="data", array=(c["ceiling_hi"] - mid).clip(lower=0),
                                     arrayminus=(mid - c["ceiling_lo"]).clip(lower=0), color="#757575",
                                     thickness=1, width=0),
                        customdata=c[["category"]].to_numpy() if "category" in c.columns else None,
                        hovertemplate="step %{x}: ceiling %{y:.2f}"
                                      + ("<br>%{customdata[0]}" if "category" in c.columns else "")
                                      + "<extra></extra>")
    if "truth_block" in df.columns and df["truth_block"].notna().any():
        t = df[df["truth_block"].notna()]
        fig.add_scatter(x=t["step"], y=t["truth_block"], mode="markers", name="full-block truth",
                        marker=dict(symbol="x-thin", size=9, line=dict(color="#C03A2B", width=2)),
                        hovertemplate="step %{x}: truth %{y}<extra></extra>")
    fig.update_layout(barmode="overlay", bargap=0.1)
    fig.update_yaxes(rangemode="tozero", dtick=1)
    return tidy_legend(fig)


def _matrix(df: pd.DataFrame, column: str) -> np.ndarray:
    rows = [list(v) if v is not None and not (isinstance(v, float) and np.isnan(v)) else [] for v in df[column]]
    gamma = max((len(r) for r in rows), default=0)
    out = np.full((gamma, len(rows)), np.nan)
    for j, r in enumerate(rows):
        out[: len(r), j] = np.asarray(r, dtype=float)
    return out


def confidence_heatmap(data) -> go.Figure:
    """Confidence c_k (top) and survival S_k (bottom) per step and position, with the window drawn on.

    Columns: step, window, correct_drafts, confidence, survival (lists of gamma floats).
    """
    df = as_frame(data)
    require_columns(df, ["step", "window", "correct_drafts", "confidence", "survival"], "confidence_heatmap")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=["confidence c_k (conditional)", "survival S_k = c_1...c_k"])
    new_figure("Confidence and survival per step and draft position", None, "draft position k",
               "Darker cells are drafts the head trusts; the orange line is the window the "
               "scheduler chose (positions below it were verified), the dotted black line the drafts accepted.",
               height=520, fig=fig)
    fig.update_xaxes(title_text="decode step of the request", row=2, col=1)
    fig.update_yaxes(title_text="draft position k", row=2, col=1)
    if df.empty or df["confidence"].isna().all():
        return no_data(fig, "No confidences recorded for this request (static mode sends none)")
    steps = df["step"].to_numpy()
    for row, column in ((1, "confidence"), (2, "survival")):
        z = _matrix(df, column)
        fig.add_heatmap(x=steps, y=np.arange(1, z.shape[0] + 1), z=z, zmin=0, zmax=1, colorscale="Blues",
                        showscale=row == 1, colorbar=dict(title=dict(text="probability"), len=0.9),
                        hovertemplate="step %{x}, k=%{y}: %{z:.3f}<extra>" + column + "</extra>", row=row, col=1)
        fig.add_scatter(x=steps, y=df["window"] + 0.5, mode="lines",
                        line=dict(color=_WINDOW_LINE, width=2.5, shape="hvh"), name="window", showlegend=False,
                        hoverinfo="skip", row=row, col=1)
        fig.add_scatter(x=steps, y=df["correct_drafts"] + 0.5, mode="lines",
                        line=dict(color="#111111", width=1.5, shape="hvh", dash="dot"), name="accepted",
                        showlegend=False, hoverinfo="skip", row=row, col=1)
        fig.update_yaxes(dtick=1, autorange=True, row=row, col=1)
    return tidy_legend(fig)


def token_logprobs(data) -> go.Figure:
    """Target logprob of every committed token, coloured by how it was committed (draft, bonus, prefill).

    Columns: pos, logprob, source, step.
    """
    df = as_frame(data)
    require_columns(df, ["pos", "logprob", "source"], "token_logprobs")
    fig = new_figure(
        "Committed tokens and their target logprobs", "output position (tokens)", "target logprob (nats)",
        "Light bars are accepted drafts, dark bars the target's bonus token ending each step; long negative "
        "bars are tokens the target found unlikely (where drafts tend to be rejected).")
    if df.empty:
        return no_data(fig)
    for source in ("draft", "bonus", "prefill", None):
        sub = df[df["source"].isna()] if source is None else df[df["source"] == source]
        if sub.empty:
            continue
        name = source or "unmatched"
        fig.add_bar(x=sub["pos"], y=sub["logprob"], name=name, marker_color=TOKEN_SOURCE_COLORS.get(name, "#BDBDBD"),
                    customdata=sub[["step"]].to_numpy() if "step" in sub.columns else None,
                    hovertemplate="pos %{x}: %{y:.3f}" + (" (step %{customdata[0]})" if "step" in sub.columns else "")
                                  + "<extra>" + name + "</extra>")
    fig.update_layout(barmode="overlay", bargap=0.05)
    return tidy_legend(fig)
