"""Request explorer: one request's step timeline, confidences and survival, and committed tokens."""

import pandas as pd
import streamlit as st

from dspark_obs.ui import charts, widgets

ds, f = widgets.context()
st.title("Request explorer")
st.caption("Pick a request to follow it step by step: the window the scheduler gave it, what it accepted, what "
           "a full block would have accepted, the head's confidences, and the tokens it committed.")
if ds.empty:
    widgets.empty_store_notice(ds)
    st.stop()

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
    rid = st.selectbox(f"Request ({len(mine)} shown)", list(mine["rid"]), key="rq_rid")
    req = mine[mine["rid"] == rid].iloc[0]
    m = st.columns(6)
    m[0].metric("workload", str(req["workload"]))
    m[1].metric("temperature", f"{req['temperature']:g}" if pd.notna(req["temperature"]) else "-")
    m[2].metric("output tokens", f"{req['completion_tokens']:.0f}" if pd.notna(req["completion_tokens"]) else "-")
    m[3].metric("decode steps", f"{req['spec_verify_ct']:.0f}" if pd.notna(req["spec_verify_ct"]) else "-")
    m[4].metric("accept length", f"{req['spec_accept_length']:.2f}" if pd.notna(req["spec_accept_length"]) else "-")
    m[5].metric("finish", str(req["finish_reason"]) if pd.notna(req["finish_reason"]) else "-")

    steps = ds.q("ui_request_steps", run_id=run, rid=rid)
    if steps.empty:
        st.info("No decode steps logged for this request (the records may have been lost: see the Overview's "
                "gaps).", icon=":material/info:")
    else:
        widgets.show_chart(charts.request_timeline(steps, workload=str(req["workload"]),
                                                   title=f"{rid}: window, accepted drafts and full-block ceiling"),
                           key="request-timeline")
        if steps["ceiling_mid"].isna().all() and steps["truth_block"].isna().all():
            widgets.needs_table(ds, "ceiling", f"dspark-obs estimate --data {{data}} --run {run}",
                                "The estimated ceiling per step")
        widgets.show_chart(charts.confidence_heatmap(steps), key="request-confidence")
    tokens = ds.q("ui_request_tokens", run_id=run, rid=rid)
    if tokens.empty:
        st.info("No tokens stored for this request (the driver stores them when it asks for logprobs).",
                icon=":material/info:")
    else:
        widgets.show_chart(charts.token_logprobs(tokens), key="request-tokens")
        with st.expander("Tokens with logprobs and top alternatives"):
            widgets.table(tokens, key="tokens", column_config={
                "logprob": st.column_config.NumberColumn(format="%.4f")})
