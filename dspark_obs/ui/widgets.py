"""Streamlit pieces every page uses: the data root, sidebar filters, charts with captions and PNG export,
notices for empty stores and missing estimator tables, and errors shown as messages (never tracebacks).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import sys
from typing import Iterator

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dspark_obs.ui import urlstate
from dspark_obs.ui.charts import caption_of
from dspark_obs.ui.data import DataSource, Filters
from dspark_obs.ui.export import ExportError, figure_png

__all__ = ["DATA_ENV", "data_root", "context", "set_context", "sidebar_filters", "show_chart", "guard",
           "empty_store_notice", "needs_table", "table", "cli_root"]

DATA_ENV = "DSPARK_OBS_DATA"
"""Environment variable carrying the data root to the app (set by `dspark-obs dashboard`)."""
_CTX_KEY = "_dspark_obs_ctx"
_PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def data_root() -> str | None:
    """The data root: ``--data D`` after ``--`` on the streamlit command line, else ``$DSPARK_OBS_DATA``."""
    argv = sys.argv[1:] if sys.argv and sys.argv[0].endswith("app.py") else []
    for i, arg in enumerate(argv):
        if arg == "--data" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--data="):
            return arg.split("=", 1)[1]
    return os.environ.get(DATA_ENV) or None


def cli_root(ds: DataSource) -> str:
    """The data root as a user would type it in a command (quoted when it has spaces)."""
    return f"'{ds.root}'" if " " in ds.root else ds.root


def set_context(ds: DataSource, filters: Filters) -> None:
    st.session_state[_CTX_KEY] = (ds, filters)


def context() -> tuple[DataSource, Filters]:
    """The data source and filters the app computed for this script run."""
    return st.session_state[_CTX_KEY]


@contextlib.contextmanager
def guard(what: str) -> Iterator[None]:
    """Show any error inside the block as an ``st.error`` message and carry on with the page."""
    try:
        yield
    except Exception as exc:  # Streamlit's stop/rerun are BaseExceptions and pass through
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        st.error(f"**{what}** failed: {message}", icon=":material/error:")


def page(title: str, caption: str, *, needs_runs: bool = True) -> tuple[DataSource, Filters]:
    """A page's opening: its title and caption, the data source and filters; on an empty store the
    notice of how to collect data, and (``needs_runs``) the page stops there."""
    ds, f = context()
    st.title(title)
    st.caption(caption)
    if ds.empty:
        empty_store_notice(ds)
        if needs_runs:
            st.stop()
    return ds, f


def no_rows(what: str = "request-steps") -> None:
    """The notice of a figure whose query found no rows under the sidebar's filters."""
    st.info(f"No {what} match the filters.", icon=":material/filter_alt_off:")


def empty_store_notice(ds: DataSource) -> None:
    """How to collect data, shown when the store holds no run."""
    where = "does not exist yet" if not ds.exists else "holds no runs yet"
    st.info(
        f"The data root `{ds.root}` {where}. Collect something first:\n\n"
        f"* a self-contained demo on the embedded emulator (about a minute):\n"
        f"  `dspark-obs demo --quick --out {cli_root(ds)}`\n"
        f"* or attach to a running SGLang DSpark server and drive traffic:\n"
        f"  `dspark-obs collect --url http://127.0.0.1:30000 --out {cli_root(ds)} --workload gsm8k,poetry`\n\n"
        f"Then reload this page; it picks up new files automatically.",
        icon=":material/database:")


def needs_table(ds: DataSource, table: str, command: str, what: str) -> None:
    """Say which command fills an empty estimator table."""
    st.info(f"{what} needs the `{table}` table, which is empty for this selection. Fill it with:\n\n"
            f"`{command.format(data=cli_root(ds))}`", icon=":material/info:")


def _png_callback(fig: go.Figure):
    def render() -> bytes:

        try:
            return figure_png(fig)
        except ExportError as exc:  # the download runs off the script thread: deliver the reason as text
            return f"PNG export failed: {exc}".encode()
    return render


