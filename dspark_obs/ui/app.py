"""The dspark-obs dashboard (Streamlit entry point).

Run it with ``dspark-obs dashboard --data D`` (or ``streamlit run app.py -- --data D``;
``DSPARK_OBS_DATA=D`` works too).  This script draws the sidebar filters and
hands over to the selected page in ``app_pages/``; every page reads the store
through :class:`dspark_obs.ui.data.DataSource` (DuckDB, cached per store version)
and draws with the chart builders in :mod:`dspark_obs.ui.charts`.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dspark_obs.ui import widgets
from dspark_obs.ui.data import DataSource, Filters

# A local file: a ":material/...:" page icon makes the browser fetch its SVG from a public font CDN.
st.set_page_config(page_title="dspark-obs", page_icon=str(Path(__file__).parent / "static" / "favicon.png"),
                   layout="wide")

PAGES = [
    ("app_pages/overview.py", "Overview", ":material/dashboard:"),
    ("app_pages/ceiling.py", "Ceiling", ":material/vertical_align_top:"),
    ("app_pages/windows.py", "Windows and budgets", ":material/width:"),
    ("app_pages/calibration.py", "Calibration", ":material/tune:"),
    ("app_pages/costmodel.py", "Cost model", ":material/timer:"),
    ("app_pages/throughput.py", "Throughput", ":material/speed:"),
    ("app_pages/requests.py", "Request explorer", ":material/timeline:"),
    ("app_pages/compare.py", "Compare", ":material/compare_arrows:"),
    ("app_pages/sql_console.py", "SQL console", ":material/terminal:"),
]

root = widgets.data_root()
if root is None:
    st.error("No data root given: start the dashboard with `dspark-obs dashboard --data D` "
             f"(or set {widgets.DATA_ENV}=D).", icon=":material/error:")
    st.stop()

ds = DataSource(root)
filters = Filters()
with st.sidebar:
    with widgets.guard("Filters"):
        filters = widgets.sidebar_filters(ds)
    with widgets.guard("Auto-refresh"):
        if not ds.empty:
            widgets.auto_refresh(ds)
widgets.set_context(ds, filters)

page = st.navigation([st.Page(path, title=title, icon=icon, default=i == 0)
                      for i, (path, title, icon) in enumerate(PAGES)])
page.run()
