"""A run as a collector leaves it (many files, each spanning the run's rids) against the same run compacted.

    python -m bench.compact --rows 3000000 --workdir W [--repeat 2] [--json F]

``bench.gen_store`` writes one run in files of ``--block-requests`` requests each (400: files of about
20k request-steps, as a collector flushing every 5 s at 4k request-steps/s leaves them; rids sort by
workload, so every file spans every workload's range).  A copy is compacted with ``dspark-obs compact``
(timed: the one-off cost), then ``dspark-obs estimate --jobs 1`` runs on the fragmented store and on the
compacted one in turn (alternating, ``--repeat`` times each), and ``dspark-obs calibrate --labels all
--jobs 1`` once on each: every command its own process, start-up included; CPU is user + system.  The
two stores' ``ceiling`` tables are compared: a speed-up counts only with the same estimates.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.common import machine, run_child, run_process, stats


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("dspark-obs")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dspark_obs.cli"]


def generate_fragmented(root: str, rows: int, block_requests: int) -> dict:
    """The store, written in a child process (``bench.common.run_child``)."""
    from bench.gen_store import generate

    info = generate(root, rows=rows, block_requests=block_requests)
    return {"rows": info["rows"], "files": len(list(Path(root).glob("step_reqs/run_id=bench/part-*.parquet")))}


def _ceiling(root: str):
    table = pq.read_table(sorted(Path(root).glob("ceiling/run_id=bench/part-*.parquet")))
    return table.take(pc.sort_indices(table, [("rid", "ascending"), ("dp_rank", "ascending"),
                                              ("forward_ct", "ascending")]))


def _files(root: str, table: str) -> int:
    return len(list(Path(root).glob(f"{table}/run_id=bench/part-*.parquet")))


def run(*, workdir: str, rows: int = 3_000_000, block_requests: int = 400, repeat: int = 2) -> dict:
    """The figures as flat ``compact.*`` keys (CPU s, walls, ratios, files, load)."""
    fragmented, compacted = os.path.join(workdir, f"fragmented-{rows}"), os.path.join(workdir, f"compacted-{rows}")
    info = run_child("bench.compact:generate_fragmented", timeout=3600, root=fragmented, rows=rows,
                     block_requests=block_requests)
    if "error" in info:
        return {"compact.error": info["error"]}
    shutil.rmtree(compacted, ignore_errors=True)
    shutil.copytree(fragmented, compacted)
    res: dict = {"compact.rows": info["rows"], "compact.files_before": info["files"],
                 "compact.load_1m_start": round(os.getloadavg()[0], 2)}
    done = run_process(_cli() + ["compact", "--data", compacted], repeat=1, timeout=3600)
    if "error" in done:
        return {**res, "compact.error": done["error"]}
    res.update({"compact.compact_cpu_s": round(done["cpu"][0], 2), "compact.compact_wall_s": round(done["wall"][0], 2),
                "compact.compact_peak_mb": round(done["peak_rss_mb"], 1),
                "compact.files_after": _files(compacted, "step_reqs"),
                "compact.tokens_files": f"{_files(fragmented, 'tokens')} -> {_files(compacted, 'tokens')}"})
    for command, times in (("estimate", repeat), ("calibrate", 1)):
        extra = ["--labels", "all"] if command == "calibrate" else []
        cpu: dict[str, list[float]] = {"fragmented": [], "compacted": []}
        for i in range(times):
            for side in (("fragmented", "compacted") if i % 2 == 0 else ("compacted", "fragmented")):
                root = fragmented if side == "fragmented" else compacted
                out = run_process(_cli() + [command, "--data", root, "--run", "bench", "--jobs", "1", *extra],
                                  repeat=1, timeout=7200)
                if "error" in out:
                    return {**res, "compact.error": f"{command} on the {side} store: {out['error']}"}
                cpu[side].append(out["cpu"][0])
        for side, values in cpu.items():
            res[f"compact.{command}_{side}_cpu_s"] = round(stats(values)["median"], 2)
            res[f"compact.{command}_{side}_cpu_s_all"] = [round(v, 2) for v in values]
        res[f"compact.{command}_speedup"] = round(res[f"compact.{command}_fragmented_cpu_s"]
                                                  / res[f"compact.{command}_compacted_cpu_s"], 3)
    a, b = _ceiling(fragmented), _ceiling(compacted)
    res["compact.same_ceiling"] = all(a.column(c).equals(b.column(c)) for c in ("rid", "forward_ct", "lo", "mid", "hi"))
    res["compact.load_1m_end"] = round(os.getloadavg()[0], 2)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=3_000_000)
    ap.add_argument("--block-requests", type=int, default=400, help="requests per file as generated")
    ap.add_argument("--repeat", type=int, default=2, help="estimate runs per store (alternating)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    res = {**{f"machine.{k}": v for k, v in machine().items()},
           **run(workdir=args.workdir, rows=args.rows, block_requests=args.block_requests, repeat=args.repeat)}
    for key, value in res.items():
        print(f"{key:42s} {value}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, sort_keys=True))
    return 0 if "compact.error" not in res and res.get("compact.same_ceiling") else 1


if __name__ == "__main__":
    raise SystemExit(main())
