"""Throughput charts (the write-up's Fig. 1 and Fig. 3), from the ``ui_throughput`` frame."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dspark_obs.ui.charts._base import as_frame, legend_right, new_figure, no_data, require_columns, sorted_workloads
from dspark_obs.ui.palette import mode_color, mode_dash, mode_symbol

__all__ = ["throughput_curves", "per_user_by_workload"]


def _method(sub: pd.DataFrame) -> str:
    value = sub["method"].iloc[0] if "method" in sub.columns else None
    return str(value if pd.notna(value) else sub["mode"].iloc[0])


def throughput_curves(data) -> go.Figure:
    """Total throughput vs per-user tok/s, one curve per run over its concurrencies.

    Columns: run_id, mode, method, workload ('*' rows are used), concurrency,
    per_user_tok_s, throughput_tok_s, mean_accept_length, requests.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "mode", "method", "workload", "concurrency", "per_user_tok_s",
                         "throughput_tok_s", "mean_accept_length", "requests"], "throughput_curves")
    fig = new_figure(
        "Total throughput vs per-user speed", "per-user speed (tokens/s per request)",
        "total throughput (tokens/s)",
        "One curve per run across driver concurrency (labels: accept length tokens/step); up and to the right "
        "is better. Colour and dash follow the method: compact, no-trim, static, cap-accept.", height=460)
    if not df.empty:
        df = df[(df["workload"] == "*") & df["throughput_tok_s"].notna()]
    if df.empty:
        return no_data(fig)
    for run, sub in df.groupby("run_id", sort=False):
        sub = sub.sort_values("concurrency")
        method = _method(sub)
        fig.add_scatter(
            x=sub["per_user_tok_s"], y=sub["throughput_tok_s"], mode="lines+markers+text",
            name=f"{run} ({method})", line=dict(color=mode_color(method), dash=mode_dash(method), width=2),
            marker=dict(symbol=mode_symbol(method), size=9, color=mode_color(method)),
            text=[f"{a:.2f}" if pd.notna(a) else "" for a in sub["mean_accept_length"]],
            textposition="top center", textfont=dict(size=11, color=mode_color(method)),
            customdata=sub[["concurrency", "requests", "mean_accept_length"]].to_numpy(),
            hovertemplate="concurrency %{customdata[0]} (%{customdata[1]} requests)<br>per-user %{x:.1f} tok/s, "
                          "total %{y:.0f} tok/s<br>accept length %{customdata[2]:.2f}<extra>" + str(run) + "</extra>")
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    return fig


def per_user_by_workload(data) -> go.Figure:
    """Per-user tok/s against driver concurrency, one panel per workload, one line per run.

    Columns: run_id, mode, method, workload, concurrency, per_user_tok_s, mean_accept_length.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "mode", "method", "workload", "concurrency", "per_user_tok_s",
                         "mean_accept_length"], "per_user_by_workload")
    if not df.empty:
        df = df[df["workload"] != "*"]
    workloads = sorted_workloads(df["workload"]) if not df.empty else []
    fig = make_subplots(rows=1, cols=max(len(workloads), 1), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=workloads or None)
    new_figure("Per-user speed by workload and concurrency", "driver concurrency (requests in flight)",
               "per-user speed (tokens/s per request)",
               "Fig. 3 of the write-up: per workload, how the methods compare as the batch grows; trimming pays "
               "most where drafts are hard (poetry) and costs least where they are easy (gsm8k).", fig=fig)
    if not workloads:
        return no_data(fig)
    seen = set()
    for col, workload in enumerate(workloads, start=1):
        for run, sub in df[df["workload"] == workload].groupby("run_id", sort=False):
            sub = sub.sort_values("concurrency")
            method = _method(sub)
            fig.add_scatter(
                x=sub["concurrency"], y=sub["per_user_tok_s"], mode="lines+markers", name=f"{run} ({method})",
                legendgroup=str(run), showlegend=run not in seen,
                line=dict(color=mode_color(method), dash=mode_dash(method)),
                marker=dict(symbol=mode_symbol(method), size=8, color=mode_color(method)),
                customdata=sub["mean_accept_length"],
                hovertemplate="concurrency %{x}: %{y:.1f} tok/s, accept length %{customdata:.2f}"
                              "<extra>" + str(run) + "</extra>", row=1, col=col)
            seen.add(run)
        fig.update_xaxes(title_text="driver concurrency (requests in flight)", row=1, col=col)
    fig.update_yaxes(rangemode="tozero")
    return legend_right(fig)
