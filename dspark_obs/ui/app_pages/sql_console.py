"""SQL console: read-only DuckDB over the store's views, with the canned queries, a row limit and a time limit."""

import json
import time

import streamlit as st

from dspark_obs import schema
from dspark_obs import sql as sqlmod
from dspark_obs.ui import widgets
from dspark_obs.ui.data import query_parameters

ds, f = widgets.page("SQL console",
                     "Read-only DuckDB over the store: one view per table (plus `step_reqs_w`: step_reqs with "
                     "workload, temperature and window; `quarantined_files`). Only SELECT, EXPLAIN [ANALYZE] SELECT "
                     "and catalogue PRAGMAs run, each on a connection of its own that cannot open or write any file; "
                     "the sidebar filters do not apply here. The same views answer `dspark-obs sql --data D \"...\"`.",
                     needs_runs=False)

OWN = "(your own query)"
DEFAULT_SQL = ("SELECT workload, count(*) AS request_steps, avg(\"window\") AS mean_window, avg(acc_len) AS "
               "mean_acc_len\nFROM step_reqs_w\nGROUP BY workload\nORDER BY workload")
canned = sqlmod.canned_queries()
st.session_state.setdefault("sql_text", DEFAULT_SQL)


def _pick_canned() -> None:
    name = st.session_state["sql_canned"]
    st.session_state["sql_text"] = canned[name][1] if name in canned else DEFAULT_SQL


def _parse(value: str):
    value = value.strip()
    if value.upper() == "NULL":
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


with widgets.guard("SQL console"):
    name = st.selectbox("Canned query", [OWN, *sorted(canned)], key="sql_canned", on_change=_pick_canned,
                        format_func=lambda n: n if n == OWN else f"{n} - {canned[n][0]}")
    with st.form("sql_form"):
        text = st.text_area("SQL", key="sql_text", height=220)
        params = {}
        if name != OWN:
            declared = sorted(query_parameters(name))
            if declared:
                cols = st.columns(min(len(declared), 4))
                for i, p in enumerate(declared):
                    raw = cols[i % len(cols)].text_input(
                        f"${p}", key=f"sql_param_{name}_{p}", placeholder="default",
                        help="A JSON value (\"text\", 3, [\"a\", \"b\"], null); empty keeps the query's default.")
                    if raw.strip():
                        params[p] = _parse(raw)
        c1, c2, _ = st.columns([0.25, 0.25, 0.5])
        limit = c1.number_input("Row limit", min_value=1, max_value=100_000, value=1000, step=100, key="sql_limit")
        timeout = c2.number_input("Time limit (s)", min_value=1, max_value=600, value=30, key="sql_timeout")
        run = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")
    if run:
        st.session_state.pop("sql_result", None)
        # a canned query runs by name so its parameter defaults apply; an edited text runs as written
        statement = name if name != OWN and text.strip() == canned[name][1].strip() else text
        start = time.perf_counter()
        try:
            result = ds.console(statement, params, limit=int(limit), timeout_s=float(timeout))
        except sqlmod.QueryTimeout:
            st.error(f"The query ran longer than the time limit of {timeout:g} s and was stopped: raise the limit "
                     "or narrow it with WHERE / LIMIT.", icon=":material/timer_off:")
        except PermissionError as exc:  # the message names the statement type refused and what is allowed
            st.error(f"The console is read-only. {exc}", icon=":material/lock:")
        except Exception as exc:  # DuckDB errors carry the position of the mistake
            st.error(f"Query failed: {exc}", icon=":material/error:")
        else:
            st.session_state["sql_result"] = (result.to_pandas(), time.perf_counter() - start, int(limit))
    if "sql_result" in st.session_state:
        frame, elapsed, lim = st.session_state["sql_result"]
        more = " (the row limit; there may be more)" if len(frame) >= lim else ""
        st.caption(f"{len(frame)} rows{more} in {elapsed:.2f} s")
        widgets.table(frame, key="sql-result")
        st.download_button("Download CSV", data=frame.to_csv(index=False), file_name="query.csv", mime="text/csv",
                           key="sql_csv", icon=":material/download:", on_click="ignore")

with st.expander("Views and columns"):
    for table, sch in schema.TABLES.items():
        st.markdown(f"**{table}**: " + ", ".join(f"`{n}`" for n in [*sch.names, "run_id"]))
    st.markdown("**step_reqs_w**: step_reqs + `workload`, `temperature`, `window`")
