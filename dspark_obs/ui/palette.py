"""One palette for every chart: colours per workload, per verify mode, per label kind.

The same workload has the same colour on every page of the dashboard and in the
nightly report; the same goes for modes (and their line dashes, marker symbols
and bar patterns), calibration label kinds, cost models and ceiling categories.
Known names have fixed colours; any other name gets one from a spare list,
chosen by a stable hash of the name, so it does not change between sessions or
with the order in which names appear.

>>> workload_color("gsm8k")
'#4C78A8'
>>> workload_color("my-new-workload") == workload_color("my-new-workload")
True
"""

from __future__ import annotations

import hashlib

import plotly.graph_objects as go
import plotly.io as pio

__all__ = [
    "WORKLOAD_COLORS", "MODE_COLORS", "LABEL_COLORS", "MODEL_COLORS", "CATEGORY_COLORS", "TOKEN_SOURCE_COLORS",
    "workload_color", "mode_color", "mode_dash", "mode_symbol", "mode_pattern", "label_color",
    "model_color", "category_color", "TEMPLATE", "TEMPLATE_NAME", "FONT_FAMILY",
]

WORKLOAD_COLORS = {
    "gsm8k": "#4C78A8",       # blue
    "arena-hard": "#F58518",  # orange
    "poetry": "#54A24B",      # green
    "*": "#3B3B3B",           # all workloads
    "unknown": "#A0A0A0",
}
_SPARE_WORKLOAD_COLORS = ("#B279A2", "#E45756", "#72B7B2", "#EECA3B", "#9D755D", "#FF9DA6",
                          "#4E9F9A", "#B6992D", "#79706E", "#D37295")

MODE_COLORS = {
    "compact": "#C03A2B",     # brick red: the production path
    "cap-accept": "#6A51A3",  # purple: exposes the ceiling
    "static": "#525252",      # grey: the baseline
    "no-trim": "#8C6D31",     # brown: compact verifying the full window
    "fixed-window": "#525252",  # grey like static: the whole block every step (MTP kind)
    "no-spec": "#1F77B4",     # blue: the target alone
}
_MODE_DASH = {"compact": "solid", "cap-accept": "dash", "static": "dot", "no-trim": "dashdot",
              "fixed-window": "dot", "no-spec": "longdash"}
_MODE_SYMBOL = {"compact": "circle", "cap-accept": "diamond", "static": "square", "no-trim": "triangle-up",
                "fixed-window": "square", "no-spec": "x"}
_MODE_PATTERN = {"compact": "", "cap-accept": "/", "static": "x", "no-trim": "."}
_SPARE_MODE_COLORS = ("#1B9E77", "#D95F02", "#7570B3", "#E7298A", "#66A61E")

LABEL_COLORS = {
    "observed": "#D62728",       # red: biased by survivorship in compact runs
    "reconstructed": "#17BECF",  # teal: the estimator's ceiling
    "companion": "#111111",      # black: the cap-accept truth
}
MODEL_COLORS = {
    "fitted": "#1F3B73",
    "fitted+context": "#8C6BB1",
    "server": "#A0522D",
}
CATEGORY_COLORS = {
    "exact_in_window": "#BDBDBD",
    "censored_resolved_exact": "#2B8CBE",
    "censored_diverged": "#A6BDDB",
    "censored_eos": "#FDAE6B",
    "censored_at_end": "#E6550D",
    "observed_cap_accept": "#6A51A3",  # cap-accept: the ceiling is observed, nothing censored
}
TOKEN_SOURCE_COLORS = {
    "draft": "#9ECAE1",    # an accepted draft
    "bonus": "#08519C",    # the target's own token ending a step
    "prefill": "#969696",  # the first output token, from prefill
    "unmatched": "#D9D9D9",
}
FONT_FAMILY = "Inter, 'Source Sans Pro', 'Helvetica Neue', Arial, sans-serif"


def _pick(name: str, spare: tuple[str, ...]) -> str:
    digest = hashlib.blake2b(str(name).encode(), digest_size=4).digest()
    return spare[int.from_bytes(digest, "big") % len(spare)]


def workload_color(workload: str | None) -> str:
    """The colour of ``workload`` (``None`` counts as ``'unknown'``)."""
    name = "unknown" if workload is None else str(workload)
    return WORKLOAD_COLORS.get(name) or _pick(name, _SPARE_WORKLOAD_COLORS)


def mode_color(mode: str | None) -> str:
    """The colour of a verify mode or method (``compact``, ``cap-accept``, ``static``, ``no-trim``)."""
    name = "" if mode is None else str(mode)
    return MODE_COLORS.get(name) or _pick(name, _SPARE_MODE_COLORS)


def mode_dash(mode: str | None) -> str:
    """Line dash of a mode: compact solid, cap-accept dash, static dot, no-trim dash-dot."""
    return _MODE_DASH.get(str(mode), "longdash")


def mode_symbol(mode: str | None) -> str:
    """Marker symbol of a mode: compact circle, cap-accept diamond, static square."""
    return _MODE_SYMBOL.get(str(mode), "x")


def mode_pattern(mode: str | None) -> str:
    """Bar fill pattern of a mode: compact plain, cap-accept '/', static 'x'."""
    return _MODE_PATTERN.get(str(mode), "-")


def label_color(labels: str | None) -> str:
    """Colour of a calibration label kind (observed, reconstructed, companion)."""
    return LABEL_COLORS.get(str(labels)) or _pick(str(labels), _SPARE_MODE_COLORS)


def model_color(model: str | None) -> str:
    """Colour of a cost model (fitted, fitted+context, server)."""
    return MODEL_COLORS.get(str(model)) or _pick(str(model), _SPARE_MODE_COLORS)


def category_color(category: str | None) -> str:
    """Colour of a ceiling-estimate category (SGLang's analyzer categories)."""
    return CATEGORY_COLORS.get(str(category)) or _pick(str(category), _SPARE_WORKLOAD_COLORS)


TEMPLATE_NAME = "dspark_obs"
TEMPLATE = go.layout.Template(pio.templates["plotly_white"])
TEMPLATE.layout.update(
    font=dict(family=FONT_FAMILY, size=13, color="#262730"),
    title=dict(font=dict(size=16), x=0.0, xref="paper", xanchor="left", y=0.97, yanchor="top"),
    margin=dict(l=64, r=24, t=84, b=56),
    legend=dict(orientation="h", x=0.0, xanchor="left", y=1.02, yanchor="bottom",
                bgcolor="rgba(255,255,255,0)", font=dict(size=12)),
    hoverlabel=dict(font=dict(family=FONT_FAMILY)),
    colorway=list(WORKLOAD_COLORS.values())[:3] + list(_SPARE_WORKLOAD_COLORS),
    paper_bgcolor="white",
    plot_bgcolor="white",
)
TEMPLATE.layout.xaxis.update(showline=True, linecolor="#8A8A8A", gridcolor="#EBEBEB", zeroline=False,
                             ticks="outside", tickcolor="#8A8A8A")
TEMPLATE.layout.yaxis.update(showline=True, linecolor="#8A8A8A", gridcolor="#EBEBEB", zeroline=False,
                             ticks="outside", tickcolor="#8A8A8A")
pio.templates[TEMPLATE_NAME] = TEMPLATE
