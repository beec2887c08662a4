"""Digests of what the demo, ``estimate``, ``calibrate`` and ``report`` write, for pinning them.

A digest covers every row of every table (read file by file, so it needs no
schema registry) and a report's ``summary.json``, with what legitimately
changes from run to run left out: timestamps, the report's id, paths, the
server's address and the collector's wall-clock timing in ``runs``, the
collector's poll time in the report (``observation_share``).  Floats are rounded to 10 significant digits:
DuckDB's parallel sums may differ in the last bits between runs.

    PYTHONPATH=. python tests/output_digest.py STORE   # print the digests of a store
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

VOLATILE_COLUMNS = {  # the server's address and start, the collector's wall-clock timing
    "runs": {"server_info", "labels", "server_url", "startup_time", "observation_requests", "observation_server_s",
             "collect_s"},
    "reports": {"report_id"}}
VOLATILE_KEYS = {"generated_at", "report_id", "data", "started_at", "ended_at", "start", "end", "out", "path"}
VOLATILE_METRICS = {"observation_share"}  # the collector's poll time over the step time: wall clock
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def _plain(value):
    if isinstance(value, float):
        return value if not math.isfinite(value) or value == 0 else float(f"{value:.10g}")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def table_digest(root: str | Path, table: str) -> str:
    """rows:sha256 of one table's rows (any order), volatile columns and timestamps left out."""
    rows = []
    for path in sorted(glob.glob(os.path.join(glob.escape(str(root)), table, "run_id=*", "part-*.parquet"))):
        data = pq.read_table(path)
        run = path.split("run_id=")[1].split(os.sep)[0]
        cols = [c for c in data.column_names if c not in VOLATILE_COLUMNS.get(table, ())
                and not pa.types.is_timestamp(data.schema.field(c).type)]
        rows += [json.dumps([run] + [_plain(r[c]) for c in cols], default=str) for r in data.select(cols).to_pylist()
                 if r.get("metric") not in VOLATILE_METRICS]
    return f"{len(rows)}:{hashlib.sha256(chr(10).join(sorted(rows)).encode()).hexdigest()[:16]}"


def store_digests(root: str | Path, tables: list[str] | None = None) -> dict[str, str]:
    """:func:`table_digest` of ``tables`` (default: every table with part files)."""
    names = tables if tables is not None else sorted(
        t for t in os.listdir(root) if glob.glob(os.path.join(glob.escape(str(root)), t, "run_id=*", "part-*.parquet")))
    return {t: table_digest(root, t) for t in names}


def _strip(value):
    if isinstance(value, dict):
        if value.get("metric") in VOLATILE_METRICS:
            return None
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [s for s in (_strip(v) for v in value) if s is not None]
    if isinstance(value, str) and _ISO.match(value):
        return "<time>"
    return _plain(value)


def summary_digest(path: str | Path) -> str:
    """sha256 of a report's ``summary.json`` with the volatile keys left out."""
    summary = _strip(json.loads(Path(path).read_text()))
    return hashlib.sha256(json.dumps(summary, sort_keys=True, default=str).encode()).hexdigest()[:16]


RESULT_TABLES = ("ceiling", "ceiling_summary", "ceiling_validation", "calibration", "calibration_bins",
                 "costmodel_error", "costmodel_fit", "replay_conformance", "replay_whatif", "reports")
COMPACT, COMPANION = "demo-compact-s0", "demo-cap-accept-s0"


def pinned_outputs(demo_store: Path, work: Path) -> dict:
    """The digests the pin compares: the demo store, then ``estimate``, ``calibrate`` and ``report`` run as
    commands on copies of it (the report on a copy holding only what was collected, so it runs every stage)."""
    import shutil
    import subprocess

    def cli(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "dspark_obs.cli", *args], check=True, capture_output=True,
                       env={**os.environ, "COLUMNS": "200"})

    out = {"demo": store_digests(demo_store), "demo_summary": summary_digest(demo_store / "report" / "summary.json")}
    copy = work / "estimated"
    shutil.copytree(demo_store, copy)
    cli("estimate", "--data", str(copy), "--run", COMPACT, "--companion", COMPANION, "--bootstrap", "200",
        "--jobs", "1")
    cli("calibrate", "--data", str(copy), "--run", COMPACT, "--labels", "all", "--bootstrap", "200", "--jobs", "1")
    out["estimate_calibrate"] = store_digests(copy, ["ceiling", "ceiling_summary", "ceiling_validation",
                                                     "calibration", "calibration_bins"])
    collected = work / "collected"
    shutil.copytree(demo_store, collected, ignore=shutil.ignore_patterns("report", *RESULT_TABLES))
    cli("report", "--data", str(collected), "--out", str(collected / "report"), "--run", COMPACT, "--no-png",
        "--bootstrap", "200", "--jobs", "1")
    out["report"] = store_digests(collected)
    out["report_summary"] = summary_digest(collected / "report" / "summary.json")
    return out


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:2] == ["--pin"]:  # the digests of a demo store and the commands run on it, as the pin holds them
        import tempfile

        print(json.dumps(pinned_outputs(Path(sys.argv[2]), Path(tempfile.mkdtemp())), indent=1, sort_keys=True))
    else:
        print(json.dumps(store_digests(sys.argv[1]), indent=1))
