"""Charts of the hidden ceiling: accepted vs full-block acceptance, estimate categories, validation.

Inputs are the frames of the ``ui_workloads``, ``ui_ceiling_position``,
``ui_ceiling_categories`` and ``ui_ceiling_validation`` queries (or any frame
with the columns named in each docstring).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dspark_obs.ui.charts.base import (
    as_frame, draw_limit, legend_key, legend_right, new_figure, no_data, require_columns, run_colors, sorted_workloads,
    tidy_legend,
)
from dspark_obs.ui.palette import category_color, mode_dash, mode_pattern, workload_color

__all__ = ["accept_vs_ceiling", "acceptance_by_position", "estimate_categories", "validation_scatter",
           "validation_coverage", "validation_bias", "CATEGORY_ORDER"]

CATEGORY_ORDER = ("exact_in_window", "censored_resolved_exact", "censored_diverged", "censored_eos",
                  "censored_at_end")


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def accept_vs_ceiling(data, *, include_all: bool = False) -> go.Figure:
    """Bars of accepted tokens per request-step, diamonds at the full-block ceiling with its interval.

    Columns: run_id, mode, workload, mean_acc_len, ceiling_len, ceiling_len_lo,
    ceiling_len_hi, ceiling_source, and optionally utilisation.  The '*'
    (all workloads) row is dropped unless ``include_all``.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "mode", "workload", "mean_acc_len", "ceiling_len", "ceiling_len_lo",
                         "ceiling_len_hi", "ceiling_source"], "accept_vs_ceiling")
    fig = new_figure(
        "Accepted vs full-block ceiling per workload", "workload", "tokens committed per request-step",
        "Bars: tokens committed per request-step; diamonds: what a full-block verify would commit (exact in "
        "cap-accept/static runs, estimated in compact runs with its [lo, hi] interval). The gap is what "
        "trimming costs.")
    if not include_all and not df.empty:
        df = df[df["workload"] != "*"]
    if df.empty:
        return no_data(fig)
    order = sorted_workloads(df["workload"])
    sources: set[str] = set()
    for run, sub in df.groupby("run_id", sort=False):
        sub = sub.set_index("workload").reindex([w for w in order if w in set(sub["workload"])])
        mode = str(sub["mode"].iloc[0])
        text = None
        if "utilisation" in sub.columns:
            text = [f"{u:.0%}" if pd.notna(u) else "" for u in sub["utilisation"]]
        fig.add_bar(
            x=list(sub.index), y=sub["mean_acc_len"], name=f"{run} ({mode}): accepted", showlegend=False,
            marker=dict(color=[workload_color(w) for w in sub.index], pattern_shape=mode_pattern(mode),
                        line=dict(color="white", width=0.5)),
            offsetgroup=str(run), legendgroup=str(run), text=text, textposition="inside",
            insidetextanchor="start", textfont=dict(color="white"),
            hovertemplate="%{x}<br>accepted %{y:.3f} tokens/step<extra>" + str(run) + "</extra>")
        known = sub[sub["ceiling_len"].notna()]
        if known.empty:
            continue
        mid = known["ceiling_len"].astype(float)
        lo = known["ceiling_len_lo"].astype(float).fillna(mid)
        hi = known["ceiling_len_hi"].astype(float).fillna(mid)
        source = str(known["ceiling_source"].iloc[0])
        sources.add(source)
        fig.add_scatter(
            x=list(known.index), y=mid, mode="markers", name=f"{run}: full-block ceiling ({source})",
            showlegend=False,
            marker=_ceiling_marker(source),
            error_y=dict(type="data", array=(hi - mid).clip(lower=0), arrayminus=(mid - lo).clip(lower=0),
                         color="#111111", thickness=1.5, width=6),
            offsetgroup=str(run), legendgroup=str(run),
            hovertemplate="%{x}<br>ceiling %{y:.3f} tokens/step<extra>" + str(run) + "</extra>")
    for run, sub in df.groupby("run_id", sort=False):  # keys after the data: the first trace sets the axis type
        legend_key(fig, f"accepted: {run} ({sub['mode'].iloc[0]})", kind="bar", color="#9E9E9E",
                   pattern_shape=mode_pattern(str(sub["mode"].iloc[0])), line=dict(color="white", width=0.5))
    for source in sorted(sources):
        legend_key(fig, f"full-block ceiling ({source}" + (", [lo, hi])" if source == "estimate" else ")"),
                   kind="marker", **_ceiling_marker(source))
    fig.update_layout(barmode="group", scattermode="group", bargap=0.25)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=order)
    fig.update_yaxes(rangemode="tozero")
    return legend_right(fig)


