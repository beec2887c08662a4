"""Compare: a baseline and a candidate (two runs, or two sweeps point by point), deltas with 95% intervals."""

import streamlit as st

from dspark_obs import compare
from dspark_obs.ui import charts, urlstate, widgets

ds, f = widgets.page("Compare",
                     "Baseline against candidate on the headline figures, with 95% bootstrap intervals over requests. "
                     "Both sides must be on the same clock (a virtual-clock emulator run is not comparable with a "
                     "measured one). The choices are kept in the URL, so a comparison can be shared.")

PCT = st.column_config.NumberColumn(format="percent")
NUM = st.column_config.NumberColumn(format="%.4g")
kind = urlstate.selectbox("Compare", ["two runs", "two sweeps"], key="kind")

with widgets.guard("Compare"):
    if kind == "two runs":
        runs = list(ds.q("ui_runs", f)["run_id"])
        if len(runs) < 2:
            st.info("Compare needs two runs in the selection (sidebar).", icon=":material/info:")
            st.stop()
        left, right = st.columns(2)
        base = urlstate.selectbox("Baseline run", runs, key="baseline", container=left)
        cand = urlstate.selectbox("Candidate run", [r for r in runs if r != base], key="candidate", container=right)
        reqs = ds.q("ui_compare_requests", f, runs=[base, cand])
        clocks = sorted(set(reqs["clock"]))
        if len(clocks) > 1:
            st.warning(f"`{base}` and `{cand}` are on different clocks ({', '.join(clocks)}): their times and "
                       "speeds cannot be compared.", icon=":material/warning:")
            st.stop()
        deltas = compare.compare_runs(reqs[reqs["run_id"] == base], reqs[reqs["run_id"] == cand])
        clock = f"{clocks[0] if clocks else 'wall'} clock"
        widgets.show_chart(charts.compare_deltas(deltas, clock=clock, title=f"{cand} against {base}"),
                           key="compare-runs")
        widgets.table(deltas, key="compare-runs", column_config={"relative": PCT, **{
            c: NUM for c in ("baseline", "candidate", "delta", "delta_ci_low", "delta_ci_high")}})
    else:
        points = ds.q("sweep_points")
        sweeps = list(points.sort_values("started_at", ascending=False)["sweep_id"].drop_duplicates())
        if len(sweeps) < 2:
            st.info("Compare needs two sweeps (`dspark-obs sweep --sweep-id ...`, run twice).", icon=":material/info:")
            st.stop()
        left, right = st.columns(2)
        base = urlstate.selectbox("Baseline sweep", sweeps[1:] + sweeps[:1], key="baseline", container=left)
        cand = urlstate.selectbox("Candidate sweep", [s for s in sweeps if s != base], key="candidate",
                                  container=right)
        mine = points[points["sweep_id"].isin([base, cand])]
        clocks = sorted(set(mine["clock"]))
        if len(clocks) > 1:
            st.warning(f"The sweeps are on different clocks ({', '.join(clocks)}).", icon=":material/warning:")
            st.stop()
        reqs = ds.q("ui_compare_requests", runs=list(mine["run_id"]))
        deltas = compare.compare_sweeps(mine, reqs, base, cand)
        st.caption(f"Per point both sweeps have (method, workload, concurrency); on the {clocks[0]} clock.")
        widgets.table(deltas, key="compare-sweeps", column_config={"relative": PCT, **{
            c: NUM for c in ("baseline", "candidate", "delta", "delta_ci_low", "delta_ci_high")}})
