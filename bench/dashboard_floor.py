"""The framework's floor for the dashboard benchmark: a bare Streamlit page with one small Plotly chart.

Served with the dashboard's own ``streamlit run`` flags and timed the same way,
it is the same-run baseline of ``bench/dashboard.py``: what any Streamlit page
that draws a Plotly figure costs in this browser on this machine, before a
single query runs.
"""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

st.title("Floor")
st.dataframe(pd.DataFrame({"workload": ["gsm8k", "arena-hard", "poetry"], "accept length": [5.1, 3.7, 2.6]}),
             hide_index=True)
st.plotly_chart(go.Figure(go.Bar(x=["gsm8k", "arena-hard", "poetry"], y=[5.1, 3.7, 2.6])), theme=None)
