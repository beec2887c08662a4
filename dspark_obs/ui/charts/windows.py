"""Charts of verify windows and budgets (the write-up's Fig. 4).

Inputs: the ``ui_window_dist`` frame (one row per run, workload and window)
and the ``ui_budget_timeline`` frame.  :func:`window_summary` folds the
distribution into one row per run and workload (pure pandas on a few rows).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dspark_obs.ui.charts.base import (
    as_frame, draw_limit, legend_key, legend_right, new_figure, no_data, require_columns, sorted_workloads, tidy_legend,
)
from dspark_obs.ui.palette import mode_color, mode_dash, mode_pattern, workload_color

__all__ = ["window_summary", "window_by_workload", "verify_len_distribution", "utilisation_by_window",
           "utilisation_by_workload", "budget_timeline", "WRITEUP_MEAN_WINDOW", "WRITEUP_UTILISATION"]

WRITEUP_MEAN_WINDOW = {"gsm8k": 5.24, "arena-hard": 3.78, "poetry": 2.91}
"""Mean window per workload in SGLang's DSpark write-up (DeepSeek-V4-Flash, H200, gamma 6, cap-accept)."""
WRITEUP_UTILISATION = (0.88, 0.97)
"""Utilisation against the ceiling reported in the write-up."""

_DIST_COLUMNS = ["run_id", "mode", "workload", "gamma", "window", "request_steps", "share", "accepted_tokens",
                 "ceiling_tokens", "utilisation", "ceiling_source"]


def window_summary(data) -> pd.DataFrame:
    """One row per (run, workload) from a window distribution.

    Columns out: run_id, mode, workload, gamma, request_steps, mean_window,
    full_window_share, share_le3, utilisation, ceiling_source.

    >>> d = pd.DataFrame({"run_id": ["r"] * 2, "mode": ["cap-accept"] * 2, "workload": ["w"] * 2,
    ...     "gamma": [6, 6], "window": [2, 6], "request_steps": [1, 3], "share": [.25, .75],
    ...     "accepted_tokens": [2, 21], "ceiling_tokens": [4.0, 21.0], "utilisation": [.5, 1.0],
    ...     "ceiling_source": ["exact"] * 2})
    >>> row = window_summary(d).iloc[0]
    >>> float(row.mean_window), float(row.full_window_share), float(row.utilisation)
    (5.0, 0.75, 0.92)
    """
    df = as_frame(data)
    require_columns(df, _DIST_COLUMNS, "window_summary")
    out = []
    for (run, workload), sub in df.groupby(["run_id", "workload"], sort=False):
        n = sub["request_steps"].astype(float)
        total = float(n.sum())
        gamma = int(sub["gamma"].max())
        known = sub[sub["ceiling_tokens"].notna() & sub["utilisation"].notna()]
        ceiling = float(known["ceiling_tokens"].sum())
        accepted = float((known["utilisation"] * known["ceiling_tokens"]).sum())
        out.append({
            "run_id": run, "mode": sub["mode"].iloc[0], "workload": workload, "gamma": gamma,
            "request_steps": int(total),
            "mean_window": float((sub["window"] * n).sum() / total) if total else np.nan,
            "full_window_share": float(n[sub["window"] == gamma].sum() / total) if total else np.nan,
            "share_le3": float(n[sub["window"] <= 3].sum() / total) if total else np.nan,
            "utilisation": round(accepted / ceiling, 12) if ceiling else np.nan,
            "ceiling_source": known["ceiling_source"].iloc[0] if not known.empty else None,
        })
    return pd.DataFrame(out, columns=["run_id", "mode", "workload", "gamma", "request_steps", "mean_window",
                                      "full_window_share", "share_le3", "utilisation", "ceiling_source"])


def _grouped_bars(fig: go.Figure, df: pd.DataFrame, value: str, hover: str, text=None) -> None:
    """Bars per workload (workload colour), one offset group per run (mode pattern), with a legend of runs."""
    order = sorted_workloads(df["workload"])
    for run, sub in df.groupby("run_id", sort=False):
        sub = sub.set_index("workload").reindex([w for w in order if w in set(sub["workload"])])
        mode = str(sub["mode"].iloc[0])
        fig.add_bar(x=list(sub.index), y=sub[value], name=f"{run} ({mode})", offsetgroup=str(run), showlegend=False,
                    marker=dict(color=[workload_color(w) for w in sub.index], pattern_shape=mode_pattern(mode),
                                line=dict(color="white", width=0.5)),
                    text=text(sub) if text else None, textposition="outside",
                    hovertemplate="%{x}: " + hover + "<extra>" + str(run) + "</extra>")
    for run, sub in df.groupby("run_id", sort=False):  # keys after the data: the first trace sets the axis type
        mode = str(sub["mode"].iloc[0])
        legend_key(fig, f"{run} ({mode})", kind="bar", color="#9E9E9E", pattern_shape=mode_pattern(mode),
                   line=dict(color="white", width=0.5))
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=order)