def show_chart(fig: go.Figure, key: str) -> None:
    """A chart at full width, its one-line caption, and a PNG download (rendered by kaleido on click)."""
    st.plotly_chart(fig, theme=None, key=f"chart-{key}", config=_PLOTLY_CONFIG)
    left, right = st.columns([0.84, 0.16], vertical_alignment="top")
    left.caption(caption_of(fig))
    right.download_button("PNG", data=_png_callback(fig), file_name=f"{key}.png", mime="image/png",
                          key=f"png-{key}", icon=":material/download:", on_click="ignore",
                          help="Render this figure to PNG with kaleido (needs Chromium on the server)")


def table(df: pd.DataFrame, *, key: str, column_config: dict | None = None, height: int | str = "auto") -> None:
    """A data frame without its index."""
    st.dataframe(df, hide_index=True, key=f"table-{key}", column_config=column_config, height=height)


def _naive_utc(value) -> _dt.datetime:
    ts = pd.Timestamp(value)
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC").tz_localize(None)
    return ts.to_pydatetime()


def _all_or_none(selected: list, options: list) -> tuple | None:
    return None if not options or set(selected) >= set(options) else tuple(selected)


def sidebar_filters(ds: DataSource) -> Filters:
    """Run, workload, DP-rank and time-range filters in the sidebar; the selection as :class:`Filters`."""
    sb = st.sidebar
    sb.caption(f"Data root `{ds.root}`  \nstore version `{ds.version}`")
    if ds.empty:
        return Filters()
    options = ds.q("ui_options")
    if options.empty:
        return Filters()
    row = options.iloc[0]
    runs = list(row["runs"]) if row["runs"] is not None else []
    workloads = list(row["workloads"]) if row["workloads"] is not None else []
    ranks = [int(r) for r in row["dp_ranks"]] if row["dp_ranks"] is not None else []
    sb.subheader("Filters")
    sel_runs = urlstate.multiselect("Runs", runs, key="runs", container=sb,
                                    help="Runs to include (all by default); kept in the URL, so a view can be shared.")
    sel_workloads = urlstate.multiselect("Workloads", workloads, key="workloads", container=sb)
    sel_ranks = urlstate.multiselect("DP ranks", ranks, key="ranks", container=sb) if len(ranks) > 1 else ranks
    t0 = t1 = None
    t_min, t_max = row["t_min"], row["t_max"]
    if pd.notna(t_min) and pd.notna(t_max) and t_max > t_min:
        lo = _naive_utc(t_min).replace(microsecond=0)
        hi = _naive_utc(t_max).replace(microsecond=0) + _dt.timedelta(seconds=1)
        step = _dt.timedelta(seconds=max(1, int((hi - lo).total_seconds() // 200)))
        picked = sb.slider("Requests submitted (UTC)", min_value=lo, max_value=hi, value=(lo, hi), step=step,
                           format="HH:mm:ss", key="f_time",
                           help="Keeps requests submitted in this range, their request-steps, and the steps "
                                "between their first and last forward_ct.")
        if tuple(picked) != (lo, hi):
            t0, t1 = (p.replace(tzinfo=_dt.timezone.utc) for p in picked)
    if not sel_runs or not sel_workloads or (len(ranks) > 1 and not sel_ranks):
        sb.warning("An empty selection shows nothing: pick at least one run, workload and DP rank.")
    return Filters(runs=_all_or_none(sel_runs, runs), workloads=_all_or_none(sel_workloads, workloads),
                   dp_ranks=_all_or_none(sel_ranks, ranks), t0=t0, t1=t1)


def auto_refresh(ds: DataSource, *, every_s: float = 5.0) -> None:
    """While a run is being collected (no ``ended_at``), re-run the app when the store gains files.

    A sidebar toggle (on by default, ``?live=0`` in the URL turns it off) controls it.
    """
    runs = ds.q("ui_runs")
    live = runs[runs["duration_s"].isna() & runs["started_at"].notna()]["run_id"].tolist() if not runs.empty else []
    if not live:
        return
    on = urlstate.toggle(f"Auto-refresh every {every_s:g} s", key="live", default=True, container=st.sidebar,
                         help="Collecting now: " + ", ".join(live))
    if not on:
        return
    version = ds.version

    @st.fragment(run_every=every_s)
    def _watch() -> None:
        if DataSource(ds.root).version != version:
            st.rerun(scope="app")

    with st.sidebar:
        _watch()


def page_header(title: str, blurb: str) -> None:
    st.title(title)
    st.caption(blurb)
