"""Scaling of ``--engine ray``: the shipped commands with 1 and 2 Ray workers beside the local path.

    python -m bench.ray_scaling [--rows 1000000] [--repeat 1] [--workdir DIR] [--json OUT]

Generates a store (``bench.gen_store``), copies it once per configuration, and
times, as processes, what a user runs::

    dspark-obs estimate  --data COPY --run bench [--engine ray --ray-workers N]
    dspark-obs calibrate --data COPY --run bench --labels observed [...]

(and ``estimate --fit-in FIT``, the models fitted once beforehand, so the sharded part
shows apart from the driver's fixed-size fit) for ``local`` (``--jobs`` default: all
cores), ``ray`` with 1 worker and ``ray`` with 2, interleaved ``--repeat``
times (medians reported: a shared machine's load moves during the run).  Also timed: a bare
``ray.init(num_cpus=N); ray.shutdown()`` (the fixed cost each Ray command pays
here), so the per-row work can be told from the start-up.  Afterwards the
tables the Ray runs wrote are compared with the local ones (``equal``: per-step
rows exactly, summaries to 1e-9), as the Ray tier checks at 1M rows on a directory.

Prints wall seconds, request-steps per wall second, CPU seconds of the command
and the children it reaps (not Ray's workers, which are the raylet's: the Ray
rows understate), and the machine's load; writes the figures as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402

CONFIGS = (("local", []), ("ray-1", ["--engine", "ray", "--ray-workers", "1"]),
           ("ray-2", ["--engine", "ray", "--ray-workers", "2"]))
FIT = "fit.json"   # in the workdir: the models of the run, fitted once by an untimed local estimate
COMMANDS = {"estimate-fit-in": ["estimate", "--run", "bench", "--bootstrap", "200", "--fit-in", FIT],
            "estimate": ["estimate", "--run", "bench", "--bootstrap", "200"],
            "calibrate": ["calibrate", "--run", "bench", "--labels", "observed", "--bootstrap", "200"]}
"""``estimate-fit-in`` reuses a fit (``--fit-in``, as a nightly job can reuse yesterday's): what is left is the
part the tasks share; ``estimate`` also fits the models on the driver, a fixed-size serial step."""


def _cli() -> list[str]:
    return [sys.executable, "-c", "import sys; from dspark_obs.cli import app; sys.argv[0] = 'dspark-obs'; app()"]


def timed(cmd: list[str], *, timeout: float = 3600) -> dict:
    """Wall and CPU seconds (the process and its reaped children) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-8:])}: exit {out.returncode}: {out.stderr[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_1m_before": round(load, 2)}


def ray_start_cost(workers: int) -> dict:
    code = f"import ray; ray.init(num_cpus={workers}, include_dashboard=False, log_to_driver=False); ray.shutdown()"
    return timed([sys.executable, "-c", code])


def _tables_equal(a: Path, b: Path) -> dict:
    """The tables the local run wrote into ``a`` against the Ray run's in ``b``."""
    from dspark_obs.store import Store

    keys = {"ceiling": ["rid", "dp_rank", "forward_ct"], "ceiling_summary": ["workload"],
            "ceiling_validation": ["group_kind", "group"], "calibration": ["workload", "position", "binning"],
            "calibration_bins": ["workload", "position", "binning", "bin"]}
    out = {}
    for table, cols in keys.items():
        x = Store(a).read(table, "bench").sort_by([(c, "ascending") for c in cols]).to_pylist()
        y = Store(b).read(table, "bench").sort_by([(c, "ascending") for c in cols]).to_pylist()
        worst, same = 0.0, len(x) == len(y) and len(x) > 0
        for r, s in zip(x, y):
            for k, u in r.items():
                v = s[k]
                if isinstance(u, float) and isinstance(v, float):
                    if not (math.isnan(u) and math.isnan(v)):
                        worst = max(worst, abs(u - v) / max(1.0, abs(u)))
                elif u != v:
                    same = False
        out[table] = {"rows": len(x), "equal": same and worst <= (0.0 if table == "ceiling" else 1e-9),
                      "max_rel_diff": worst}
    return out


def run(rows: int, workdir: Path, *, repeat: int = 1) -> dict:
    from bench.gen_store import generate

    base = workdir / "store"
    if not (base / "step_reqs").is_dir():
        generate(base, rows=rows, seed=0)
    result: dict = {"rows": rows, "machine": machine(), "ray_start": {}, "runs": {}}
    for name, _ in CONFIGS[1:]:
        result["ray_start"][name] = ray_start_cost(int(name.split("-")[1]))
    for name, _ in CONFIGS + (("fit", []),):
        shutil.rmtree(workdir / name, ignore_errors=True)
        shutil.copytree(base, workdir / name)
    result["fit_s"] = timed([*_cli(), "estimate", "--run", "bench", "--bootstrap", "0", "--data", str(workdir / "fit"),
                             "--jobs", "1", "--fit-out", str(workdir / FIT)])
    for attempt in range(repeat):   # configurations interleaved, so a change of the machine's load hits all
        for command, args in COMMANDS.items():
            args = [str(workdir / FIT) if a == FIT else a for a in args]
            for name, flags in CONFIGS:
                figure = timed([*_cli(), *args, "--data", str(workdir / name), *flags])
                result["runs"].setdefault(f"{command}.{name}", []).append(figure)
                print(f"{command:15s} {name:6s} {figure['wall_s']:7.1f} s wall  {rows / figure['wall_s']:>9,.0f} rows/s  "
                      f"{figure['cpu_s']:7.1f} CPU s  load {figure['load_1m_before']}", flush=True)
    for key, figures in result["runs"].items():
        wall = statistics.median(f["wall_s"] for f in figures)
        result["runs"][key] = {"wall_s_median": wall, "rows_per_s_wall": round(rows / wall), "attempts": figures}
    for name, _ in CONFIGS[1:]:
        result[f"equal.{name}"] = _tables_equal(workdir / "local", workdir / name)
    for command in COMMANDS:
        r1, r2 = result["runs"][f"{command}.ray-1"], result["runs"][f"{command}.ray-2"]
        result[f"{command}.speedup_1_to_2"] = round(r1["wall_s_median"] / r2["wall_s_median"], 3)
        start = {k: v["wall_s"] for k, v in result["ray_start"].items()}
        w1, w2 = r1["wall_s_median"] - start["ray-1"], r2["wall_s_median"] - start["ray-2"]
        result[f"{command}.speedup_1_to_2_after_start"] = round(w1 / w2, 3) if w2 > 0 else None
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=1, help="attempts per configuration (medians are reported)")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dspark-ray-scaling-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = run(args.rows, workdir, repeat=args.repeat)
    for command in COMMANDS:
        print(f"{command}: 1 -> 2 Ray workers {result[f'{command}.speedup_1_to_2']}x wall "
              f"({result[f'{command}.speedup_1_to_2_after_start']}x after Ray's start-up)")
    for name in ("ray-1", "ray-2"):
        eq = result[f"equal.{name}"]
        print(f"{name} tables equal to local: " + ", ".join(f"{t} {v['equal']}" for t, v in eq.items()))
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
