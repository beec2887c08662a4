"""Digests of what the demo, ``estimate``, ``calibrate`` and ``report`` write, for pinning them.

A digest covers every row of every table (read file by file, so it needs no
schema registry) and a report's ``summary.json``, with what legitimately
changes from run to run left out: timestamps, the report's id, paths, the
server's address and the collector's wall-clock timing in ``runs``, the
collector's poll time in the report (``observation_share``).  Floats are rounded to 10 significant digits:
DuckDB's parallel sums may differ in the last bits between runs.

    PYTHONPATH=. python tests/output_digest.py STORE   # print the digests of a store
    PYTHONPATH=. python tests/output_digest.py --pin   # the digests tests/outputs_pinned.json holds
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


COMPACT, COMPANION = "demo-compact-s0", "demo-cap-accept-s0"


FIXTURE = Path(__file__).parent / "data" / "demo-collected"
"""What ``dspark-obs demo --quick`` collected (seed 0), one part file per table and run: the demo's collection
is only deterministic on an idle machine (lockstep batching gives up waiting under load), so the pins start
from what it collected once."""

_DEMO_ANALYSIS = """
import sys
from pathlib import Path
from rich.console import Console
from dspark_obs.demo import analyse, write_report
from dspark_obs.store import Store
out, console = Path(sys.argv[1]), Console(stderr=True, width=200)
analyse(Store(out), sys.argv[2], sys.argv[3], console=console)
write_report(out, sys.argv[2], png=False, console=console)
"""


def pinned_outputs(work: Path, collected: Path = FIXTURE) -> dict:
    """The digests the pin compares: the demo's analysis of what it collected (its estimator stages and its
    report), then ``estimate`` and ``calibrate`` run as commands on that store, and ``report`` run as a
    command on a store holding only what was collected (so it runs every stage it needs itself)."""
    import shutil
    import subprocess

    def run(*args: str) -> None:
        subprocess.run([sys.executable, *args], check=True, capture_output=True, env={**os.environ, "COLUMNS": "200"})

    demo = work / "demo"
    shutil.copytree(collected, demo)
    run("-c", _DEMO_ANALYSIS, str(demo), COMPACT, COMPANION)
    out = {"demo": store_digests(demo), "demo_summary": summary_digest(demo / "report" / "summary.json")}
    run("-m", "dspark_obs.cli", "estimate", "--data", str(demo), "--run", COMPACT, "--companion", COMPANION,
        "--bootstrap", "200", "--jobs", "1")
    run("-m", "dspark_obs.cli", "calibrate", "--data", str(demo), "--run", COMPACT, "--labels", "all",
        "--bootstrap", "200", "--jobs", "1")
    out["estimate_calibrate"] = store_digests(demo, ["ceiling", "ceiling_summary", "ceiling_validation",
                                                     "calibration", "calibration_bins"])
    only = work / "collected"
    shutil.copytree(collected, only)
    run("-m", "dspark_obs.cli", "report", "--data", str(only), "--out", str(only / "report"), "--run", COMPACT,
        "--no-png", "--bootstrap", "200", "--jobs", "1")
    out["report"] = store_digests(only)
    out["report_summary"] = summary_digest(only / "report" / "summary.json")
    return out


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:2] == ["--pin"]:  # the digests the pin holds, from the code on PYTHONPATH
        import tempfile

        print(json.dumps(pinned_outputs(Path(tempfile.mkdtemp())), indent=1, sort_keys=True))
    else:
        print(json.dumps(store_digests(sys.argv[1]), indent=1))
