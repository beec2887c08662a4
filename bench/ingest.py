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
labelled as such.  ``python -m bench.ingest [--quick] [--compare main=TREE]``
prints the figures, with the load; ``--compare`` times another source tree's
command in the same run (before/after).
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


def cli_command() -> list[str]:
    """The installed ``dspark-obs`` beside this interpreter (what users run), else ``python -m dspark_obs.cli``."""
    exe = Path(sys.executable).with_name("dspark-obs")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dspark_obs.cli"]


def _command(body: str, out: str) -> list[str]:
    return cli_command() + ["ingest", "--out", out, "--run-id", "bench", "--server-info", body]


def _baseline_command(body: str, out: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from bench.ingest import baseline; print(baseline(sys.argv[1], sys.argv[2]))",
            body, out]


def _figures(runs: list[dict], rows: int, prefix: str, res: dict) -> None:
    """Median (min, max) rows per CPU second, the wall rate, median CPU seconds and peak RSS of one side."""
    failed = [r for r in runs if "error" in r]
    if failed:
        res[f"{prefix}.error"] = failed[0]["error"]
        return
    cpu = stats([rows / r["cpu"][0] for r in runs])
    res[f"{prefix}.rows_per_s"] = round(cpu["median"])
    res[f"{prefix}.rows_per_s_min"] = round(cpu["min"])
    res[f"{prefix}.rows_per_s_max"] = round(cpu["max"])
    res[f"{prefix}.rows_per_s_wall"] = round(stats([rows / r["wall"][0] for r in runs])["median"])
    res[f"{prefix}.cpu_s"] = round(stats([r["cpu"][0] for r in runs])["median"], 3)
    res[f"{prefix}.peak_mb"] = round(max(r["peak_rss_mb"] for r in runs), 1)


def run(*, quick: bool, workdir: str, tiny: bool = False, compare: dict[str, str] | None = None) -> dict:
    """The command and the baseline, alternating, on one file; ``compare`` adds the command of other
    source trees (label -> ``PYTHONPATH``), e.g. main's code beside a branch's, in the same run.

    Peak memory above idle is given twice: above ``dspark-obs --version`` (the CLI alone) and above the
    same command on a one-record file (the CLI with pyarrow, numpy and msgspec loaded: what the data costs).
    """
    bodies, records = _sizes(quick=quick, tiny=tiny)
    repeat = 1 if tiny else 3 if quick else 5
    body = body_file(workdir, quick=quick, tiny=tiny)
    info = make_bodies(body, bodies=bodies, records=records, batch=32 if tiny else BATCH)
    rows = info["rows"]
    body_mib = info["largest_body_bytes"] / 2**20
    res: dict = {"ingest.file_mb": round(info["bytes"] / 1e6, 1), "ingest.bodies": bodies,
                 "ingest.rows_per_body": rows // bodies, "ingest.largest_body_mb": round(info["largest_body_bytes"] / 1e6, 1),
                 "ingest.load_1m_start": round(os.getloadavg()[0], 2)}
    one = os.path.join(workdir, "server_info-1x1.jsonl")
    make_bodies(one, bodies=1, records=1, batch=4)
    sides = {"ingest": ({}, _command), "ingest.baseline": ({}, _baseline_command)}
    for label, tree in (compare or {}).items():
        sides[f"ingest.{label}"] = ({"PYTHONPATH": tree}, _command)
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    idle: dict[str, list[dict]] = {side: [] for side in sides if side != "ingest.baseline"}
    for i in range(repeat):  # alternate, so every side sees the same machine load
        for side, (env, command) in sides.items():
            out = os.path.join(workdir, f"ingest-store-{i}")
            shutil.rmtree(out, ignore_errors=True)
            runs[side].append(run_process(command(body, out + (".parquet" if side == "ingest.baseline" else "")),
                                          repeat=1, env=env))
            shutil.rmtree(out, ignore_errors=True)
            if side in idle and i < 2:
                idle[side].append(run_process(_command(one, out), repeat=1, env=env))
                shutil.rmtree(out, ignore_errors=True)
    res["ingest.load_1m_end"] = round(os.getloadavg()[0], 2)
    for side in sides:
        _figures(runs[side], rows, side, res)
    version = run_process(cli_command() + ["--version"], repeat=1)
    if "error" not in version:
        res["ingest.idle_peak_mb"] = round(version["peak_rss_mb"], 1)
    for side, idle_runs in idle.items():
        if f"{side}.peak_mb" not in res:
            continue
        if "ingest.idle_peak_mb" in res:
            res[f"{side}.peak_above_idle_per_body"] = round((res[f"{side}.peak_mb"] - res["ingest.idle_peak_mb"]) / body_mib, 2)
        if idle_runs and all("error" not in r for r in idle_runs):
            floor = min(r["peak_rss_mb"] for r in idle_runs)
            res[f"{side}.idle_command_peak_mb"] = round(floor, 1)
            res[f"{side}.idle_command_cpu_s"] = round(min(r["cpu"][0] for r in idle_runs), 3)
            res[f"{side}.peak_above_idle_command_per_body"] = round((res[f"{side}.peak_mb"] - floor) / body_mib, 2)
    if "ingest.rows_per_s" in res and "ingest.baseline.rows_per_s" in res:
        res["ingest.baseline_rows_per_s"] = res.pop("ingest.baseline.rows_per_s")
        res["ingest.baseline_cpu_s"] = res.pop("ingest.baseline.cpu_s")
        res["ingest.ratio"] = round(res["ingest.rows_per_s"] / res["ingest.baseline_rows_per_s"], 2)
        res["ingest.baseline_peak_mb"] = res.pop("ingest.baseline.peak_mb")
    inproc = run_child("bench.ingest:ours", timeout=900, body=body, repeat=repeat)
    if "error" not in inproc:
        res["ingest.inprocess_rows_per_s"] = round(stats([inproc["rows"] / c for c in inproc["cpu"]])["median"])
    return res


