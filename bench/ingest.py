"""Ingest: ``/server_info`` bodies (bs 256, gamma 6, confidences and survivals) -> committed Parquet.

Ours: ``collectors.sglang.decode`` (``decode_server_info`` + ``records_to_tables``)
and ``Store.write`` of ``steps`` and ``step_reqs`` (zstd Parquet, fsynced, renamed
into place), exactly what the collector's writer commits.  Baseline, in the same
run on the same bodies: what one would otherwise write — ``json.loads``, one dict
per request-step, a pandas ``DataFrame``, ``to_parquet``.

The bodies come from the emulator (compact mode, 256 requests in flight, mixed
workloads and temperatures), encoded as the server encodes them.  Each side runs
in its own process; rows/s is per CPU second of that process (one core), with
the wall-clock rate beside it, and peak memory is the process's peak RSS.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import full_batch_payload, measure, run_child, stats

GAMMA = 6
BATCH = 256


def make_body(path: str, *, records: int, batch: int = BATCH, seed: int = 0) -> dict:
    """Write one ``/server_info`` body with ``records`` full-batch decode records to ``path``."""
    import msgspec

    payload = full_batch_payload(records=records, batch=batch, gamma=GAMMA, max_records=records + 64, seed=seed)
    body = {"internal_states": [{"dspark_info_record": payload, "avg_spec_accept_length": 3.2}],
            "version": "0.5.23", "startup_time": 1.0}
    data = msgspec.json.encode(body)
    Path(path).write_bytes(data)
    return {"bytes": len(data), "rows": records * batch, "records": records}


def ours(body: str, repeat: int) -> dict:
    """decode + Arrow tables + committed Parquet, ``repeat`` times on the same body."""
    from collectors.sglang.decode import decode_server_info, records_to_tables
    from dspark_obs.store import Store

    data = Path(body).read_bytes()
    root = tempfile.mkdtemp(prefix="bench-ingest-")
    store = Store(root)
    rows = [0]

    def once() -> None:
        info = decode_server_info(data)
        n = 0
        for rank in info.ranks:
            steps, reqs = records_to_tables(rank.records, dp_rank=rank.dp_rank, segment=0)
            store.write("steps", "bench", steps)
            store.write("step_reqs", "bench", reqs)
            n += reqs.num_rows
        rows[0] = n

    try:
        m = measure(once, repeat=repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"rows": rows[0], "cpu": m["cpu"], "wall": m["wall"]}


def baseline(body: str, repeat: int) -> dict:
    """``json.loads`` + a pandas DataFrame of one dict per request-step + ``to_parquet``."""
    import pandas as pd

    data = Path(body).read_bytes()
    out = Path(tempfile.mkdtemp(prefix="bench-ingest-base-"))
    rows = [0]

    def once() -> None:
        doc = json.loads(data)
        table = []
        for rank, state in enumerate(doc["internal_states"]):
            for rec in state["dspark_info_record"]["records"]:
                for q in rec.get("reqs") or []:
                    table.append({"dp_rank": rank, "forward_ct": rec["forward_ct"], **q})
        df = pd.DataFrame(table)
        df.to_parquet(out / f"part-{time.time_ns()}.parquet", compression="zstd")
        rows[0] = len(table)

    try:
        m = measure(once, repeat=repeat)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"rows": rows[0], "cpu": m["cpu"], "wall": m["wall"]}


def run(*, quick: bool, workdir: str, tiny: bool = False) -> dict:
    records = 4 if tiny else 60 if quick else 200
    repeat = 1 if tiny else 3 if quick else 7
    body = os.path.join(workdir, f"server_info-{records}.json")
    info = make_body(body, records=records, batch=32 if tiny else BATCH)
    res: dict = {"ingest.body_mb": round(info["bytes"] / 1e6, 2), "ingest.rows_per_body": info["rows"]}
    for side, fn in (("ours", "ours"), ("baseline", "baseline")):
        r = run_child(f"bench.ingest:{fn}", timeout=900, body=body,
                      repeat=repeat if side == "ours" else max(1 if tiny else 2, repeat // 2))
        if "error" in r:
            res[f"ingest.{side}_error"] = r["error"]
            continue
        cpu = stats([r["rows"] / c for c in r["cpu"]])
        wall = stats([r["rows"] / w for w in r["wall"]])
        prefix = "ingest" if side == "ours" else "ingest.baseline"
        res[f"{prefix}.rows_per_s"] = round(cpu["median"])
        res[f"{prefix}.rows_per_s_min"] = round(cpu["min"])
        res[f"{prefix}.rows_per_s_max"] = round(cpu["max"])
        res[f"{prefix}.rows_per_s_wall"] = round(wall["median"])
        res[f"{prefix}.peak_mb"] = r["peak_rss_mb"]
    if "ingest.rows_per_s" in res and "ingest.baseline.rows_per_s" in res:
        res["ingest.baseline_rows_per_s"] = res.pop("ingest.baseline.rows_per_s")
        res["ingest.ratio"] = round(res["ingest.rows_per_s"] / res["ingest.baseline_rows_per_s"], 2)
        res["ingest.baseline_peak_mb"] = res.pop("ingest.baseline.peak_mb")
    return res