def window_by_workload(summary) -> go.Figure:
    """Mean verify window per workload and run, with the write-up's reference values.

    Columns: run_id, mode, workload, mean_window, full_window_share (from :func:`window_summary`).
    """
    df = as_frame(summary)
    require_columns(df, ["run_id", "mode", "workload", "mean_window", "full_window_share"], "window_by_workload")
    fig = new_figure(
        "Mean verify window per workload", "workload", "mean window (drafts verified per request-step)",
        "How many drafts the scheduler let the target check; labels give the share of full windows. Black "
        "dashes: SGLang's write-up at gamma 6 (gsm8k 5.24, arena-hard 3.78, poetry 2.91).")
    if df.empty:
        return no_data(fig)
    _grouped_bars(fig, df, "mean_window", "%{y:.2f} drafts",
                  text=lambda s: [f"full {v:.0%}" if pd.notna(v) else "" for v in s["full_window_share"]])
    ref = [(w, v) for w, v in WRITEUP_MEAN_WINDOW.items() if w in set(df["workload"])]
    if ref:
        fig.add_scatter(x=[w for w, _ in ref], y=[v for _, v in ref], mode="markers", name="SGLang write-up",
                        marker=dict(symbol="line-ew", size=44, line=dict(color="#111111", width=3)),
                        hovertemplate="%{x}: write-up %{y:.2f}<extra></extra>")
    fig.update_layout(barmode="group", bargap=0.25)
    fig.update_yaxes(rangemode="tozero")
    return tidy_legend(fig)


def verify_len_distribution(data, *, max_runs: int = 4) -> go.Figure:
    """Share of request-steps per window size, per workload; one panel per run (at most ``max_runs``).

    Columns: run_id, mode, workload, window, share, request_steps.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "mode", "workload", "window", "share", "request_steps"],
                    "verify_len_distribution")
    runs = list(dict.fromkeys(df["run_id"]))[:max_runs] if not df.empty else []
    fig = make_subplots(rows=1, cols=max(len(runs), 1), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"{r} ({df.loc[df.run_id == r, 'mode'].iloc[0]})" for r in runs] or None)
    new_figure("Per-step verify-window distribution per workload", None, None,
               "Where the scheduler's windows land: a workload with confident drafts fills the full window, a "
               "hard one stops early (the write-up: ~55% of gsm8k steps at 6, ~80% of poetry at <= 3).",
               fig=fig)
    fig.update_xaxes(title_text="window = verify_len - 1 (drafts verified)", dtick=1)
    fig.update_yaxes(title_text="share of request-steps (%)", tickformat=".0%", row=1, col=1)
    if not runs:
        return no_data(fig)
    seen = set()
    for col, run in enumerate(runs, start=1):
        sub = df[df["run_id"] == run]
        for workload in sorted_workloads(sub["workload"]):
            w = sub[sub["workload"] == workload].sort_values("window")
            fig.add_bar(x=w["window"], y=w["share"], name=workload, legendgroup=workload,
                        showlegend=workload not in seen, marker_color=workload_color(workload),
                        customdata=w["request_steps"],
                        hovertemplate="window %{x}: %{y:.1%} (%{customdata} steps)<extra>" + workload + "</extra>",
                        row=1, col=col)
            seen.add(workload)
    fig.update_layout(barmode="group", bargap=0.15)
    return legend_right(fig)


def utilisation_by_window(data) -> go.Figure:
    """Utilisation against the full-block ceiling per window size, per workload and run.

    Columns: run_id, mode, workload, window, utilisation, request_steps.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "mode", "workload", "window", "utilisation", "request_steps"],
                    "utilisation_by_window")
    fig = new_figure(
        "Utilisation against the ceiling by window", "window = verify_len - 1 (drafts verified)",
        "utilisation (accepted / full-block, %)",
        "Tokens committed over what a full block would commit, for steps with each window: short windows lose "
        "the most when the drafts behind them would have survived (compact: the estimator's ceiling).")
    if df.empty or df["utilisation"].notna().sum() == 0:
        return no_data(fig, "No full-block ceiling known: collect a cap-accept run or run `dspark-obs estimate`")
    for (run, workload), sub in df.groupby(["run_id", "workload"], sort=False):
        sub = sub[sub["utilisation"].notna()].sort_values("window")
        mode = str(sub["mode"].iloc[0]) if not sub.empty else ""
        fig.add_scatter(x=sub["window"], y=sub["utilisation"], mode="lines+markers",
                        name=f"{workload} · {run}", line=dict(color=workload_color(workload), dash=mode_dash(mode)),
                        customdata=sub["request_steps"],
                        hovertemplate="window %{x}: %{y:.1%} (%{customdata} steps)<extra>%{fullData.name}</extra>")
    fig.update_yaxes(tickformat=".0%")
    fig.update_xaxes(dtick=1)
    return tidy_legend(fig)


