"""Calibration: reliability per position and workload, metrics with CIs, label modes side by side, STS."""

import json

import pandas as pd
import streamlit as st

from dspark_obs.estimators.calibration import sts
from dspark_obs.ui import charts, urlstate, verdicts, widgets
from dspark_obs.ui.charts.base import sorted_workloads
from dspark_obs.ui.charts.calibration import RECALIBRATION_ORDER

ds, f = widgets.page("Calibration",
                     "Does the head's survival S_k = c_1...c_k predict that the first k drafts survive a full-block "
                     "verify? Label modes score the same predictions against different truths: observed (the run's "
                     "own records), reconstructed (the ceiling estimator), companion (a cap-accept replay).")

_LABEL_PREFERENCE = ("companion", "reconstructed", "observed")
# the figures the report gates (debiased ECE, AUROC) beside the plug-in ECE and Brier
_METRICS = ("ece", "debiased_ece", "brier", "auroc")
_VIEWS = ("reliability diagram", "metrics by position")
_VIEWS_HELP = ("reliability diagram: predicted survival against the observed rate per bin and draft position; "
               "metrics by position: ECE (plug-in and debiased), Brier and AUROC with their CIs, against the "
               "report's limits.")


@st.cache_data(show_spinner="Fitting STS temperatures ...", max_entries=32)
def _fit_sts(root: str, version: str, run: str, labels: str, current: tuple | None) -> dict:
    """Fit STS on the run (cached per store version); plain data for the page."""

    con, lock = ds.connection()
    with lock:
        fit = sts.fit_sts_run(con, run, labels=labels, current_temperatures=list(current) if current else None,
                              dataset=f"dspark-obs:{run}:labels={labels}")
    return {"temperatures": fit.temperatures, "ece_before": fit.ece_before, "ece_after": fit.ece_after,
            "ece_reported": fit.ece_reported, "num_samples": fit.num_samples, "json": fit.to_sglang().to_json()}


def _served_sts_path(run: str) -> str | None:
    runs = ds.q("ui_run_info", run_id=run)
    if runs.empty or not isinstance(runs["server_info"].iloc[0], str):
        return None
    try:
        info = json.loads(runs["server_info"].iloc[0])
    except ValueError:
        return None
    return info.get("speculative_dspark_confidence_sts_path") if isinstance(info, dict) else None


cal = pd.DataFrame()
with widgets.guard("Calibration tables"):
    c1, c2, c3 = st.columns(3)
    binning = c3.selectbox("Binning", ["width15", "width20", "mass15"], key="cal_binning",
                           help="15 equal-width bins (SGLang), 20 (DeepSpec), or 15 equal-mass bins.")
    cal = ds.q("ui_calibration", f, binning=binning)
    if cal.empty:
        widgets.needs_table(ds, "calibration", "dspark-obs calibrate --data {data} --run RUN --labels all",
                            "This page")
    else:
        run = c1.selectbox("Run scored", list(dict.fromkeys(cal["run_id"])), key="cal_run")
        compare = c2.segmented_control("Compare", ["label modes", "workloads"], default="label modes",
                                       key="cal_compare") or "label modes"
        mine = cal[cal["run_id"] == run]
        bins = ds.q("ui_calibration_bins", f, binning=binning)
        bins = bins[bins["run_id"] == run]
        if compare == "label modes":
            workloads = sorted_workloads(mine["workload"])
            workload = st.selectbox("Workload", workloads, key="cal_workload",
                                    format_func=lambda w: "all workloads (*)" if w == "*" else w)
            sel, sel_bins, color_by = (mine[mine["workload"] == workload], bins[bins["workload"] == workload],
                                       "labels")
            missing = [k for k in _LABEL_PREFERENCE if k not in set(mine["labels"])]
            if missing and mine["mode"].iloc[0] == "compact":
                st.caption("Not scored here: " + ", ".join(missing) + f" labels (run `dspark-obs calibrate --data "
                           f"{widgets.cli_root(ds)} --run {run} --labels all` after `dspark-obs estimate`, with a "
                           "cap-accept companion for companion labels).")
        else:
            kinds = [k for k in reversed(_LABEL_PREFERENCE) if k in set(mine["labels"])]
            kind = st.selectbox("Labels", kinds, index=len(kinds) - 1, key="cal_labels")
            sel = mine[(mine["labels"] == kind) & (mine["workload"] != "*")]
            sel_bins = bins[(bins["labels"] == kind) & (bins["workload"] != "*")]
            color_by = "workload"
        # One view at a time (kept in the URL): what a browser spends on this page is the axes it draws.
        view = urlstate.segmented_control("Show", list(_VIEWS), key="cal_view", help=_VIEWS_HELP)
        if view == "reliability diagram":
            # The counts row doubles the figure's axes: on request.
            counts = urlstate.toggle("Bin counts under the reliability diagram", key="cal_counts",
                                     help="A row of request-steps per bin (log scale) under each position; without "
                                          "it the marker sizes and hovers still show them.")
            widgets.show_chart(charts.reliability_diagram(sel_bins, color_by=color_by, count_row=counts),
                               key="calibration-reliability")
        else:
            widgets.show_chart(charts.calibration_metrics(sel, color_by=color_by, metrics=_METRICS,
                                                          limits=verdicts.report_limits(ds, f)),
                               key="calibration-metrics")
        with st.expander("Metrics as a table"):
            widgets.table(sel, key="calibration", column_config={
                c: st.column_config.NumberColumn(format="%.4f")
                for c in ("mean_predicted", "observed_rate", "ece", "ece_ci_lo", "ece_ci_hi", "debiased_ece",
                          "mce", "brier", "log_loss", "auroc")})

