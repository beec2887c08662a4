"""An independent check that a figure's legend names only what a reader can see (used by the chart tests).

Written apart from :mod:`dspark_obs.ui.charts.legend` (which fixes legends) so the
tests do not grade the fix with itself.
"""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio


def _decoded(node):
    """Plotly's JSON keeps numeric arrays as base64 ``{"dtype", "bdata"}``: plain lists instead."""
    if isinstance(node, dict):
        if "bdata" in node and "dtype" in node:
            arr = np.frombuffer(base64.b64decode(node["bdata"]), dtype=node["dtype"])
            if "shape" in node:
                arr = arr.reshape([int(n) for n in str(node["shape"]).split(",")])
            return arr.tolist()
        return {k: _decoded(v) for k, v in node.items()}
    return [_decoded(v) for v in node] if isinstance(node, list) else node


def figure_from_spec(spec: str) -> go.Figure:
    """The figure of a Plotly JSON spec (as Streamlit sends it), its arrays decoded."""
    return pio.from_json(json.dumps(_decoded(json.loads(spec))))


def _nums(values) -> list[float]:
    out = []
    for v in list(values) if values is not None else []:
        try:
            out.append(float(v))
        except (TypeError, ValueError):
            out.append(math.nan if v is None else 1.0)  # a category: present
    return out


def _points(trace) -> list[float]:
    if trace.type == "heatmap":
        return [v for row in (trace.z if trace.z is not None else []) for v in _nums(row)]
    return _nums(trace.x if getattr(trace, "orientation", None) == "h" else getattr(trace, "y", None))


def _visible(trace) -> bool:
    pts = [p for p in _points(trace) if math.isfinite(p)]
    if trace.type == "bar":
        pts = [p for p in pts if p != 0]
    return trace.visible in (None, True) and bool(pts)


def _is_key(trace) -> bool:
    xs = list(trace.x) if getattr(trace, "x", None) is not None else []
    return bool(xs) and all(x is None for x in xs)


def _glyph(trace) -> tuple:
    m, ln = getattr(trace, "marker", None), getattr(trace, "line", None)
    pattern = getattr(getattr(m, "pattern", None), "shape", None)
    color = getattr(m, "color", None)
    return (trace.type, getattr(trace, "mode", None), getattr(m, "symbol", None),
            color if isinstance(color, str) else None, getattr(ln, "color", None), getattr(ln, "dash", None), pattern)


def legend_problems(fig) -> list[str]:
    """What is wrong with ``fig``'s legend, one line each ([] when nothing is)."""
    data = list(fig.data)
    entries = [t for t in data if t.showlegend is not False and t.visible is not False and t.name]
    groups = {t.legendgroup for t in data if t.legendgroup and _visible(t)}
    problems = []
    for t in entries:
        if not _is_key(t) and not _visible(t) and t.legendgroup not in groups:
            problems.append(f"legend entry {t.name!r}: its series draws nothing (no finite, non-zero point)")
    def covered_by(a):
        """The later series that hides ``a`` exactly, or None."""
        start = next(i for i, t in enumerate(data) if t is a) + 1
        for b in data[start:]:
            same_axes = (getattr(a, "xaxis", None), getattr(a, "yaxis", None)) == (
                getattr(b, "xaxis", None), getattr(b, "yaxis", None))
            if (same_axes and a.type == b.type and getattr(a, "mode", None) == getattr(b, "mode", None)
                    and (a.type != "bar" or a.offsetgroup == b.offsetgroup) and _visible(b)
                    and list(a.x) == list(b.x) and _points(a) == _points(b)):
                return b
        return None

    for a in entries:
        parts = [t for t in data if _visible(t) and (t is a or (a.legendgroup and t.legendgroup == a.legendgroup))]
        covers = [covered_by(t) for t in parts]
        if parts and all(covers):
            problems.append(f"legend entry {a.name!r}: drawn exactly under {covers[0].name!r}")
    seen: dict[tuple, str] = {}
    for i, t in enumerate(entries):
        glyph = _glyph(t)
        if glyph[3] is None and glyph[4] is None:
            glyph += (i,)  # no colour set: Plotly's colour cycle gives each its own
        if glyph in seen:
            problems.append(f"legend entries {seen[glyph]!r} and {t.name!r} look the same {glyph}")
        seen.setdefault(glyph, t.name)
    return problems
