"""What every chart builder shares: frame coercion, the figure skeleton, captions.

A builder takes a frame (pandas DataFrame, Arrow table, or list of row dicts),
returns a Plotly figure, runs no query and calls no Streamlit.  Every figure
has a title, axis titles with units, and a one-line caption (what to read from
it) kept in ``fig.layout.meta["caption"]`` so the dashboard and the report show
the same text; :func:`caption_of` reads it back.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import pandas as pd
import plotly.graph_objects as go
import pyarrow as pa

from dspark_obs.ui.charts.legend import legend_key, tidy_legend
from dspark_obs.ui.palette import TEMPLATE_NAME

__all__ = ["as_frame", "new_figure", "caption_of", "no_data", "require_columns", "finite", "sorted_workloads",
           "legend_right", "legend_key", "tidy_legend", "axis_titles", "clock_of", "log2_ticks", "draw_limit", "run_colors", "name_clock"]

LIMIT_COLOR = "#C62828"
_RUN_COLORS = ("#111111", "#E69F00", "#0072B2", "#CC79A7", "#009E73", "#D55E00")

CLOCK_NAMES = {"wall": "wall clock", "virtual": "virtual clock"}


def as_frame(data: Any) -> pd.DataFrame:
    """A pandas DataFrame from a DataFrame, an Arrow table, a list of dicts or None."""
    if data is None:
        return pd.DataFrame()
    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, pa.Table):
        return data.to_pandas()
    if isinstance(data, (list, tuple)):
        return pd.DataFrame(list(data))
    raise TypeError(f"expected a pandas DataFrame, a pyarrow Table or a list of dicts, got {type(data).__name__}")


def require_columns(df: pd.DataFrame, columns: Iterable[str], builder: str) -> None:
    """Raise ValueError naming the missing columns when a non-empty frame lacks some."""
    if df.empty and not len(df.columns):
        return
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{builder}: the frame lacks columns {missing}; it has {list(df.columns)}")


def new_figure(title: str, x_title: str | None, y_title: str | None, caption: str, *, height: int = 420,
               fig: go.Figure | None = None) -> go.Figure:
    """A figure in the project template with title, axis titles and caption set.

    Pass ``fig`` (from ``make_subplots``) and ``None`` axis titles to title each
    subplot's axes yourself.
    """
    fig = fig if fig is not None else go.Figure()
    fig.update_layout(template=TEMPLATE_NAME, title=dict(text=title), height=height,
                      meta={"caption": caption})
    if x_title is not None:
        fig.update_layout(xaxis_title=x_title)
    if y_title is not None:
        fig.update_layout(yaxis_title=y_title)
    return fig


def legend_right(fig: go.Figure) -> go.Figure:
    """Put the legend in a column right of the plot (for long legends and figures with subplot titles);
    its entries tidied (:func:`tidy_legend`)."""
    tidy_legend(fig)
    fig.update_layout(legend=dict(orientation="v", x=1.01, xanchor="left", y=1.0, yanchor="top",
                                  tracegroupgap=4, traceorder="normal"))
    return fig


def axis_titles(fig: go.Figure) -> dict[str, str]:
    """Every axis title of ``fig`` by axis name (``xaxis``, ``yaxis2``, ...), empty ones left out."""
    out = {}
    for name in dir(fig.layout):
        if name.startswith(("xaxis", "yaxis")):
            axis = getattr(fig.layout, name, None)
            text = getattr(getattr(axis, "title", None), "text", None)
            if text:
                out[name] = str(text)
    return out


def caption_of(fig: go.Figure) -> str:
    """The one-line caption a builder attached to ``fig`` ('' if none)."""
    meta = fig.layout.meta
    return str(meta.get("caption", "")) if isinstance(meta, dict) else ""


def no_data(fig: go.Figure, message: str = "No data for the current selection") -> go.Figure:
    """Write ``message`` across an empty figure (axes and title stay)."""
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color="#808080"))
    return fig


def finite(x: Any) -> bool:
    """True for a real, finite number (not None, NaN or inf)."""
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def sorted_workloads(values: Sequence[Any]) -> list[str]:
    """Workloads in display order: '*' first, then alphabetical, 'unknown' last."""
    names = {str(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))}
    return sorted(names, key=lambda w: (w != "*", w == "unknown", w))


def clock_of(df: pd.DataFrame, builder: str) -> str:
    """The one clock a throughput/latency frame is on, as axis text ('virtual clock', 'wall clock').

    A figure never mixes clocks: a frame with both raises (split it by ``clock``
    first); a frame without the column is on the wall clock.
    """
    if "clock" not in df.columns or df.empty:
        return CLOCK_NAMES["wall"]
    clocks = sorted({str(c) for c in df["clock"].dropna()}) or ["wall"]
    if len(clocks) > 1:
        raise ValueError(f"{builder}: the frame mixes clocks {clocks}; draw one figure per clock")
    return CLOCK_NAMES.get(clocks[0], f"{clocks[0]} clock")


def log2_ticks(values: Iterable[Any]) -> dict[str, Any]:
    """Axis settings for a log2 integer axis (concurrency, batch): ticks only at the values present."""
    ticks = sorted({int(v) for v in values if finite(v)})
    return dict(type="log", tickmode="array", tickvals=ticks, ticktext=[str(t) for t in ticks])


def draw_limit(fig: go.Figure, value: float | None, kind: str | None, *, row: int | None = None,
               col: int | None = None, percent: bool = False) -> None:
    """The threshold a figure is gated on, as a dashed line labelled 'limit <= 0.05' (or '>=')."""
    if value is None or not finite(value):
        return
    side = {"max": "<=", "min": ">="}.get(str(kind), "")
    text = f"limit {side} {value:.0%}" if percent else f"limit {side} {value:.3g}"
    where = {} if row is None else {"row": row, "col": col}
    fig.add_hline(y=float(value), line=dict(color=LIMIT_COLOR, dash="dash", width=1.5), annotation_text=text,
                  annotation_position="top right", annotation_font=dict(size=11, color=LIMIT_COLOR), **where)


def run_colors(runs: Iterable[Any]) -> dict[str, str]:
    """A distinct colour per run, in order (two runs never share one)."""
    names = list(dict.fromkeys(str(r) for r in runs))
    return {r: _RUN_COLORS[i % len(_RUN_COLORS)] for i, r in enumerate(names)}


def name_clock(fig: go.Figure, clock: str) -> go.Figure:
    """Append the clock (``'virtual clock'``) to a timing figure's title and caption, for builders whose frame
    carries no ``clock`` column (the page knows the runs' clock)."""
    fig.update_layout(title_text=f"{fig.layout.title.text} ({clock})",
                      meta={"caption": f"Times on the {clock}. {caption_of(fig)}"})
    return fig
