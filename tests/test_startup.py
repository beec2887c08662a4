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
