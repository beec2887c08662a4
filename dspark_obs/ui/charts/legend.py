"""Legend hygiene shared by the chart builders: every legend entry names something the reader can see.

Builders call :func:`tidy_legend` last.  It removes the entries of series a
reader cannot find on the plot, which otherwise stay in the legend:

* a series with no finite point, or bars all of height zero (a category no
  selected run has), unless it stands for a legend group drawn elsewhere;
* a legend key (:func:`legend_key`) that explains a colour, dash, symbol or
  pattern no drawn series uses;
* a series drawn exactly under a later one (same axes, same points): the one on
  top names both;
* a second key that explains the same style as an earlier one: the first names both.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

__all__ = ["legend_key", "tidy_legend", "NEUTRAL_COLORS"]

NEUTRAL_COLORS = frozenset({"#616161", "#757575", "#9E9E9E", "#BDBDBD", "#E0E0E0"})
"""Greys a key uses when it explains a dash, symbol or pattern, not a colour."""


def legend_key(fig: go.Figure, name: str, *, kind: str = "line", marker: dict | None = None, **style: Any) -> None:
    """A legend entry with no data (explains a colour, dash, pattern or symbol used across traces).

    Add keys after the data traces: the first trace of an axis decides whether it is categorical.
    A line key with ``marker`` shows the line's markers too.
    What the key explains (its non-grey colour, its dash, symbol or pattern) is kept in the trace's
    ``meta`` so :func:`tidy_legend` can drop a key nothing on the plot uses.
    """
    color = style.get("color")
    explains = {"color": str(color)} if color is not None and str(color).upper() not in NEUTRAL_COLORS else {}
    if kind == "bar":
        if style.get("pattern_shape"):
            explains["pattern"] = style["pattern_shape"]
        fig.add_bar(x=[None], y=[None], name=name, marker=style, hoverinfo="skip", showlegend=True,
                    meta={"legend_key": explains, "kind": "bar"})
    elif kind == "marker":
        explains["symbol"] = style.get("symbol") or "circle"
        fig.add_scatter(x=[None], y=[None], mode="markers", name=name, marker=style, hoverinfo="skip",
                        meta={"legend_key": explains, "kind": "marker"})
    else:
        if "dash" in style or not explains:
            explains["dash"] = style.get("dash") or "solid"
        if marker:
            explains["symbol"] = marker.get("symbol") or "circle"
        fig.add_scatter(x=[None], y=[None], mode="lines+markers" if marker else "lines", name=name, line=style,
                        marker=marker, hoverinfo="skip", meta={"legend_key": explains, "kind": "line"})


def _values(trace) -> np.ndarray | None:
    raw = trace.x if getattr(trace, "orientation", None) == "h" else getattr(trace, "y", None)
    if trace.type == "heatmap":
        raw = trace.z
    if raw is None:
        return None
    return np.asarray(raw, dtype=object).ravel()


def _numbers(values: np.ndarray) -> np.ndarray:
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            out[i] = np.nan if v is None else 0.0  # a category label: a point, not a number
    return out


def _drawn(trace) -> bool:
    """Visible with at least one finite point; bars also need one non-zero height."""
    if trace.visible not in (None, True):
        return False
    values = _values(trace)
    if values is None or not len(values):
        return False
    numbers = _numbers(values)
    finite = np.isfinite(numbers)
    if trace.type == "bar":
        return bool((finite & (numbers != 0)).any())
    return bool(finite.any())


def _in_legend(trace) -> bool:
    return trace.showlegend is not False and trace.visible is not False and bool(trace.name)


def _key(trace) -> dict | None:
    meta = trace.meta
    return meta.get("legend_key") if isinstance(meta, dict) and "legend_key" in meta else None


def _style(trace) -> dict[str, str]:
    """The attributes a key can explain, as a drawn trace shows them."""
    line = getattr(trace, "line", None)
    marker = getattr(trace, "marker", None)
    out = {"dash": getattr(line, "dash", None) or "solid", "symbol": getattr(marker, "symbol", None) or "circle"}
    pattern = getattr(getattr(marker, "pattern", None), "shape", None)
    if pattern:
        out["pattern"] = str(pattern)
    colors = {str(c) for c in (getattr(line, "color", None), getattr(marker, "color", None)) if isinstance(c, str)}
    marker_colors = getattr(marker, "color", None)
    if marker_colors is not None and not isinstance(marker_colors, str):
        colors |= {str(c) for c in np.asarray(marker_colors, dtype=object).ravel()}
    out["colors"] = colors
    return out


def _explains_drawn(trace, drawn: list) -> bool:
    explains, kind = _key(trace), trace.meta.get("kind")
    for other in drawn:
        is_bar = other.type == "bar"
        if (kind == "bar") != is_bar:
            continue
        if kind == "marker" and "markers" not in str(getattr(other, "mode", "") or ""):
            continue
        if kind == "line" and "lines" not in str(getattr(other, "mode", "") or "lines"):
            continue
        style = _style(other)
        if all(style["colors"].__contains__(v) if k == "color" else style.get(k) == v for k, v in explains.items()):
            return True
    return False


def _same_points(a, b) -> bool:
    if a.type != b.type or getattr(a, "mode", None) != getattr(b, "mode", None):
        return False
    if (getattr(a, "xaxis", None), getattr(a, "yaxis", None)) != (getattr(b, "xaxis", None), getattr(b, "yaxis", None)):
        return False
    if a.type == "bar" and a.offsetgroup != b.offsetgroup:
        return False
    xa, xb, ya, yb = (np.asarray(v, dtype=object).ravel() if v is not None else None for v in (a.x, b.x, a.y, b.y))
    if xa is None or xb is None or ya is None or yb is None or len(xa) != len(xb) or len(ya) != len(yb):
        return False
    na, nb = _numbers(ya), _numbers(yb)
    return bool((xa == xb).all() and np.allclose(na, nb, rtol=1e-9, atol=1e-12, equal_nan=True))


def _hide_covered(data: list, drawn: set[int]) -> None:
    """Hide the entry of a series every drawn part of which lies exactly under a later series."""
    index = {id(t): i for i, t in enumerate(data)}

    def group(t) -> list:
        return [m for m in data if m.legendgroup == t.legendgroup] if t.legendgroup else [t]

    for under in data:
        parts = [m for m in group(under) if id(m) in drawn]
        if not (_in_legend(under) and parts):
            continue
        covers = []
        for part in parts:
            over = next((t for t in data[index[id(part)] + 1:] if id(t) in drawn and _same_points(part, t)), None)
            if over is None:
                break
            covers.append(over)
        else:
            under.showlegend = False
            entry = next((t for t in group(covers[0]) if _in_legend(t)), None)
            if entry is not None:
                entry.name = f"{entry.name} (= {under.name}, drawn under it)"


def tidy_legend(fig: go.Figure) -> go.Figure:
    """Drop legend entries for what is not visible on ``fig`` (see the module docstring); ``fig`` back."""
    data = list(fig.data)
    drawn_traces = [t for t in data if _drawn(t)]
    drawn = {id(t) for t in drawn_traces}
    drawn_groups = {t.legendgroup for t in drawn_traces if t.legendgroup}
    for t in data:
        if not _in_legend(t) or id(t) in drawn:
            continue
        if _key(t) is not None:
            keep = _explains_drawn(t, drawn_traces)
        else:
            keep = bool(t.legendgroup) and t.legendgroup in drawn_groups
        if not keep:
            t.showlegend = False
    _hide_covered(data, drawn)
    seen: dict[tuple, Any] = {}
    for t in data:
        explains = _key(t)
        if explains is None or not _in_legend(t):
            continue
        style = (t.meta.get("kind"), tuple(sorted(explains.items())))
        if style in seen:
            seen[style].name = f"{seen[style].name}; {t.name}"
            t.showlegend = False
        else:
            seen[style] = t
    return fig
