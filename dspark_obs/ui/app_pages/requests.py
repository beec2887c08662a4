"""Request explorer: one request's step timeline, confidences and survival, and committed tokens."""

import pandas as pd
import streamlit as st

from dspark_obs.ui import charts, urlstate, widgets

# ranking -> (column of ui_worst_requests, ascending)
_RANKINGS = {"tokens lost to trimming": ("tokens_lost", False), "lowest utilisation": ("utilisation", True),
             "slowest": ("e2e_latency_s", False), "submission order": (None, True)}

# A longer list is unusable as a drop-down, and each option costs the browser time to build on every load
_MAX_LISTED = 100
_VIEWS = ("step timeline", "confidences and survival", "committed tokens")
_VIEWS_HELP = ("step timeline: the window, accepted drafts and full-block ceiling per step; confidences and "
               "survival: the head's c_k and S_k per step and position; committed tokens: their target logprobs.")


def _steps_view(ds, run: str, rid: str, workload: str, *, timeline: bool) -> None:
    steps = ds.q("ui_request_steps", run_id=run, rid=rid)
    if steps.empty:
        st.info("No decode steps logged for this request (the records may have been lost: see the Overview's "
                "gaps).", icon=":material/info:")
    elif timeline:
        widgets.show_chart(charts.request_timeline(steps, workload=workload,
                                                   title=f"{rid}: window, accepted drafts and full-block ceiling"),
                           key="request-timeline")
        if steps["ceiling_mid"].isna().all() and steps["truth_block"].isna().all():
            widgets.needs_table(ds, "ceiling", f"dspark-obs estimate --data {{data}} --run {run}",
                                "The estimated ceiling per step")
    else:
        widgets.show_chart(charts.confidence_heatmap(steps), key="request-confidence")


def _tokens_view(ds, run: str, rid: str) -> None:
    tokens = ds.q("ui_request_tokens", run_id=run, rid=rid)
    if tokens.empty:
        st.info("No tokens stored for this request (the driver stores them when it asks for logprobs).",
                icon=":material/info:")
        return
    widgets.show_chart(charts.token_logprobs(tokens), key="request-tokens")
    with st.expander("Tokens with logprobs and top alternatives"):
        widgets.table(tokens, key="tokens", column_config={"logprob": st.column_config.NumberColumn(format="%.4f")})


ds, f = widgets.page("Request explorer",
                     "Pick a request to follow it step by step: the window the scheduler gave it, what it accepted, "
                     "what a full block would have accepted, the head's confidences, and the tokens it committed.")

with widgets.guard("Request explorer"):
    c1, c2 = st.columns([0.4, 0.6])
    search = c2.text_input("Filter request ids", key="rq_search", placeholder="e.g. poetry-0000").strip() or None
    requests = ds.q("ui_request_list", f, rid_like=search, max_rows=5000)
    if requests.empty:
        st.info("No requests match the filters (the requests table is filled by the collector's driver).",
                icon=":material/filter_alt_off:")
        st.stop()
    info = ds.q("ui_runs", f)
    modes = dict(zip(info["run_id"], info["mode"]))
    run_ids = sorted(dict.fromkeys(requests["run_id"]), key=lambda r: (modes.get(r) != "compact", r))
    run = c1.selectbox("Run", run_ids, key="rq_run", help="Compact runs first: their ceiling is the hidden one.")
    mine = requests[requests["run_id"] == run]
    worst = ds.q("ui_worst_requests", f, run_id=run)
    order = list(mine["rid"])
    if not worst.empty:
        rank = st.segmented_control("Worst requests first, by", list(_RANKINGS), default="tokens lost to trimming",
                                    key="rq_rank") or "submission order"
        column, ascending = _RANKINGS[rank]
        if column is not None:
            ranked = worst.sort_values(column, ascending=ascending, na_position="last")
            listed, ranked_ids = set(order), ranked["rid"].tolist()
            first = set(ranked_ids)
            order = [r for r in ranked_ids if r in listed] + [r for r in order if r not in first]
            with st.expander(f"The 10 worst by {rank} ({worst['clock'].iloc[0]} clock for latencies)"):
                widgets.table(ranked.head(10), key="worst", column_config={
                    "utilisation": st.column_config.NumberColumn(format="percent"),
                    **{c: st.column_config.NumberColumn(format="%.4f") for c in ("e2e_latency_s", "ttft_s", "itl_s")},
                    "tokens_lost": st.column_config.NumberColumn("tokens lost to trimming", format="%.2f")})
    shown = order[:_MAX_LISTED]
    label = (f"Request ({len(mine)} shown)" if len(order) <= _MAX_LISTED else
             f"Request (the first {_MAX_LISTED} of {len(order)} in this order; filter the ids to reach the others)")
    rid = st.selectbox(label, shown, key="rq_rid")
    req = mine[mine["rid"] == rid].iloc[0]
    m = st.columns(6)
    m[0].metric("workload", str(req["workload"]))
    m[1].metric("temperature", f"{req['temperature']:g}" if pd.notna(req["temperature"]) else "-")
    m[2].metric("output tokens", f"{req['completion_tokens']:.0f}" if pd.notna(req["completion_tokens"]) else "-")
    m[3].metric("decode steps", f"{req['spec_verify_ct']:.0f}" if pd.notna(req["spec_verify_ct"]) else "-")
    m[4].metric("accept length", f"{req['spec_accept_length']:.2f}" if pd.notna(req["spec_accept_length"]) else "-")
    m[5].metric("finish", str(req["finish_reason"]) if pd.notna(req["finish_reason"]) else "-")

    mine_worst = worst[worst["rid"] == rid]
    if not mine_worst.empty:
        w = mine_worst.iloc[0]
        clock = f"{w['clock']} clock"
        lat = st.columns(5)
        for col, (label, value, unit) in zip(lat, (
                ("end-to-end", w["e2e_latency_s"], "s"), ("time to first token", w["ttft_s"], "s"),
                ("inter-token", w["itl_s"] * 1e3 if pd.notna(w["itl_s"]) else None, "ms"),
                ("tokens lost to trimming", w["tokens_lost"], ""), ("utilisation", w["utilisation"], "%"))):
            text = "-" if value is None or pd.isna(value) else (f"{value:.1%}" if unit == "%" else f"{value:.3f} {unit}")
            col.metric(label, text.strip(), help=f"on the {clock}" if unit in ("s", "ms") else None)

    # One view at a time: a hidden chart would still be built, sent and drawn on every load.
    view = urlstate.segmented_control("Show", list(_VIEWS), key="rq_view", help=_VIEWS_HELP)
    if view == "committed tokens":
        _tokens_view(ds, run, rid)
    else:
        _steps_view(ds, run, rid, str(req["workload"]), timeline=view == "step timeline")
