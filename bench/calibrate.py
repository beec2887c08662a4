"""``dspark-obs calibrate --labels all`` and ``dspark-obs report``, this tree against a baseline tree, as processes.

    python -m bench.calibrate --rows 1000000 --workdir W --baseline /path/to/main-checkout [--repeat 3]

On one generated store (``bench.gen_store``, estimated once with ``dspark-obs
estimate`` so that the reconstructed labels exist), each command runs as its
own process (start-up included) from this tree and from the baseline tree
(the report once untimed first, so that both find the stages it runs when missing)
(``PYTHONPATH`` pointing at each), each side's report right after its own
calibrate (the report reads what calibrate kept), the sides alternating which
goes first, ``repeat`` times.  Rows/s is request-step rows per CPU second of the
process (user + system, all its threads and waited-for children), with the wall
rate beside it; the load average is printed before every run.  The tables each
side wrote are compared (``calibration``, ``calibration_bins``; the report's
figures) on the columns both sides write: a speed-up counts only with the same results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

from bench.common import ROOT, machine, run_child, run_process, stats

_KEYS = ("labels", "workload", "position", "binning")


def _cli(tree: str) -> tuple[list[str], dict]:
    """The console script, importing the package from ``tree`` (PYTHONPATH goes before the editable install)."""
    exe = Path(sys.executable).with_name("dspark-obs")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from dspark_obs.cli import app; app()"]
    return cmd, {"PYTHONPATH": str(tree), "COLUMNS": "200"}


def _rows(root: str) -> int:
    files = sorted(Path(root).glob("step_reqs/run_id=bench/*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def _table(root: str, table: str) -> list[dict]:
    files = sorted(Path(root).glob(f"{table}/run_id=bench/*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    keys = _KEYS + (("bin",) if table == "calibration_bins" else ())
    return sorted(rows, key=lambda r: tuple(str(r.get(k)) for k in keys))


def _without(rows: list[dict], columns: tuple[str, ...]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in columns} for r in rows]


def max_difference(a: list[dict], b: list[dict]) -> float:
    """Largest relative difference of two row lists on the columns both have (inf when their lengths or
    non-float values differ); a column one side adds is not compared."""
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        for k, u in x.items():
            if k not in y:
                continue
            v = y[k]
            if isinstance(u, float) and isinstance(v, float):
                if math.isnan(u) and math.isnan(v):
                    continue
                worst = max(worst, abs(u - v) / max(abs(u), abs(v), 1e-300))
            elif u != v:
                return math.inf
    return worst


def _figures(out: str) -> list[dict]:
    summary = json.loads((Path(out) / "summary.json").read_text())
    keep = ("metric", "run_id", "workload", "position", "value", "ci_low", "ci_high", "n", "verdict")
    return sorted(({k: f.get(k) for k in keep} for f in summary["figures"]),
                  key=lambda f: tuple(str(f[k]) for k in ("metric", "workload", "position")))


def run(*, rows: int, workdir: str, baseline: str, repeat: int = 3, report: bool = True, jobs: int | None = None,
        baseline_store: str | None = None, report_defaults: bool = False) -> dict:
    """``report_defaults``: the report as users run it, PNG export and history included (default: both off,
    the figures alone).  ``baseline_store``: the baseline reads this store, one its own writer made (the same data in the layout
    it writes; estimated by the baseline when it has no ceiling), so a change of layout is timed as users get
    it; default: both read ``workdir``'s store."""
    root = os.path.join(workdir, f"store-{rows}")
    if not (Path(root) / "step_reqs").is_dir():
        info = run_child("bench.estimate:generate_store", timeout=3600, root=root, rows=rows)
        if "error" in info:
            return {"calibrate.error": f"generating the store: {info['error']}"}
    n = _rows(root)
    sides = {"ours": str(ROOT), "baseline": str(Path(baseline).resolve())}
    roots = {"ours": root, "baseline": baseline_store or root}
    if _rows(roots["baseline"]) != n:
        return {"calibrate.error": f"the baseline's store {roots['baseline']} holds other data than {root}"}
    extra = [] if jobs is None else ["--jobs", str(jobs)]
    commands = {"calibrate": lambda side: ["calibrate", "--data", roots[side], "--run", "bench", "--labels", "all",
                                           *extra]}
    if report:
        flags = [] if report_defaults else ["--no-png", "--no-history"]
        commands["report"] = lambda side: ["report", "--data", roots[side], "--run", "bench", *flags,
                                           "--out", os.path.join(workdir, f"report-{side}"), *extra]
    for side in dict.fromkeys(sides if baseline_store else ["ours"]):
        cmd, env = _cli(sides[side])
        if not (Path(roots[side]) / "ceiling").is_dir():
            r = run_process(cmd + ["estimate", "--data", roots[side], "--run", "bench", "--bootstrap", "0"],
                            repeat=1, env=env, timeout=7200)
            if "error" in r:
                return {"calibrate.error": f"estimate ({side}): {r['error']}"}
        if report:   # the report runs the stages a store lacks (the cost model): once, untimed, so both sides find them
            run_process(cmd + commands["report"](side), repeat=1, env=env, timeout=7200)
    res: dict = {"calibrate.rows": n, "calibrate.machine": machine(), "calibrate.stores": roots}
    times: dict = {(c, s): {"cpu": [], "wall": []} for c in commands for s in sides}
    outputs: dict = {}
    for i in range(repeat):
        for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            for command, args in commands.items():
                load = os.getloadavg()[0]
                cmd, env = _cli(sides[side])
                r = run_process(cmd + args(side), repeat=1, env=env, timeout=7200)
                if "error" in r:
                    res[f"{command}.{side}.error"] = r["error"]
                    continue
                times[command, side]["cpu"].append(r["cpu"][0])
                times[command, side]["wall"].append(r["wall"][0])
                print(f"  {command:9s} {side:8s} run {i + 1}: {r['cpu'][0]:7.2f} CPU s  {r['wall'][0]:7.2f} wall s  "
                      f"peak {r['peak_rss_mb']:6.0f} MB  load {load:.2f}", flush=True)
                if command == "calibrate" and side not in outputs:
                    outputs[side] = {t: _table(roots[side], t) for t in ("calibration", "calibration_bins")}
                if command == "report" and f"report-{side}" not in outputs:
                    outputs[f"report-{side}"] = _figures(os.path.join(workdir, f"report-{side}"))
    for (command, side), t in times.items():
        if t["cpu"]:
            cpu, wall = stats(t["cpu"])["median"], stats(t["wall"])["median"]
            res[f"{command}.{side}.cpu_s"] = round(cpu, 2)
            res[f"{command}.{side}.wall_s"] = round(wall, 2)
            res[f"{command}.{side}.rows_per_s"] = round(n / cpu)
            res[f"{command}.{side}.wall_rows_per_s"] = round(n / wall)
    for command in commands:
        if f"{command}.ours.cpu_s" in res and f"{command}.baseline.cpu_s" in res:
            res[f"{command}.cpu_ratio"] = round(res[f"{command}.baseline.cpu_s"] / res[f"{command}.ours.cpu_s"], 2)
    if {"ours", "baseline"} <= set(outputs):
        for t in ("calibration", "calibration_bins"):
            res[f"calibrate.max_rel_diff.{t}"] = max_difference(outputs["ours"][t], outputs["baseline"][t])
        res["calibrate.max_rel_diff.calibration_without_ci"] = max_difference(
            *(_without(outputs[side]["calibration"], ("ece_ci_lo", "ece_ci_hi")) for side in ("ours", "baseline")))
    if {"report-ours", "report-baseline"} <= set(outputs):
        res["report.max_rel_diff.figures"] = max_difference(outputs["report-ours"], outputs["report-baseline"])
        res["report.max_rel_diff.values"] = max_difference(  # the figures, their intervals aside
            *(_without(outputs[f"report-{side}"], ("ci_low", "ci_high")) for side in ("ours", "baseline")))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workdir", required=True, help="keeps the store between runs")
    ap.add_argument("--baseline", required=True, help="a checkout of the baseline code (e.g. a worktree at main)")
    ap.add_argument("--baseline-store", help="the store the baseline reads, written by its own tree "
                    "(`cd TREE && python -m bench.gen_store S --rows N`); default: the workdir's")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", type=int, help="--jobs for both commands (default: theirs, all cores)")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--report-defaults", action="store_true",
                    help="time the report at its defaults (PNG export and history on), as the target reads")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    res = run(rows=args.rows, workdir=args.workdir, baseline=args.baseline, repeat=args.repeat,
              report=not args.no_report, jobs=args.jobs, baseline_store=args.baseline_store,
              report_defaults=args.report_defaults)
    print(json.dumps(res, indent=1, sort_keys=True))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