def _sizes(*, quick: bool, tiny: bool) -> tuple[int, int]:
    """``(bodies, records per body)`` of the file :func:`run` times."""
    return (2, 4) if tiny else (3, 60) if quick else (10, 200)


def body_file(workdir: str, *, quick: bool, tiny: bool = False) -> str:
    """The file of bodies :func:`run` writes in ``workdir`` (``bench/floors.py`` reads it too)."""
    bodies, records = _sizes(quick=quick, tiny=tiny)
    return os.path.join(workdir, f"server_info-{bodies}x{records}.jsonl")


def report(res: dict) -> str:
    """The figures of :func:`run` as lines: each side's median rate, CPU seconds, ratio, memory, and the load."""
    lines = [f"dspark-obs ingest --server-info: {res['ingest.bodies']} bodies x {res['ingest.rows_per_body']:,} rows "
             f"({res['ingest.largest_body_mb']} MB the largest); load {res['ingest.load_1m_start']} -> "
             f"{res['ingest.load_1m_end']} (1-min average, {os.cpu_count()} cores)"]
    sides = sorted({k.rsplit(".", 1)[0] for k in res if k.endswith(".rows_per_s_wall")} | {"ingest.baseline"})
    for side in ["ingest"] + [s for s in sides if s not in ("ingest", "ingest.baseline")] + ["ingest.baseline"]:
        base = side == "ingest.baseline"
        rate = res.get("ingest.baseline_rows_per_s" if base else f"{side}.rows_per_s")
        if rate is None:
            lines.append(f"  {side}: {res.get(side + '.error', 'no figure')}")
            continue
        cpu = res.get("ingest.baseline_cpu_s" if base else f"{side}.cpu_s")
        peak = res.get("ingest.baseline_peak_mb" if base else f"{side}.peak_mb")
        line = (f"  {side:28s} {rate / 1e3:8.1f}k rows/CPU s  [{res[side + '.rows_per_s_min'] / 1e3:.1f}k-"
                f"{res[side + '.rows_per_s_max'] / 1e3:.1f}k]  wall {res[side + '.rows_per_s_wall'] / 1e3:.1f}k/s  "
                f"CPU {cpu:.2f} s  peak {peak:.0f} MiB")
        if not base and f"{side}.peak_above_idle_per_body" in res:
            line += (f"  above --version {res[side + '.peak_above_idle_per_body']}x body, above the command on a "
                     f"1-record file {res.get(side + '.peak_above_idle_command_per_body')}x "
                     f"(that run: {res.get(side + '.idle_command_cpu_s')} CPU s)")
        lines.append(line)
    if "ingest.ratio" in res:
        lines.append(f"  ratio ours / json+pandas baseline: {res['ingest.ratio']}x; "
                     f"in-process decode + commit: {res.get('ingest.inprocess_rows_per_s', 0) / 1e3:.1f}k rows/CPU s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Time dspark-obs ingest --server-info beside a json+pandas baseline.")
    ap.add_argument("--quick", action="store_true", help="3 bodies of 15,360 rows, 3 runs (default: 10 x 51,200, 5 runs)")
    ap.add_argument("--workdir", help="keep the body and stores here (default: a temporary directory)")
    ap.add_argument("--compare", action="append", default=[], metavar="LABEL=TREE",
                    help="also time the command of another source tree (its PYTHONPATH), e.g. main=/path/to/main")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-ingest-")
    os.makedirs(workdir, exist_ok=True)
    try:
        res = run(quick=args.quick, workdir=workdir, compare=dict(c.split("=", 1) for c in args.compare))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
