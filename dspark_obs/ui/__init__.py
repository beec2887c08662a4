"""The dashboard and the figures it shares with the nightly report.

* :mod:`dspark_obs.ui.charts` - chart builders: a frame in, a Plotly figure out (no query, no Streamlit);
* :mod:`dspark_obs.ui.palette` - one colour per workload, mode, label kind and cost model, and the theme;
* :mod:`dspark_obs.ui.export` - PNG export through kaleido (needs Chromium);
* :mod:`dspark_obs.ui.data` - the dashboard's cached DuckDB queries (``sql/ui_*.sql``);
* ``app.py`` and ``app_pages/`` - the Streamlit app (``dspark-obs dashboard --data D``).
"""
