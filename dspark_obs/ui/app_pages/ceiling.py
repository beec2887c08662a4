"""Ceiling: accepted vs full-block acceptance per workload and position, estimate categories, validation."""

import streamlit as st

from dspark_obs.ui import charts, urlstate, verdicts, widgets

ds, f = widgets.page("Ceiling",
                     "Compact mode hides what a full-block verify would have accepted (the ceiling). Cap-accept runs "
                     "show it exactly; for compact runs `dspark-obs estimate` reconstructs it from the tokens "
                     "committed later.")

with widgets.guard("Accepted vs ceiling per workload"):
    wl = ds.q("ui_workloads", f)
    if wl.empty:
        widgets.no_rows()
    else:
        widgets.show_chart(charts.accept_vs_ceiling(wl), key="ceiling-accept-vs-ceiling")

with widgets.guard("Acceptance by position"):
    pos = ds.q("ui_ceiling_position", f)
    if pos.empty:
        widgets.needs_table(ds, "ceiling", "dspark-obs estimate --data {data}",
                            "Acceptance by position (compact runs without a cap-accept run)")
    else:
        widgets.show_chart(charts.acceptance_by_position(pos), key="ceiling-by-position")

with widgets.guard("Estimate categories"):
    cats = ds.q("ui_ceiling_categories", f)
    if cats.empty:
        widgets.needs_table(ds, "ceiling", "dspark-obs estimate --data {data}", "The estimate categories")
    else:
        widgets.show_chart(charts.estimate_categories(cats), key="ceiling-categories")
        with st.expander("Categories as a table"):
            widgets.table(cats, key="categories", column_config={
                "share": st.column_config.NumberColumn(format="percent"),
                "mean_width": st.column_config.NumberColumn("mean hi - lo (drafts)", format="%.3f")})

_VALIDATION_VIEWS = ("estimate vs truth", "interval coverage", "bias by category")
_VALIDATION_HELP = ("estimate vs truth: the mean estimate against the mean truth over equal-count bins of the "
                    "estimate; interval coverage: how often [lo, hi] holds the truth per bin, against the report's "
                    "limit; bias by category: bias and MAE per estimate category and workload.")

with widgets.guard("Estimate vs truth"):
    st.subheader("Estimate vs truth")
    val = ds.q("ui_ceiling_validation", f)
    if val.empty:
        st.info("No validation yet. It needs a truth: a cap-accept companion run of the same prompts and seeds "
                "(`dspark-obs demo` collects one), or an emulator run. Then run "
                f"`dspark-obs estimate --data {widgets.cli_root(ds)}` (it validates against the companion "
                "recorded with the run, or pass `--companion RUN`).", icon=":material/info:")
    else:
        head = val[val["group_kind"].isin(["overall", "all_steps"])]
        modes = dict(zip(*ds.q("ui_runs")[["run_id", "mode"]].to_numpy().T)) if not head.empty else {}
        for _, r in head.iterrows():
            scope = "censored steps" if r["group_kind"] == "overall" else "all steps"
            truth = r["truth_source"] + (f" `{r['companion_run']}`" if isinstance(r["companion_run"], str) else "")
            if modes.get(r["run_id"]) == "cap-accept":
                truth += " — a self-check: a cap-accept run observes its ceiling, so this is no independent truth"
            st.markdown(f"**{r['run_id']}** ({scope}, truth: {truth}): n = {int(r['n'])}, bias "
                        f"{r['bias']:+.4f} drafts, MAE {r['mae']:.4f}, coverage {r['coverage']:.1%}")
        # One view at a time (kept in the URL): each chart drawn costs the browser as much as this page's others.
        view = urlstate.segmented_control("Show", list(_VALIDATION_VIEWS), key="ceil_val", help=_VALIDATION_HELP)
        if view == "estimate vs truth":
            widgets.show_chart(charts.validation_scatter(val), key="ceiling-validation-scatter")
        elif view == "interval coverage":
            coverage_limit = verdicts.report_limits(ds, f).get("estimator_coverage", (None, None))[0]
            widgets.show_chart(charts.validation_coverage(val, limit=coverage_limit),
                               key="ceiling-validation-coverage")
        else:
            widgets.show_chart(charts.validation_bias(val), key="ceiling-validation-bias")
        with st.expander("Validation rows"):
            widgets.table(val, key="validation")