with widgets.guard("Recalibration held out"):
    st.subheader("Recalibration beyond temperature (held out)")
    recal = ds.q("ui_recalibration", f)
    if recal.empty:
        st.caption(f"Run `dspark-obs calibrate --data {widgets.cli_root(ds)} --run RUN --recalibrate` to fit STS, "
                   "Platt, isotonic and beta maps on half of the requests and score them on the other half.")
    else:
        r1, r2, r3 = st.columns(3)
        recal_run = r1.selectbox("Run", list(dict.fromkeys(recal["run_id"])), key="recal_run")
        mine = recal[recal["run_id"] == recal_run]
        recal_labels = r2.selectbox("Labels", list(dict.fromkeys(mine["labels"])), key="recal_labels")
        mine = mine[mine["labels"] == recal_labels]
        recal_workload = r3.selectbox("Workload", sorted_workloads(mine["workload"]), key="recal_workload",
                                      format_func=lambda w: "all workloads (*)" if w == "*" else w)
        sel = mine[mine["workload"] == recal_workload]
        metric = urlstate.segmented_control("Held-out metric", ["ece", "brier"], key="recal_metric",
                                            help="ECE or Brier score of each map on the held-out half, per position.")
        widgets.show_chart(charts.recalibration_held_out(sel, metric=metric), key=f"calibration-recal-{metric}")
        means = sel.groupby("method")["ece"].mean()
        st.caption("Mean held-out ECE over positions: " + ", ".join(f"{m} {means[m]:.4f}" for m in
                   RECALIBRATION_ORDER if m in means) + ". Only STS loads into SGLang 0.5.23.")

with widgets.guard("Stored STS calibrations"):
    st.subheader("Sequential Temperature Scaling")
    stored = ds.q("ui_sts_calibrations", f)
    if not stored.empty:
        labels_of = [f"{r.run_id}: {r.path}" for r in stored.itertuples()]
        pick = st.selectbox("Stored STS file", range(len(stored)), format_func=lambda i: labels_of[i],
                            key="sts_stored", help="Imported with `dspark-obs ingest --sts FILE`.")
        row = stored.iloc[pick]
        temps = list(row["temperatures"]) if row["temperatures"] is not None else []
        before = list(row["ece_before"]) if row["ece_before"] is not None else []
        after = list(row["ece_after"]) if row["ece_after"] is not None else []
        if temps and len(before) == len(temps) and len(after) == len(temps):
            frame = pd.DataFrame({"position": range(1, len(temps) + 1), "temperature": temps,
                                  "ece_raw": before, "ece_after": after})
            widgets.show_chart(charts.sts_before_after(frame), key="calibration-sts-stored")
        else:
            st.caption(f"The file holds temperatures {temps} but no per-position ECE before/after to draw.")
        st.download_button("Download this STS JSON", data=str(row["raw_json"] or ""),
                           file_name=str(row["path"]).rsplit("/", 1)[-1] or "sts.json", mime="application/json",
                           key="sts_stored_download", icon=":material/download:", on_click="ignore")

with widgets.guard("Sequential Temperature Scaling"):
    if cal.empty:
        st.caption("Fit STS with `dspark-obs calibrate --data D --run RUN --fit-sts sts.json` (after scoring the "
                   "run); store a file for this page with `dspark-obs ingest --sts sts.json`.")
    else:
        run = st.session_state.get("cal_run") or cal["run_id"].iloc[0]
        kinds = [k for k in _LABEL_PREFERENCE if k in set(cal[cal["run_id"] == run]["labels"])]
        left, right = st.columns([0.6, 0.4])
        labels = left.selectbox("Fit on labels", kinds, key="sts_labels",
                                help="The most trustworthy full-block truth first; a compact run's observed labels "
                                     "miss the censored tails and bias the fit.")
        served = _served_sts_path(run)
        current = None
        upload = right.file_uploader("STS JSON the server ran with", type=["json"], key="sts_current",
                                     help="Recorded confidences are after the server's STS; the fit needs those "
                                          "temperatures to recover the raw logits.")
        if upload is not None:
            from dspark_obs.sts_format import StsCalibration

            current = tuple(StsCalibration.from_json(upload.getvalue()).temperatures)
        if served and current is None:
            st.warning(f"`{run}` was served with STS `{served}`: upload that file to fit on raw logits.",
                       icon=":material/warning:")
        elif st.toggle("Fit STS on this run", key="sts_fit",
                       help="Fits SGLang's per-position temperatures (41-point grid + refinement) on the run."):
            fit = _fit_sts(ds.root, ds.version, run, labels, current)
            frame = pd.DataFrame({"position": range(1, len(fit["temperatures"]) + 1),
                                  "temperature": fit["temperatures"], "ece_raw": fit["ece_before"],
                                  "ece_served": fit["ece_reported"] if current else None,
                                  "ece_after": fit["ece_after"]})
            widgets.show_chart(charts.sts_before_after(frame), key="calibration-sts")
            st.download_button("Download STS JSON", data=fit["json"], file_name=f"sts-{run}.json",
                               mime="application/json", key="sts_download", icon=":material/download:",
                               on_click="ignore",
                               help="Serve it with --speculative-dspark-confidence-sts-path")
            st.caption(f"Fitted on {fit['num_samples']} request-steps with {labels} labels.")
        else:
            st.caption("Switch on the fit to see ECE per position before and after STS and download SGLang's JSON.")
