"""Throughput: the sweep's Fig. 1 and Fig. 3, then every selected run's throughput and latency, each on its clock."""

import streamlit as st

from dspark_obs.ui import charts, urlstate, widgets

ds, f = widgets.page("Throughput",
                     "A sweep (`dspark-obs sweep`, or `dspark-obs demo --sweep`) is a run set: each method at each "
                     "driver concurrency is its own run. Every figure names its clock: `virtual` is the emulator's "
                     "cost-table clock, `wall` what was measured; no figure mixes them.")

NUM1 = st.column_config.NumberColumn(format="%.1f")
NUM3 = st.column_config.NumberColumn(format="%.3f")

with widgets.guard("Sweep"):
    points = ds.q("sweep_points")
    st.subheader("Sweep: Fig. 1 and Fig. 3")
    if points.empty:
        st.info("No sweep in the store. Run one on the embedded emulator: `dspark-obs sweep --out "
                f"{widgets.cli_root(ds)} --quick` (or `dspark-obs demo --sweep --quick`).", icon=":material/info:")
    else:
        sweeps = list(points.sort_values("started_at", ascending=False)["sweep_id"].drop_duplicates())
        sweep = urlstate.selectbox("Sweep", sweeps, key="sweep", help="Newest first; kept in the URL (?sweep=...)")
        mine = points[points["sweep_id"] == sweep]
        for clock, sub in mine.groupby("clock", sort=True):
            widgets.show_chart(charts.sweep_throughput(sub), key=f"sweep-fig1-{clock}")
            widgets.show_chart(charts.trim_gap_by_batch(charts.trim_gap_frame(sub)), key=f"sweep-fig3-{clock}")
        widgets.table(mine.drop(columns=["sweep_id"]), key="sweep-points", column_config={
            "per_user_tok_s": NUM1, "throughput_tok_s": NUM1, "mean_accept_length": NUM3, "mean_batch": NUM1,
            "e2e_p50_s": NUM3, "e2e_p99_s": NUM3})

with widgets.guard("Runs"):
    st.subheader("Selected runs")
    tp = ds.q("ui_throughput", f)
    if tp.empty:
        st.info("No finished requests with a latency match the filters: throughput needs the driver's requests "
                "(`dspark-obs collect --workload ...` or `dspark-obs demo`).", icon=":material/info:")
        st.stop()
    for clock, sub in tp.groupby("clock", sort=True):
        widgets.show_chart(charts.throughput_curves(sub), key=f"throughput-curves-{clock}")
        widgets.show_chart(charts.per_user_by_workload(sub), key=f"throughput-by-workload-{clock}")
    widgets.table(tp, key="throughput", column_config={
        c: st.column_config.NumberColumn(format="%.2f")
        for c in ("per_user_tok_s", "throughput_tok_s", "mean_accept_length", "mean_e2e_latency_s")})

with widgets.guard("Latency"):
    st.subheader("Latency p50 / p90 / p99")
    lat = ds.q("ui_latency", f)
    for clock, sub in lat.groupby("clock", sort=True):
        widgets.show_chart(charts.latency_percentiles(sub), key=f"latency-{clock}")
    widgets.table(lat, key="latency", column_config={c: NUM3 for c in lat.columns if c.endswith("_s")})
