"""Throughput charts (the write-up's Fig. 1 and Fig. 3), from the ``ui_throughput`` frame."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dspark_obs.ui.charts.base import (as_frame, clock_of, legend_right, log2_ticks, new_figure, no_data,
                                        require_columns, sorted_workloads)
from dspark_obs.ui.palette import mode_color, mode_dash, mode_symbol, workload_color

__all__ = ["throughput_curves", "per_user_by_workload", "latency_percentiles"]


def _method(sub: pd.DataFrame) -> str:
    value = sub["method"].iloc[0] if "method" in sub.columns else None
    return str(value if pd.notna(value) else sub["mode"].iloc[0])


def throughput_curves(data) -> go.Figure:
    """Total throughput vs per-user tok/s, one curve per run over its concurrencies.

    Columns: run_id, mode, method, clock, workload ('*' rows are used), concurrency,
    per_user_tok_s, throughput_tok_s, mean_accept_length, requests (one clock).
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "mode", "method", "workload", "concurrency", "per_user_tok_s",
                         "throughput_tok_s", "mean_accept_length", "requests"], "throughput_curves")
    clock = clock_of(df, "throughput_curves")
    fig = new_figure(
        f"Total throughput vs per-user speed ({clock})", f"per-user speed (tokens/s per request, {clock})",
        f"total throughput (tokens/s, {clock})",
        f"On the {clock}. One curve per run across driver concurrency (labels: accept length tokens/step); up and "
        "to the right is better. Colour and dash follow the method: compact, no-trim, static, cap-accept.",
        height=460)
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
    return legend_right(fig)


def per_user_by_workload(data) -> go.Figure:
    """Per-user tok/s against driver concurrency, one panel per workload, one line per run.

    Columns: run_id, mode, method, clock, workload, concurrency, per_user_tok_s, mean_accept_length.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "mode", "method", "workload", "concurrency", "per_user_tok_s",
                         "mean_accept_length"], "per_user_by_workload")
    clock = clock_of(df, "per_user_by_workload")
    if not df.empty:
        df = df[df["workload"] != "*"]
    workloads = sorted_workloads(df["workload"]) if not df.empty else []
    fig = make_subplots(rows=1, cols=max(len(workloads), 1), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=workloads or None)
    new_figure(f"Per-user speed by workload and concurrency ({clock})", None,
               f"per-user tok/s ({clock})",
               f"On the {clock}; x: driver concurrency (requests in flight). Per workload, how the runs compare as "
               "the batch grows; the sweep's Fig. 3 above isolates compact against no-trim.", fig=fig)
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
        fig.update_xaxes(title_text="concurrency", row=1, col=col,
                         **log2_ticks(df.loc[df["workload"] == workload, "concurrency"]))
    fig.update_yaxes(rangemode="tozero")
    return legend_right(fig)


_LATENCY_KINDS = (("ttft", "time to first token"), ("itl", "inter-token latency"), ("e2e", "end-to-end"))


def latency_percentiles(data) -> go.Figure:
    """p50 / p90 / p99 of TTFT, inter-token and end-to-end latency per run (bars: p50, whiskers to p90 and p99).

    Columns: run_id, clock, workload ('*' rows are used), ttft_p50_s ... e2e_p99_s
    (the ``ui_latency`` canned query; one clock).
    """
    df = as_frame(data)
    cols = [f"{k}_p{q}_s" for k, _ in _LATENCY_KINDS for q in (50, 90, 99)]
    require_columns(df, ["run_id", "clock", "workload", *cols], "latency_percentiles")
    clock = clock_of(df, "latency_percentiles")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, subplot_titles=[t for _, t in _LATENCY_KINDS])
    new_figure(f"Latency percentiles per run ({clock})", None, None,
               f"On the {clock}, in milliseconds: the marker is the median (p50), the open marks p90 and p99. "
               "TTFT and inter-token latency need a server that reports the first token (the emulator does; "
               "SGLang's non-streaming /generate does not): those panels stay empty otherwise.", height=420, fig=fig)
    df = df[df["workload"] == "*"] if not df.empty else df
    if df.empty:
        return no_data(fig)
    for col, (kind, _) in enumerate(_LATENCY_KINDS, start=1):
        for q, symbol, name in ((50, "circle", "p50"), (90, "triangle-up-open", "p90"), (99, "diamond-open", "p99")):
            fig.add_scatter(x=df["run_id"], y=df[f"{kind}_p{q}_s"] * 1e3, mode="markers", name=name,
                            legendgroup=name, showlegend=col == 1,
                            marker=dict(symbol=symbol, size=10 if q == 50 else 9, color=workload_color("*")),
                            hovertemplate="%{x}: %{y:.2f} ms<extra>" + f"{kind} {name}" + "</extra>", row=1, col=col)
        fig.update_yaxes(title_text=f"ms ({clock})", rangemode="tozero", row=1, col=col)
        fig.update_xaxes(type="category", tickangle=-30, row=1, col=col)
    return legend_right(fig)
