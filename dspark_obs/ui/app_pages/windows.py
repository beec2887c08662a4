"""Windows and budgets (the write-up's Fig. 4): windows per workload, their distribution, utilisation, budget."""

import streamlit as st

from dspark_obs.ui import charts, urlstate, verdicts, widgets

ds, f = widgets.page("Windows and budgets",
                     "How many drafts the scheduler lets the target verify per request (window = verify_len - 1), how "
                     "much of the full-block ceiling those windows capture, and the verify budget it pays for.")

_VIEWS = ("windows", "utilisation", "budget over time")
_VIEWS_HELP = ("windows: the mean window per workload and the distribution of verify_len; utilisation: the share of "
               "the full-block ceiling the windows capture, per workload (against the report's limit) and per "
               "window; budget over time: the planner's verify budget per step.")
# One view at a time (kept in the URL): the browser's cost is the charts it draws, and this page has five.
view = urlstate.segmented_control("Show", list(_VIEWS), key="win_view", help=_VIEWS_HELP)

if view == "budget over time":
    with widgets.guard("Budget over time"):
        timeline = ds.q("ui_budget_timeline", f)
        if timeline.empty:
            widgets.no_rows("decode steps with a batch size")
        elif timeline["mean_budget"].isna().all():
            st.info("These runs logged no budget (static mode plans none).", icon=":material/info:")
        else:
            widgets.show_chart(charts.budget_timeline(timeline), key="windows-budget")
else:
    with widgets.guard("Windows"):
        dist = ds.q("ui_window_dist", f)
        if dist.empty:
            widgets.no_rows()
        else:
            summary = charts.window_summary(dist)
            if view == "windows":
                widgets.show_chart(charts.window_by_workload(summary), key="windows-by-workload")
                widgets.show_chart(charts.verify_len_distribution(dist), key="windows-distribution")
            elif summary["utilisation"].notna().any():
                limit = verdicts.report_limits(ds, f).get("utilisation", (None, None))[0]
                widgets.show_chart(charts.utilisation_by_workload(summary, limit=limit), key="windows-utilisation")
                widgets.show_chart(charts.utilisation_by_window(dist), key="windows-utilisation-by-window")
            else:
                widgets.needs_table(ds, "ceiling", "dspark-obs estimate --data {data}",
                                    "Utilisation against the ceiling (compact runs without a cap-accept run)")
            with st.expander("Per workload as a table"):
                pct = st.column_config.NumberColumn(format="percent")
                widgets.table(summary, key="window-summary", column_config={
                    "mean_window": st.column_config.NumberColumn(format="%.3f"), "full_window_share": pct,
                    "share_le3": st.column_config.NumberColumn("window <= 3", format="percent"),
                    "utilisation": pct})

with widgets.guard("Schedule replay"):
    replay = ds.q("ui_replay", f)
    with st.expander("Schedule replay and what-if (from `dspark-obs replay`)", expanded=not replay.empty):
        if replay.empty:
            st.caption("No replay results. `dspark-obs replay` re-plans the logged steps with the scheduler, checks "
                       "the logged windows, and prices what-if scenarios (another STS or cost table).")
        else:
            widgets.table(replay, key="replay", column_config={
                "matching_share": st.column_config.NumberColumn("windows reproduced", format="percent")})
