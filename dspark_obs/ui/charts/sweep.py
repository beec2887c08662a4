"""The write-up's Fig. 1 and Fig. 3 from a concurrency sweep (the ``sweep_points`` frame).

Fig. 1: total throughput against per-user speed, one curve per method over the
sweep's concurrencies, one panel per workload.  Fig. 3: how much compact gains
over no-trim as the batch grows — the gap the write-up explains by verified
tokens costing more in a larger batch.  Both name the clock they are on.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dspark_obs.ui.charts.base import (as_frame, clock_of, legend_right, log2_ticks, new_figure, no_data,
                                        require_columns, sorted_workloads)
from dspark_obs.ui.palette import mode_color, mode_dash, mode_symbol, workload_color

__all__ = ["METHOD_ORDER", "sweep_throughput", "trim_gap_frame", "trim_gap_by_batch"]

METHOD_ORDER = ("no-spec", "fixed-window", "no-trim", "compact")
_POINT_COLUMNS = ["sweep_id", "method", "workload", "concurrency", "clock", "per_user_tok_s", "throughput_tok_s"]


def _methods(values) -> list[str]:
    present = list(dict.fromkeys(str(v) for v in values))
    return [m for m in METHOD_ORDER if m in present] + [m for m in present if m not in METHOD_ORDER]


def sweep_throughput(data) -> go.Figure:
    """Fig. 1: total throughput vs per-user tok/s, a curve per method across concurrency, a panel per workload.

    Columns: sweep_id, method, workload, concurrency, clock, per_user_tok_s,
    throughput_tok_s (one sweep; the ``sweep_points`` canned query).
    """
    df = as_frame(data)
    require_columns(df, _POINT_COLUMNS, "sweep_throughput")
    clock = clock_of(df, "sweep_throughput")
    workloads = sorted_workloads(df["workload"]) if not df.empty else []
    fig = make_subplots(rows=1, cols=max(len(workloads), 1), horizontal_spacing=0.08,
                        subplot_titles=workloads or None)
    new_figure(f"Total throughput vs per-user speed across concurrency ({clock})", None, None,
               f"Fig. 1 of the write-up, on the {clock}: each point is one run of the sweep at one driver "
               "concurrency (the label), one curve per method; up and to the right is better. Speculation pays at "
               "low concurrency; as the batch grows verified tokens cost more and trimming keeps compact ahead.",
               height=480, fig=fig)
    if not workloads:
        return no_data(fig, "No sweep: run dspark-obs sweep (or dspark-obs demo --sweep)")
    shown: set[str] = set()
    for col, workload in enumerate(workloads, start=1):
        sub_w = df[df["workload"] == workload]
        for method in _methods(sub_w["method"]):
            sub = sub_w[sub_w["method"] == method].sort_values("concurrency")
            fig.add_scatter(
                x=sub["per_user_tok_s"], y=sub["throughput_tok_s"], mode="lines+markers", name=method,
                legendgroup=method, showlegend=method not in shown,
                line=dict(color=mode_color(method), dash=mode_dash(method), width=2),
                marker=dict(symbol=mode_symbol(method), size=8, color=mode_color(method)),
                customdata=sub[["concurrency"]].to_numpy(),
                hovertemplate="concurrency %{customdata[0]}<br>per-user %{x:.1f} tok/s, total %{y:.0f} tok/s"
                              "<extra>" + f"{method} · {workload}" + "</extra>", row=1, col=col)
            shown.add(method)
        fig.update_xaxes(title_text=f"per-user tok/s ({clock})", type="log", row=1, col=col)
        fig.update_yaxes(title_text=f"total tok/s ({clock})" if col == 1 else None, row=1, col=col)
    return legend_right(fig)


def trim_gap_frame(data) -> pd.DataFrame:
    """Compact against no-trim at each (sweep, workload, concurrency): both throughputs and the relative gap.

    In: ``sweep_points`` rows.  Out columns: sweep_id, workload, concurrency,
    clock, compact_tok_s, no_trim_tok_s, gap (compact / no-trim - 1; 0 = equal).
    """
    df = as_frame(data)
    require_columns(df, _POINT_COLUMNS, "trim_gap_frame")
    out_cols = ["sweep_id", "workload", "concurrency", "clock", "compact_tok_s", "no_trim_tok_s", "gap"]
    if df.empty:
        return pd.DataFrame(columns=out_cols)
    keys = ["sweep_id", "workload", "concurrency", "clock"]
    both = df[df["method"].isin(["compact", "no-trim"])]
    wide = both.pivot_table(index=keys, columns="method", values="throughput_tok_s", aggfunc="mean")
    if not {"compact", "no-trim"} <= set(wide.columns):
        return pd.DataFrame(columns=out_cols)
    wide = wide.dropna(subset=["compact", "no-trim"]).reset_index()
    wide.columns.name = None
    wide = wide.rename(columns={"compact": "compact_tok_s", "no-trim": "no_trim_tok_s"})
    wide["gap"] = wide["compact_tok_s"] / wide["no_trim_tok_s"].where(wide["no_trim_tok_s"] > 0, np.nan) - 1.0
    return wide[out_cols].sort_values(["sweep_id", "workload", "concurrency"]).reset_index(drop=True)


def trim_gap_by_batch(data) -> go.Figure:
    """Fig. 3: compact's throughput gain over no-trim against batch size, one line per workload.

    Columns: the :func:`trim_gap_frame` output (one sweep).
    """
    df = as_frame(data)
    require_columns(df, ["workload", "concurrency", "clock", "compact_tok_s", "no_trim_tok_s", "gap"],
                    "trim_gap_by_batch")
    clock = clock_of(df, "trim_gap_by_batch")
    fig = new_figure(
        f"Compact vs no-trim across batch size ({clock})", "batch size (driver concurrency, requests in flight)",
        f"compact throughput gain over no-trim (%, {clock})",
        f"Fig. 3 of the write-up, throughput on the {clock}: at batch 1 verified tokens are nearly free and compact "
        "matches no-trim; as the batch grows each verified token costs more, so trimming the unlikely tail pays, "
        "earlier and more where drafts are hard (low acceptance).", height=440)
    if df.empty:
        return no_data(fig, "No compact/no-trim pair in the sweep: sweep both methods")
    for workload in sorted_workloads(df["workload"]):
        sub = df[df["workload"] == workload].sort_values("concurrency")
        fig.add_scatter(
            x=sub["concurrency"], y=sub["gap"], mode="lines+markers", name=str(workload),
            line=dict(color=workload_color(workload), width=2), marker=dict(size=8, color=workload_color(workload)),
            customdata=sub[["compact_tok_s", "no_trim_tok_s"]].to_numpy(),
            hovertemplate="batch %{x}: %{y:+.1%}<br>compact %{customdata[0]:.0f} tok/s, no-trim "
                          "%{customdata[1]:.0f} tok/s<extra>" + str(workload) + "</extra>")
    fig.add_hline(y=0, line=dict(color="#8A8A8A", width=1, dash="dot"))
    fig.update_xaxes(**log2_ticks(df["concurrency"]))
    fig.update_yaxes(tickformat="+.0%")
    return legend_right(fig)
