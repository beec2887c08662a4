"""Ingest: the shipped ``dspark-obs ingest --server-info FILE`` against a json+pandas baseline, as processes.

The file holds ``bodies`` successive ``/server_info`` bodies (bs 256, gamma 6,
confidences and survivals), one per line as ``curl`` saves them, made from the
emulator's engine (compact mode, 256 requests in flight, mixed workloads and
temperatures) and encoded as the server encodes them.

Both sides run as their own process on the same file, alternating, ``repeat``
times: **ours** is the command users run (start-up, the decoder, the cursor,
the Parquet commit into a fresh store); the **baseline** is what one would
otherwise write, ``json.loads`` per line, one dict per request-step, a pandas
``DataFrame`` and ``to_parquet`` (its start-up, pandas' import included, counts
too).  Rows/s is request-step rows per CPU second of the process (user + system,
all its threads), with the wall rate beside it; peak memory is the process's
peak RSS, and for ours also above the idle command (``dspark-obs --version``).
``ingest.inprocess_*`` rows are the decoder and commit alone, in one process,
labelled as such.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.common import full_batch_payload, measure, run_child, run_process, stats

GAMMA = 6
BATCH = 256


def make_body(path: str, *, records: int, batch: int = BATCH, seed: int = 0) -> dict:
    """Write one ``/server_info`` body with ``records`` full-batch decode records to ``path``."""
    return make_bodies(path, bodies=1, records=records, batch=batch, seed=seed)


def make_bodies(path: str, *, bodies: int, records: int, batch: int = BATCH, seed: int = 0) -> dict:
    """Write ``bodies`` successive bodies of ``records`` full-batch records each, one per line."""
    import msgspec

    payload = full_batch_payload(records=bodies * records, batch=batch, gamma=GAMMA,
                                 max_records=bodies * records + 64, seed=seed)
    size = 0
    with open(path, "wb") as f:
        for b in range(bodies):
            part = {**payload, "records": payload["records"][b * records:(b + 1) * records]}
            data = msgspec.json.encode({"internal_states": [{"dspark_info_record": part,
                                                             "avg_spec_accept_length": 3.2}],
                                        "version": "0.5.23", "startup_time": 1.0})
            f.write(data + b"\n")
            size = max(size, len(data))
    return {"bytes": os.path.getsize(path), "largest_body_bytes": size, "rows": bodies * records * batch,
            "records": bodies * records}


def ours(body: str, repeat: int) -> dict:
    """In-process: decode + Arrow tables + committed Parquet of each body, ``repeat`` times."""
    from collectors.importers import iter_documents
    from collectors.sglang.decode import decode_server_info, records_to_tables
    from dspark_obs.store import Store

    root = tempfile.mkdtemp(prefix="bench-ingest-")
    store = Store(root)
    rows = [0]

    def once() -> None:
        n = 0
        for doc in iter_documents(body):
            for rank in decode_server_info(doc.data).ranks:
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


def baseline(body: str, out: str) -> int:
    """``json.loads`` + a pandas DataFrame of one dict per request-step + ``to_parquet``; the rows."""
    import pandas as pd

    table = []
    with open(body, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            doc = json.loads(line)
            for rank, state in enumerate(doc["internal_states"]):
                for rec in state["dspark_info_record"]["records"]:
                    for q in rec.get("reqs") or []:
                        table.append({"dp_rank": rank, "forward_ct": rec["forward_ct"], **q})
    pd.DataFrame(table).to_parquet(out, compression="zstd")
    return len(table)


def _cli() -> list[str]:
    """The installed ``dspark-obs`` beside this interpreter (what users run), else ``python -m dspark_obs``."""
    exe = Path(sys.executable).with_name("dspark-obs")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dspark_obs"]


def _command(body: str, out: str) -> list[str]:
    return _cli() + ["ingest", "--out", out, "--run-id", "bench", "--server-info", body]


def run(*, quick: bool, workdir: str, tiny: bool = False) -> dict:
    bodies, records = (2, 4) if tiny else (3, 60) if quick else (10, 200)
    repeat = 1 if tiny else 3 if quick else 5
    body = os.path.join(workdir, f"server_info-{bodies}x{records}.jsonl")
    info = make_bodies(body, bodies=bodies, records=records, batch=32 if tiny else BATCH)
    rows = info["rows"]
    res: dict = {"ingest.file_mb": round(info["bytes"] / 1e6, 1), "ingest.bodies": bodies,
                 "ingest.rows_per_body": rows // bodies, "ingest.largest_body_mb": round(info["largest_body_bytes"] / 1e6, 1)}
    idle = run_process(_cli() + ["--version"], repeat=1)
    runs: dict[str, list[dict]] = {"ours": [], "baseline": []}
    for i in range(repeat):  # alternate, so both sides see the same machine load
        out = os.path.join(workdir, f"ingest-store-{i}")
        shutil.rmtree(out, ignore_errors=True)
        runs["ours"].append(run_process(_command(body, out), repeat=1))
        shutil.rmtree(out, ignore_errors=True)
        runs["baseline"].append(run_process([sys.executable, "-c", "import sys; from bench.ingest import baseline; "
                                             "print(baseline(sys.argv[1], sys.argv[2]))", body,
                                             out + ".parquet"], repeat=1))
    for side, prefix in (("ours", "ingest"), ("baseline", "ingest.baseline")):
        failed = [r for r in runs[side] if "error" in r]
        if failed:
            res[f"{prefix}.error"] = failed[0]["error"]
            continue
        cpu = stats([rows / r["cpu"][0] for r in runs[side]])
        res[f"{prefix}.rows_per_s"] = round(cpu["median"])
        res[f"{prefix}.rows_per_s_min"] = round(cpu["min"])
        res[f"{prefix}.rows_per_s_max"] = round(cpu["max"])
        res[f"{prefix}.rows_per_s_wall"] = round(stats([rows / r["wall"][0] for r in runs[side]])["median"])
        res[f"{prefix}.cpu_s"] = round(stats([r["cpu"][0] for r in runs[side]])["median"], 3)
        res[f"{prefix}.peak_mb"] = round(max(r["peak_rss_mb"] for r in runs[side]), 1)
    if "error" not in idle:
        res["ingest.idle_peak_mb"] = round(idle["peak_rss_mb"], 1)
        if "ingest.peak_mb" in res:
            above = res["ingest.peak_mb"] - res["ingest.idle_peak_mb"]
            res["ingest.peak_above_idle_per_body"] = round(above / (info["largest_body_bytes"] / 2**20), 2)
    if "ingest.rows_per_s" in res and "ingest.baseline.rows_per_s" in res:
        res["ingest.baseline_rows_per_s"] = res.pop("ingest.baseline.rows_per_s")
        res["ingest.ratio"] = round(res["ingest.rows_per_s"] / res["ingest.baseline_rows_per_s"], 2)
        res["ingest.baseline_peak_mb"] = res.pop("ingest.baseline.peak_mb")
    inproc = run_child("bench.ingest:ours", timeout=900, body=body, repeat=repeat)
    if "error" not in inproc:
        res["ingest.inprocess_rows_per_s"] = round(stats([inproc["rows"] / c for c in inproc["cpu"]])["median"])
    return res
