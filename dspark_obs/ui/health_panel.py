"""The dashboard's trimming-health block: verdicts per run from :mod:`dspark_obs.health` (Overview page).

Kept in its own module so a page shows it with one call: the same figures
and verdicts ``dspark-obs doctor --data D --run R`` prints, under the
sidebar's filters.
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dspark_obs import health
from dspark_obs.ui import charts, widgets

_ICON = {"fail": ":material/error:", "warn": ":material/warning:", "info": ":material/info:"}


def _state(ds, run: str) -> health.ServerState | None:
    info = ds.q("ui_run_info", run_id=run)
    if info.empty:
        return None
    row = info.iloc[0]
    try:
        args = json.loads(row["server_info"]) if isinstance(row["server_info"], str) else {}
    except ValueError:
        args = {}
    gamma = row.get("gamma")
    return health.ServerState.from_args(args if isinstance(args, dict) else {}, mode=str(row.get("mode") or ""),
                                        gamma=None if pd.isna(gamma) else int(gamma))


def render(ds, f, *, max_runs: int = 4) -> None:
    """Trimming health of the runs under the filters: verdict, key figures, expected vs actual by position."""
    with widgets.guard("Trimming health"):
        frame = ds.q("health_figures", f)
        st.subheader("Trimming health: is DSpark doing its job?")
        pooled = frame[(frame["dp_rank"] == "*") & (frame["workload"] == "*")].head(max_runs)
        if pooled.empty:
            widgets.no_rows()
            return
        for row in pooled.to_dict("records"):
            run = row["run_id"]
            found = health.diagnose(health.run_row(frame, run), state=_state(ds, run))
            inactive = any(x.code == "trimming_inactive" for x in found)
            st.markdown(f"**{run}** · " + ("trimming inactive" if inactive else "trimming active"
                                           if any(x.code == "trimming_active" for x in found) else "not judged"))
            c = st.columns(5)
            c[0].metric("budget-trimmed", f"{row['budget_trimmed_share']:.1%}",
                        help="request-steps the planner's budget trimmed; 0 = trimming inactive")
            c[1].metric("trim ratio", f"{row['trim_ratio']:.3f}", help="verified slots / no-trim slots")
            c[2].metric("trim regret", "-" if pd.isna(row["trim_regret"]) else f"{row['trim_regret']:.1%}",
                        help="trimmed request-steps that accepted their whole window")
            c[3].metric("acceptance", "-" if pd.isna(row["acceptance"]) else f"{row['acceptance']:.3f}",
                        delta=None if pd.isna(row["spec_accept_rate"]) else
                        f"SGLang's rate {row['spec_accept_rate']:.3f}", delta_color="off", delta_arrow="off",
                        help="accepted / drafts verified; SGLang's spec_accept_rate divides by the full block")
            share = row.get("observation_share")
            c[4].metric("observation cost", "-" if pd.isna(share) else f"{share:.2%}",
                        delta=None if pd.isna(row.get("poll_ms")) else f"{row['poll_ms']:.1f} ms per poll",
                        delta_color="off", delta_arrow="off",
                        help="share of wall time the server spent answering the collector's polls and clears "
                             "(its own cost to the server; known once the run is closed)")
            for x in (x for x in found if x.severity in ("fail", "warn")):
                st.warning(f"**{x.severity.upper()}: {x.what}**: {x.evidence}" + (f"  \nFix: {x.fix}" if x.fix else ""),
                           icon=_ICON[x.severity])
        pos = ds.q("health_by_position", f)
        if not pos.empty:
            widgets.show_chart(charts.expected_vs_actual(pos[pos["run_id"].isin(pooled["run_id"])]),
                               key="overview-health-expected")
        st.caption("The same verdicts as `dspark-obs doctor --data D --run R` (limits: the report's thresholds).")
