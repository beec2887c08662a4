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


def test_ingest_of_server_info_loads_neither_pandas_nor_pyarrow_dataset(tmp_path):
    # pyarrow imports pandas the first time it builds an array, and pyarrow.dataset imports it too: 0.5-0.8 CPU s
    # and ~45 MB per ingest. The command tells pyarrow pandas is absent and reads the store without datasets.
    body = {"internal_states": [{"dspark_info_record": {
        "mode": "compact", "gamma": 2, "verify_num_draft_tokens": 3, "components": ["core", "reqs"],
        "records": [{"forward_ct": 1, "bs": 1, "reqs": [{
            "req_pool_index": 0, "prefix_len": 3, "verify_len": 2, "acc_len": 2, "correct_drafts": 1, "cap_trim": 0,
            "bonus_token": 5, "draft_tokens": [1, 2], "rid": "chat-1", "confidence": [0.5, 0.25],
            "survival": [0.5, 0.125]}]}]}}], "version": "0.5.23"}
    path = tmp_path / "info.jsonl"
    path.write_text(json.dumps(body, separators=(",", ":")) + "\n")
    code = ("import json, sys; from dspark_obs.cli import app\n"
            "try:\n    app(['ingest', '--out', sys.argv[1], '--run-id', 'r', '--server-info', sys.argv[2]])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print(json.dumps([m for m in ('pandas', 'pyarrow.dataset', 'scipy', 'duckdb') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d"), str(path)], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    from dspark_obs.store import Store

    reqs = Store(tmp_path / "d").read("step_reqs", "r").to_pylist()
    assert [(q["rid"], q["draft_tokens"], q["survival"]) for q in reqs] == [("chat-1", [1, 2], [0.5, 0.125])]
    assert Store(tmp_path / "d").read("requests", "r").column("workload").to_pylist() == ["chat"]
