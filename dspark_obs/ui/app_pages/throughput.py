"""Throughput (the write-up's Fig. 1 and 3): total throughput vs per-user speed across concurrency."""

import streamlit as st

from dspark_obs.ui import charts, widgets

ds, f = widgets.context()
st.title("Throughput")
st.caption("Total throughput against per-user speed, one point per run and driver concurrency, one curve per "
           "run/method (compact, no-trim, static); labels give the accept length. Sweep concurrency with "
           "`dspark-obs collect --concurrency N` (one run per point, label it with `--label method=...`).")
if ds.empty:
    widgets.empty_store_notice(ds)
    st.stop()

with widgets.guard("Throughput"):
    tp = ds.q("ui_throughput", f)
    if tp.empty:
        st.info("No finished requests with a latency match the filters: throughput needs the driver's requests "
                "(`dspark-obs collect --workload ...` or `dspark-obs demo`).", icon=":material/info:")
        st.stop()
    widgets.show_chart(charts.throughput_curves(tp), key="throughput-curves")
    widgets.show_chart(charts.per_user_by_workload(tp), key="throughput-by-workload")
    points = tp.groupby("run_id")["concurrency"].nunique()
    if (points <= 1).all():
        st.caption("Each run has one concurrency, so each curve is a single point; collect runs at several "
                   "concurrencies (1 to 256 in the write-up) to draw the curves.")
    widgets.table(tp, key="throughput", column_config={
        c: st.column_config.NumberColumn(format="%.2f")
        for c in ("per_user_tok_s", "throughput_tok_s", "mean_accept_length", "mean_e2e_latency_s")})
