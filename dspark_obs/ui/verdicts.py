"""The latest nightly report's verdicts on the dashboard: a summary block and the limits charts draw."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dspark_obs.ui.data import DataSource, Filters

__all__ = ["limits", "show_verdicts"]

_ICONS = {"fail": ":material/cancel:", "warn": ":material/warning:", "pass": ":material/check_circle:"}


def limits(verdicts: pd.DataFrame) -> dict[str, tuple[float, str]]:
    """``{metric: (limit_value, limit_kind)}`` of the figures the report held to a limit."""
    if verdicts.empty:
        return {}
    held = verdicts.dropna(subset=["limit_value", "limit_kind"]).drop_duplicates("metric")
    return {r.metric: (float(r.limit_value), str(r.limit_kind)) for r in held.itertuples()}


def report_limits(ds: DataSource, filters: Filters | None = None) -> dict[str, tuple[float, str]]:
    """The limits of the latest report (empty when no report has run on this store)."""
    return limits(ds.q("ui_verdicts", filters)) if ds.has("reports") else {}


def show_verdicts(ds: DataSource, filters: Filters) -> None:
    """Counts of the latest report's verdicts and every figure that did not pass, with its limit."""
    st.subheader("Latest report")
    if not ds.has("reports"):
        st.info("No report on this store yet: `dspark-obs report --data D` judges every figure against its limit "
                "(the demo writes one).", icon=":material/info:")
        return
    v = ds.q("ui_verdicts", filters)
    if v.empty:
        st.info("The latest report judged none of the selected runs.", icon=":material/filter_alt_off:")
        return
    head = v.iloc[0]
    counts = v["verdict"].value_counts()
    cols = st.columns(4)
    cols[0].metric("report", str(head["report_status"]).upper(), help=f"{head['report_id']}, {head['generated_at']}")
    for col, verdict in zip(cols[1:], ("fail", "warn", "pass")):
        col.metric(f"figures {verdict}", int(counts.get(verdict, 0)))
    shown = v[v["verdict"].isin(["fail", "warn", "insufficient"])]
    limit = [("" if pd.isna(k) else f"{'<=' if k == 'max' else '>='} {x:.3g}")
             for k, x in zip(shown["limit_kind"], shown["limit_value"])]
    if not shown.empty:
        table = shown.assign(limit=limit)[["verdict", "section", "metric", "run_id", "workload", "worst_value",
                                           "limit", "rows"]]
        st.dataframe(table, hide_index=True, key="table-verdicts", column_config={
            "verdict": st.column_config.TextColumn("verdict", pinned=True),
            "worst_value": st.column_config.NumberColumn("worst value", format="%.4g"),
            "rows": st.column_config.NumberColumn("rows judged", help="positions / label kinds behind the figure")})
    st.caption(f"Report `{head['report_id']}`: the worst value of each figure over its positions and label kinds, "
               "against the limit it is gated on; passing and informational figures are counted or left out, not listed. The calibration and "
               "ceiling charts draw these limits.")
