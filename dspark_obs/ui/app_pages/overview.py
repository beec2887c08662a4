"""Overview: the runs, and per workload what trimming costs and how far the confidence head can be trusted."""

import pandas as pd
import streamlit as st

from dspark_obs.ui import charts, health_panel, verdicts, widgets

ds, f = widgets.page("Overview",
                     "Runs in the store, and per workload: accept length against the full-block ceiling (what "
                     "trimming costs), the verify window, censoring, and calibration of the confidence head.")

NUM3 = st.column_config.NumberColumn(format="%.3f")
PCT = st.column_config.NumberColumn(format="percent")
runs = pd.DataFrame(columns=["run_id"])

with widgets.guard("Runs"):
    runs = ds.q("ui_runs", f)
    st.subheader("Runs")
    widgets.table(runs, key="runs", column_config={
        "run_id": st.column_config.TextColumn("run", pinned=True),
        "duration_s": st.column_config.NumberColumn("duration (wall s)", format="%.1f",
                                                    help="collection time on the wall clock, whatever the run's clock"),
        "clock": st.column_config.TextColumn("clock", help="clock of the run's latencies and step times: wall "
                                             "(measured) or virtual (the emulator's cost-table clock)"),
        "started_at": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        "missing_forward_cts": st.column_config.NumberColumn("lost forward_cts (max)"),
        "dead_letters": st.column_config.NumberColumn("dead letters"),
    })
    lossy = runs[(runs["gaps"] > 0) | (runs["dead_letters"] > 0)]
    if not lossy.empty:
        st.warning("Collection was lossy for " + ", ".join(f"`{r}`" for r in lossy["run_id"]) +
                   ": see the gaps and dead letters columns (`dspark-obs sql --data D gaps_summary`).",
                   icon=":material/warning:")

with widgets.guard("Latest report"):
    verdicts.show_verdicts(ds, f)

with widgets.guard("Per-workload summary"):
    wl = ds.q("ui_workloads", f)
    if wl.empty:
        widgets.no_rows()
    else:
        order = {r: i for i, r in enumerate(runs["run_id"])}
        totals = wl[wl["workload"] == "*"].sort_values("run_id", key=lambda s: s.map(order).fillna(len(order)))
        totals = totals.head(4)
        for _, r in totals.iterrows():
            st.markdown(f"**{r['run_id']}** · {r['mode']}")
            c = st.columns(5)
            c[0].metric("accept length", f"{r['mean_acc_len']:.2f}", help="committed tokens per request-step")
            if pd.notna(r["ceiling_len"]):
                interval = (None if r["ceiling_source"] == "exact"
                            else f"{r['ceiling_len_lo']:.2f} to {r['ceiling_len_hi']:.2f}")
                c[1].metric(f"ceiling ({r['ceiling_source']})", f"{r['ceiling_len']:.2f}", delta=interval,
                            delta_color="off", delta_arrow="off",
                            help="tokens per request-step a full-block verify would commit; for an estimate, the "
                                 "interval is the means of its lower and upper bounds")
                c[2].metric("utilisation", f"{r['utilisation']:.1%}", help="accepted / full-block ceiling")
            else:
                c[1].metric("ceiling", "-", help="full-block ceiling: run `dspark-obs estimate` for compact runs")
                c[2].metric("utilisation", "-")
            c[3].metric("mean window", f"{r['mean_window']:.2f}", help="drafts verified per request-step")
            c[4].metric("ECE (mean over k)", f"{r['ece']:.1%}" if pd.notna(r["ece"]) else "-",
                        help=f"labels: {r['ece_labels']}" if pd.notna(r["ece"]) else
                        "run `dspark-obs calibrate` to score the confidence head")
        widgets.show_chart(charts.accept_vs_ceiling(wl), key="overview-accept-vs-ceiling")
        st.subheader("Per workload")
        widgets.table(wl, key="workloads", column_config={
            "run_id": st.column_config.TextColumn("run", pinned=True),
            "mean_acc_len": NUM3, "mean_window": NUM3, "ceiling_len": NUM3, "ceiling_len_lo": NUM3,
            "ceiling_len_hi": NUM3, "full_window_share": PCT, "censored_share": PCT, "utilisation": PCT,
            "ece": PCT,
        })
        st.caption("'*' rows pool all workloads of a run. The ceiling of a compact run is the estimator's mean "
                   "with the means of its lower and upper bounds; ECE is per run (the DP-rank and time filters do "
                   "not apply to it).")
        compact = wl[(wl["mode"] == "compact") & wl["ceiling_len"].isna()]["run_id"].unique()
        if len(compact):
            widgets.needs_table(ds, "ceiling", f"dspark-obs estimate --data {{data}} --run {compact[0]}",
                                "The full-block ceiling of a compact run")

health_panel.render(ds, f)

with widgets.guard("Calibration summary"):
    cal = ds.q("ui_calibration", f)
    cal = cal[cal["workload"] == "*"]
    if cal.empty:
        first = next(iter(runs["run_id"]), "RUN")
        widgets.needs_table(ds, "calibration", f"dspark-obs calibrate --data {{data}} --run {first} --labels all",
                            "Calibration of the confidence head")
    else:
        # the run scored with the most label kinds: its observed-vs-companion gap is the survivorship bias
        kinds = cal.groupby("run_id")["labels"].nunique()
        run = kinds.sort_values(ascending=False, kind="stable").index[0]
        fig = charts.calibration_metrics(cal[cal["run_id"] == run], metrics=("ece",),
                                         limits=verdicts.report_limits(ds, f))
        fig.update_layout(title_text=f"ECE of survival S_k by draft position: {run}")
        widgets.show_chart(fig, key="overview-ece")
