"""The CLI starts without the heavy libraries: each command imports what it needs when it runs.

Start-up is paid by every command, ``--help`` and shell completion included;
Arrow, DuckDB, numpy, scipy, pandas, Streamlit and Plotly together cost more
than the CLI itself.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("pyarrow", "duckdb", "numpy", "scipy", "pandas", "streamlit", "plotly", "msgspec", "httpx")


def test_importing_the_cli_loads_no_heavy_library():
    code = ("import json, sys; import dspark_obs.cli; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_sql_layer_knows_every_table_without_importing_an_estimator(tmp_path):
    # Result schemas are declared in dspark_obs.schema: a connection has the estimators' views, and
    # neither the estimators nor scipy load for it (every data command pays for what it imports).
    code = ("import json, sys; from dspark_obs import sql; "
            f"con = sql.connect({str(tmp_path)!r}); "
            "views = {r[0] for r in con.execute('SELECT view_name FROM duckdb_views()').fetchall()}; "
            "print(json.dumps([sorted({'ceiling', 'calibration', 'replay_whatif', 'reports'} - views), "
            "[m for m in sys.modules if m.startswith('dspark_obs.estimators') or m == 'scipy']]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[], []]
