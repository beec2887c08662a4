"""Trimming-health charts: survival-predicted against observed acceptance by draft position."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from dspark_obs.ui.charts.base import as_frame, new_figure, no_data, require_columns, tidy_legend

__all__ = ["expected_vs_actual"]

_COLUMNS = ("run_id", "position", "n", "expected", "actual")


def expected_vs_actual(data: Any) -> go.Figure:
    """Per run and draft position k: mean survival S_k (expected) and the observed share that accepted k.

    ``data``: ``health_by_position`` rows.  Both are over the request-steps that
    verified position k, so a gap is the confidence head's error, not trimming.
    """
    df = as_frame(data)
    require_columns(df, _COLUMNS, "expected_vs_actual")
    fig = new_figure("Expected vs actual acceptance by draft position", "draft position k",
                     "P(drafts 1..k accepted)",
                     "Solid: observed share of request-steps that accepted draft k; dotted: the head's survival "
                     "S_k (expected). Over the request-steps that verified k.", height=380)
    if df.empty:
        return no_data(fig)
    for run, sub in df.sort_values(["run_id", "position"]).groupby("run_id", sort=False):
        text = [f"n {int(n)}" for n in sub["n"]]
        line = fig.add_scatter(x=sub["position"], y=sub["actual"], mode="lines+markers", name=f"{run} actual",
                               text=text, hovertemplate="k %{x}: %{y:.3f} (%{text})<extra></extra>")
        color = line.data[-1].line.color
        fig.add_scatter(x=sub["position"], y=sub["expected"], mode="lines", name=f"{run} expected",
                        line=dict(dash="dot", color=color), hovertemplate="k %{x}: %{y:.3f}<extra></extra>")
    fig.update_yaxes(range=[0, 1.02])
    fig.update_xaxes(dtick=1)
    return tidy_legend(fig)
