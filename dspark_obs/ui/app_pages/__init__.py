"""The dashboard's pages: Streamlit runs each file as a script through ``st.navigation`` (see ``app.py``)."""