def _ceiling_marker(source: str) -> dict:
    """Exact ceilings (cap-accept, static) filled, estimates open: two sources never share a legend symbol."""
    if source == "exact":
        return dict(symbol="diamond", size=11, color="#111111", line=dict(color="white", width=1))
    return dict(symbol="diamond-open", size=11, color="#111111", line=dict(color="#111111", width=2))


def acceptance_by_position(data) -> go.Figure:
    """Per workload, share of request-steps whose first k drafts were committed vs survive a full block.

    Columns: run_id, mode, workload, position, committed_share,
    full_block_share, full_block_lo, full_block_hi, source.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "mode", "workload", "position", "committed_share", "full_block_share",
                         "full_block_lo", "full_block_hi", "source"], "acceptance_by_position")
    fig = new_figure(
        "Acceptance by draft position: committed vs full block", "draft position k",
        "request-steps whose first k drafts survive (%)",
        "Solid/dashed lines: share whose first k drafts a full-block verify accepts (band = estimate interval); "
        "dotted: share actually committed. The vertical gap at deep positions is what the windows trimmed.")
    if df.empty:
        return no_data(fig)
    for workload in sorted_workloads(df["workload"]):
        legend_key(fig, workload, color=workload_color(workload), width=3)
    for source, mode in df[["source", "mode"]].drop_duplicates().itertuples(index=False):
        label = "full block, exact (cap-accept/static)" if source == "exact" else "full block, estimate ([lo, hi] band)"
        legend_key(fig, f"{label}: {mode}", color="#616161", dash=mode_dash(str(mode)), width=2.5,
                   marker=dict(size=6, symbol="circle", color="#616161"))
    # static's full block is dotted too: the open markers tell committed apart
    legend_key(fig, "committed", color="#616161", dash="dot", width=1.5,
               marker=dict(size=5, symbol="circle-open", color="#616161"))
    for (run, workload), sub in df.groupby(["run_id", "workload"], sort=False):
        sub = sub.sort_values("position")
        color = workload_color(workload)
        mode = str(sub["mode"].iloc[0])
        source = str(sub["source"].iloc[0])
        group = f"{run}/{workload}"
        if source == "estimate":
            fig.add_scatter(x=sub["position"], y=sub["full_block_hi"], mode="lines", line=dict(width=0),
                            legendgroup=group, showlegend=False, hoverinfo="skip")
            fig.add_scatter(x=sub["position"], y=sub["full_block_lo"], mode="lines", line=dict(width=0),
                            fill="tonexty", fillcolor=_rgba(color, 0.18), legendgroup=group, showlegend=False,
                            hoverinfo="skip")
        fig.add_scatter(
            x=sub["position"], y=sub["full_block_share"], mode="lines+markers",
            name=f"{workload} · {run}: full block ({source})", legendgroup=group, showlegend=False,
            line=dict(color=color, dash=mode_dash(mode), width=2.5), marker=dict(size=6),
            hovertemplate="k=%{x}: %{y:.1%}<extra>" + group + " full block</extra>")
        fig.add_scatter(
            x=sub["position"], y=sub["committed_share"], mode="lines+markers",
            name=f"{workload} · {run}: committed", legendgroup=group, showlegend=False,
            line=dict(color=color, dash="dot", width=1.5), marker=dict(size=5, symbol="circle-open"),
            hovertemplate="k=%{x}: %{y:.1%}<extra>" + group + " committed</extra>")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    fig.update_xaxes(dtick=1)
    return legend_right(fig)


def estimate_categories(data) -> go.Figure:
    """Stacked shares of SGLang's estimate categories per workload (and run).

    Columns: run_id, workload, category, request_steps, share.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "workload", "category", "request_steps", "share"], "estimate_categories")
    fig = new_figure(
        "Estimate categories per workload", "workload", "share of request-steps (%)",
        "exact_in_window: the window settled the ceiling; censored_*: the window was fully accepted and the "
        "tail had to be estimated (resolved exactly, diverged from the realised token, ended at EOS or at the "
        "output's end).")
    if df.empty:
        return no_data(fig)
    runs = list(dict.fromkeys(df["run_id"]))
    order = sorted_workloads(df["workload"])
    keys = [(r, w) for r in runs for w in order if ((df["run_id"] == r) & (df["workload"] == w)).any()]
    x = [[k[0] for k in keys], [k[1] for k in keys]] if len(runs) > 1 else [k[1] for k in keys]
    present = [c for c in CATEGORY_ORDER if c in set(df["category"])]
    present += sorted(set(df["category"]) - set(CATEGORY_ORDER))
    for cat in present:
        sub = df[df["category"] == cat].set_index(["run_id", "workload"])
        y = [float(sub.loc[k, "share"]) if k in sub.index else 0.0 for k in keys]
        n = [int(sub.loc[k, "request_steps"]) if k in sub.index else 0 for k in keys]
        fig.add_bar(x=x, y=y, name=cat, marker_color=category_color(cat), customdata=n,
                    hovertemplate="%{y:.1%} (%{customdata} steps)<extra>" + cat + "</extra>")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(tickformat=".0%", range=[0, 1])
    return tidy_legend(fig)


