"""Cost model (the write-up's Fig. 6): measured step times vs the fitted additive table, errors by batch size."""

import dataclasses

import numpy as np
import pandas as pd
import streamlit as st

from dspark_obs import costtable
from dspark_obs.ui import charts, widgets

ds, f = widgets.page("Cost model",
                     "The scheduler prices a step as T(bs, K) = bias + alpha(bs) + theta(M), M = tokens the target "
                     "verifies. `dspark-obs costmodel` fits that additive table to the logged step times; here it is "
                     "checked against the raw steps and against the server's own prediction.")

TIMERS = ("step_gpu_ms", "step_cpu_ms", "target_verify_gpu_ms")

with widgets.guard("Cost model"):
    fits = ds.q("ui_costmodel_fit", f)
    table, pooled, timer, run = None, None, "step_gpu_ms", None
    if fits.empty:
        widgets.needs_table(ds, "costmodel_fit", "dspark-obs costmodel --data {data} --run RUN",
                            "The fitted curves and the error table")
        timer = st.selectbox("Step timer", TIMERS, key="cm_timer")
    else:
        c1, c2 = st.columns(2)
        run = c1.selectbox("Fit of run", list(dict.fromkeys(fits["run_id"])), key="cm_run")
        mine = fits[fits["run_id"] == run]
        models = [m for m in ("fitted", "fitted+context") if m in set(mine["model"])]
        model = c2.selectbox("Terms of model", models, key="cm_model",
                             help="The table below: 'fitted' is the SGLang table drawn in the charts; "
                                  "fitted+context adds c * sum(prefix_len), a term SGLang's table cannot express.")
        table = charts.table_from_fit(mine, model="fitted")
        timer = str(mine["timer"].dropna().iloc[0]) if mine["timer"].notna().any() else "step_gpu_ms"
        pooled = [r for r in str(mine["pooled_runs"].dropna().iloc[0]).split(",") if r] \
            if mine["pooled_runs"].notna().any() else [run]
        st.caption(f"Fit of `{timer}` pooled over " + ", ".join(f"`{r}`" for r in pooled) + ".")
    scope = dataclasses.replace(f, runs=tuple(pooled)) if pooled else f
    cells = ds.q("ui_costmodel_cells", scope, timer=timer)
    if cells.empty:
        st.info(f"No decode steps with a batch size and `{timer}` match the filters; collect with the "
                "step_gpu_time / step_cpu_time components of SGLANG_DSPARK_DEBUG_DUMP.", icon=":material/info:")
        st.stop()
    cells = charts.predict_cells(cells, table)
    gamma = 6
    if run is not None:
        info = ds.q("ui_run_info", run_id=run)
        if not info.empty and pd.notna(info["gamma"].iloc[0]):
            gamma = int(info["gamma"].iloc[0])
    bs_seen = cells["bs"].to_numpy()
    probes = [p for p in (table.bs_probes if table else []) if bs_seen.min() <= p <= bs_seen.max()]
    bs_lines = sorted(set(probes) | {int(bs_seen.max())}) if probes else \
        sorted({int(v) for v in np.quantile(bs_seen, [0, 0.5, 1])})
    curves = charts.curve_frame(table, bs_lines, gamma=gamma)
    runs = ds.q("ui_runs", scope)
    clocks = sorted(set(runs["clock"])) if not runs.empty else ["wall"]
    clock = " and ".join(f"{c} clock" for c in clocks)
    if len(clocks) > 1:
        st.warning(f"These runs' step times come from different clocks ({clock}): narrow the Runs filter to one.",
                   icon=":material/warning:")
    widgets.show_chart(charts.name_clock(charts.costmodel_raw_vs_fitted(cells, curves), clock),
                       key="costmodel-raw-vs-fitted")
    widgets.show_chart(charts.name_clock(charts.predicted_vs_measured(cells), clock),
                       key="costmodel-predicted-vs-measured")
    widgets.show_chart(charts.name_clock(charts.residuals_by_batch(cells), clock), key="costmodel-residuals")
    if run is not None:
        errors = ds.q("ui_costmodel_error", dataclasses.replace(f, runs=tuple(pooled)))
        if not errors.empty:
            widgets.show_chart(charts.name_clock(charts.error_by_batch(errors), clock), key="costmodel-error")
        st.subheader("Fitted table")
        widgets.table(mine[mine["model"] == model], key="costmodel-fit", column_config={
            "value_ms": st.column_config.NumberColumn("value (ms; context: ms per 1000 tokens)", format="%.4f"),
            "stderr_ms": st.column_config.NumberColumn("std. error", format="%.4f")})
        if table is not None:
            st.download_button("Download the fitted table (SGLang additive JSON)", data=costtable.to_json(table),
                               file_name=f"dspark_sps-{run}.json", mime="application/json", key="cm_download",
                               icon=":material/download:", on_click="ignore",
                               help="Serve it with --speculative-dspark-sps-table-path")
