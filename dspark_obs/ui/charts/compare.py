"""Baseline-vs-candidate deltas with their 95% intervals (the ``dspark_obs.compare`` frames)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from dspark_obs.ui.charts.base import as_frame, new_figure, no_data, require_columns, tidy_legend

__all__ = ["compare_deltas"]

_BETTER, _WORSE, _FLAT = "#2E7D32", "#C62828", "#8A8A8A"


def compare_deltas(data, *, clock: str, title: str = "Candidate against baseline") -> go.Figure:
    """Relative change of each headline figure (candidate / baseline - 1) with its 95% interval.

    Columns: label, better ('higher' | 'lower'), baseline, delta, delta_ci_low,
    delta_ci_high.  Green: significantly better; red: significantly worse; grey:
    the interval spans 0.  ``clock``: the clock both runs' times are on (named).
    """
    df = as_frame(data)
    require_columns(df, ["label", "better", "baseline", "delta", "delta_ci_low", "delta_ci_high"], "compare_deltas")
    fig = new_figure(f"{title} ({clock})", f"change against the baseline (%, times on the {clock})", None,
                     f"Times and speeds on the {clock}. Points: candidate / baseline - 1; bars: 95% bootstrap "
                     "intervals over requests. Green is a significant improvement, red a significant regression.",
                     height=max(300, 140 + 34 * len(df)))
    df = df[df["baseline"].astype(float).abs() > 0].dropna(subset=["delta"]) if not df.empty else df
    if df.empty:
        return no_data(fig, "Nothing to compare: pick two runs with finished requests")
    base = df["baseline"].astype(float).abs().to_numpy()
    rel, lo, hi = (df[c].astype(float).to_numpy() / base for c in ("delta", "delta_ci_low", "delta_ci_high"))
    sign = np.where(df["better"] == "higher", 1.0, -1.0)
    significant = lo * hi > 0  # the interval excludes 0
    colors = [(_BETTER if s * r > 0 else _WORSE) if sig else _FLAT for sig, s, r in zip(significant, sign, rel)]
    fig.add_scatter(x=rel, y=df["label"], mode="markers", marker=dict(size=10, color=colors), showlegend=False,
                    error_x=dict(type="data", array=np.clip(hi - rel, 0, None), arrayminus=np.clip(rel - lo, 0, None),
                                 color="#616161", thickness=1.5),
                    hovertemplate="%{y}: %{x:+.1%}<extra></extra>")
    fig.add_vline(x=0, line=dict(color=_FLAT, width=1))
    fig.update_xaxes(tickformat="+.0%")
    fig.update_yaxes(type="category", autorange="reversed", automargin=True)
    return tidy_legend(fig)