def _bins(df: pd.DataFrame) -> pd.DataFrame:
    """The validation rows per bin of the estimate (an empty frame may have no columns at all)."""
    return df if df.empty else df[df["group_kind"] == "bin"].sort_values(["run_id", "bin"])


def validation_scatter(data) -> go.Figure:
    """Mean estimate vs mean truth over 8 equal-count bins of the estimate (censored steps).

    Columns: run_id, group_kind, bin, n, mean_lo, mean_mid, mean_hi,
    mean_truth, and optionally mean_emu_expected.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "group_kind", "bin", "n", "mean_lo", "mean_mid", "mean_hi", "mean_truth"],
                    "validation_scatter")
    fig = new_figure(
        "Estimated vs true full-block acceptance (censored steps)", "truth: mean full-block accepted drafts",
        "estimate: mean mid (drafts)",
        "One point per equal-count bin of the estimate; on the diagonal the estimate is unbiased. Bars span the "
        "mean [lo, hi] interval; open circles use the emulator's expectation as the truth.")
    bins = _bins(df)
    if bins.empty:
        return no_data(fig, "No binned validation rows") if len(df) else no_data(fig)
    top = float(np.nanmax(bins[["mean_hi", "mean_truth", "mean_mid"]].to_numpy(dtype=float)))
    fig.add_scatter(x=[0, top], y=[0, top], mode="lines", line=dict(color="#9E9E9E", dash="dash"),
                    name="perfect estimate", hoverinfo="skip")
    for run, sub in bins.groupby("run_id", sort=False):
        mid = sub["mean_mid"].astype(float)
        size = 8 + 14 * np.sqrt(sub["n"].astype(float) / max(float(sub["n"].max()), 1.0))
        fig.add_scatter(
            x=sub["mean_truth"], y=mid, mode="markers", name=f"{run}: vs realised truth",
            marker=dict(size=size, color="#111111", opacity=0.85),
            error_y=dict(type="data", array=(sub["mean_hi"] - mid).clip(lower=0),
                         arrayminus=(mid - sub["mean_lo"]).clip(lower=0), color="#9E9E9E", thickness=1),
            customdata=sub[["bin", "n"]].to_numpy(),
            hovertemplate="bin %{customdata[0]} (%{customdata[1]} steps)<br>truth %{x:.3f}, estimate %{y:.3f}"
                          "<extra>" + str(run) + "</extra>")
        if "mean_emu_expected" in sub.columns and sub["mean_emu_expected"].notna().any():
            fig.add_scatter(x=sub["mean_emu_expected"], y=mid, mode="markers",
                            name=f"{run}: vs emulator expectation",
                            marker=dict(size=9, symbol="circle-open", color="#6A51A3", line=dict(width=2)),
                            hovertemplate="expected %{x:.3f}, estimate %{y:.3f}<extra>" + str(run) + "</extra>")
    fig.update_xaxes(range=[-0.1, top * 1.05 + 0.1])
    fig.update_yaxes(range=[-0.1, top * 1.05 + 0.1])
    return tidy_legend(fig)


def validation_coverage(data, *, limit: float | None = None) -> go.Figure:
    """Share of censored steps whose truth lies in the estimate's [lo, hi], per bin of the estimate.

    Columns: run_id, group_kind, bin, n, mean_mid, coverage, and optionally emu_coverage.
    ``limit``: the coverage the report gates on (``estimator_coverage`` min), drawn.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "group_kind", "bin", "n", "mean_mid", "coverage"], "validation_coverage")
    fig = new_figure(
        "Interval coverage by bin of the estimate", "bin of the estimate (mean mid, drafts)",
        "truth inside [lo, hi] (% of steps)",
        "Each bar is one equal-count bin of censored steps; a sound interval covers ~100% of the truths in every "
        "bin. Realised truth: greedy steps (a sampled step's realisation is one draw, judged by the bins' means); "
        "emulator: E[full | window accepted] of every step. A dip marks where the bounds are too tight.")
    bins = _bins(df)
    if bins.empty:
        return no_data(fig, "No binned validation rows") if len(df) else no_data(fig)
    colors = run_colors(bins["run_id"])
    for run, sub in bins.groupby("run_id", sort=False):
        labels = [f"{int(b)}: {m:.2f}" for b, m in zip(sub["bin"], sub["mean_mid"])]
        fig.add_bar(x=labels, y=sub["coverage"], name=f"{run}: realised truth", marker_color=colors[str(run)],
                    customdata=sub["n"], hovertemplate="%{y:.1%} of %{customdata} steps<extra></extra>")
        if "emu_coverage" in sub.columns and sub["emu_coverage"].notna().any():
            fig.add_bar(x=labels, y=sub["emu_coverage"], name=f"{run}: emulator expectation",
                        marker_color="#6A51A3", hovertemplate="%{y:.1%}<extra></extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05])
    draw_limit(fig, limit, "min", percent=True)
    return legend_right(fig)


def validation_bias(data) -> go.Figure:
    """Bias (mean estimate - truth) and MAE of censored steps by category and by workload.

    Columns: run_id, group_kind, group, n, bias, mae.
    """
    df = as_frame(data)
    require_columns(df, ["run_id", "group_kind", "group", "n", "bias", "mae"], "validation_bias")
    fig = new_figure(
        "Estimate bias by category and workload", "group", "drafts (estimate - truth)",
        "Bars: mean signed error of the estimate on censored steps (0 = unbiased); crosses: mean absolute "
        "error. Categories with few steps are noisy (hover for n).")
    if df.empty:
        return no_data(fig)
    sub = df[df["group_kind"].isin(["category", "workload"])]
    if sub.empty:
        return no_data(fig, "No validation rows by category or workload")
    multi = sub["run_id"].nunique() > 1
    x = [sub["group_kind"].tolist(), sub["group"].tolist()]
    colors = [category_color(g) if k == "category" else workload_color(g)
              for k, g in zip(sub["group_kind"], sub["group"])]
    fig.add_bar(x=x, y=sub["bias"], name="bias", showlegend=False, marker_color=colors,
                customdata=sub[["n", "run_id"]].to_numpy(),
                text=[f"n={int(n)}" for n in sub["n"]], textposition="outside", cliponaxis=False,
                hovertemplate="bias %{y:.4f} drafts (%{customdata[0]} steps, %{customdata[1]})<extra></extra>")
    legend_key(fig, "bias (colour: category or workload)", kind="bar", color="#9E9E9E")
    fig.add_scatter(x=x, y=sub["mae"], mode="markers", name="MAE",
                    marker=dict(symbol="x", size=9, color="#111111"),
                    hovertemplate="MAE %{y:.4f} drafts<extra></extra>")
    if multi:
        fig.update_layout(title_text="Estimate bias by category and workload (all selected runs)")
    fig.add_hline(y=0, line=dict(color="#8A8A8A", width=1))
    fig.update_xaxes(type="multicategory")
    return tidy_legend(fig)