def utilisation_by_workload(summary, *, limit: float | None = None) -> go.Figure:
    """Utilisation against the full-block ceiling per workload and run, with the write-up's range.

    Columns: run_id, mode, workload, utilisation (from :func:`window_summary`).
    ``limit``: the utilisation the report gates on (its min), drawn.  Bars start at 0.
    """
    df = as_frame(summary)
    require_columns(df, ["run_id", "mode", "workload", "utilisation"], "utilisation_by_workload")
    fig = new_figure(
        "Utilisation against the ceiling per workload", "workload", "utilisation (accepted / full-block, %)",
        "Accepted tokens over what a full-block verify would accept; the shaded band is the write-up's "
        "0.88-0.97. Below it, trimming is leaving tokens on the table.")
    if df.empty or df["utilisation"].notna().sum() == 0:
        return no_data(fig, "No full-block ceiling known: collect a cap-accept run or run `dspark-obs estimate`")
    lo, hi = WRITEUP_UTILISATION
    fig.add_hrect(y0=lo, y1=hi, fillcolor="#9E9E9E", opacity=0.15, line_width=0, layer="below",
                  annotation_text="write-up range", annotation_position="bottom right",
                  annotation_font=dict(size=11, color="#6B6B6B"))
    _grouped_bars(fig, df, "utilisation", "%{y:.1%}",
                  text=lambda s: [f"{v:.1%}" if pd.notna(v) else "" for v in s["utilisation"]])
    fig.update_yaxes(tickformat=".0%", range=[0.0, 1.04])  # a bar's length is its value: from 0
    fig.update_layout(barmode="group", bargap=0.25)
    draw_limit(fig, limit, "min", percent=True)
    return legend_right(fig)


def budget_timeline(data) -> go.Figure:
    """Verify budget k* and batch size over the run (forward_ct buckets), one line per run.

    Columns: run_id, mode, forward_ct, mean_budget, mean_bs.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "mode", "forward_ct", "mean_budget", "mean_bs"], "budget_timeline")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.55, 0.45])
    new_figure("Verify budget and batch size over the run", None, "budget k* (tokens)",
               "The budget k* is how many draft tokens the scheduler verifies on top of one anchor per request; "
               "it should track "
               "the batch size times the drafts worth verifying. Averaged over buckets of steps.",
               height=480, fig=fig)
    fig.update_yaxes(title_text="batch size (requests)", row=2, col=1)
    fig.update_xaxes(title_text="forward_ct (scheduler step counter)", row=2, col=1)
    if df.empty:
        return no_data(fig)
    for run, sub in df.groupby("run_id", sort=False):
        mode = str(sub["mode"].iloc[0])
        style = dict(color=mode_color(mode), dash=mode_dash(mode), width=1.8)
        fig.add_scatter(x=sub["forward_ct"], y=sub["mean_budget"], mode="lines", name=f"{run} ({mode})",
                        legendgroup=str(run), line=style,
                        hovertemplate="forward_ct %{x}: budget %{y:.1f}<extra>" + str(run) + "</extra>",
                        row=1, col=1)
        fig.add_scatter(x=sub["forward_ct"], y=sub["mean_bs"], mode="lines", name=f"{run} ({mode})",
                        legendgroup=str(run), showlegend=False, line=style,
                        hovertemplate="forward_ct %{x}: bs %{y:.1f}<extra>" + str(run) + "</extra>",
                        row=2, col=1)
    fig.update_yaxes(rangemode="tozero")
    return tidy_legend(fig)
