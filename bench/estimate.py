"""Ceiling estimate, calibration and the report on generated stores of growing size, as the commands users run.

Per store size (``bench.gen_store``, generated in a child process):

* **the commands** — ``dspark-obs estimate --data D --run bench`` (its
  defaults: request bootstrap included), then ``dspark-obs calibrate --labels
  all``, then ``dspark-obs report``, each its own process (start-up included);
  rows/s is request-step rows per CPU second of the process (user + system,
  all threads), with the wall rate beside it, and peak memory is the
  process's own high-water mark.
* **core** — SGLang's interval rule, vectorised (``walk_blocks`` +
  ``sglang_interval``) on the store's own arrays (its first 1M request-steps,
  whole requests), against the **baseline**: the same rule as a per-row
  Python loop (what ``dspark_block_accept_estimator`` does online), checked to
  give the same ``lo``/``hi``; both in one child process (labelled
  ``core``, in-process figures).

The scaling exponent is the slope of log(CPU seconds) on log(rows) of
``estimate`` + ``calibrate`` over the sizes (1 = linear).

**Before/after** (``python -m bench.estimate --baseline DIR``): the shipped
``dspark-obs estimate`` (its defaults, request bootstrap included) with
``--jobs 1`` and ``--jobs 2`` on one generated store, this tree's code and
the code in ``DIR`` (e.g. ``git archive main | tar -x -C DIR``) run in turn,
interleaved, each its own process; it prints rows per CPU second (user +
system of the process and its workers), wall rows/s, peak memory, the
machine's load around every run, and the largest difference of the two
codes' ``lo``/``mid``/``hi``.
"""

from __future__ import annotations

import os
import time

import numpy as np

from pathlib import Path

from bench.common import ROOT, run_child, run_process


def _arrays(root: str, max_rows: int):
    """The inputs of the walk, as ``estimate_run`` builds them, for the first ``max_rows``
    request-steps (whole requests; the rule's cost per row does not depend on the store's size)."""
    from dspark_obs import sql
    from dspark_obs.estimators.ceiling import inputs
    from dspark_obs.estimators.chunks import plan_chunks
    from dspark_obs.estimators.ceiling.evidence import padded_lists

    con = sql.connect(root)
    chunk = plan_chunks(*inputs.run_rids(con, "bench", root), chunk_rows=max_rows)[0]
    steps, _, gamma = inputs.load_steps(con, "bench", root, chunk)
    drafts = padded_lists(steps.column("draft_tokens"), fill=-1, dtype=np.int64)
    conf = padded_lists(steps.column("confidence"), fill=np.nan, dtype=np.float64)
    window = inputs.column_array(steps, "verify_len", np.int64, 1) - 1
    correct = inputs.column_array(steps, "correct_drafts", np.int64, 0)
    greedy = inputs.column_array(steps, "temperature", np.float64, np.nan) == 0.0
    aligned = inputs.aligned_evidence(con, "bench", steps, drafts, correct, chunk)
    return drafts, window, correct, aligned.evidence.realised, aligned.natural_end, greedy, conf


def sglang_rule_loop(drafts, window, correct, realised, natural_end, a):
    """SGLang's interval rule, one request-step at a time (the baseline)."""
    drafts, realised, a = drafts.tolist(), realised.tolist(), a.tolist()
    window, correct, natural_end = window.tolist(), correct.tolist(), natural_end.tolist()
    n, gamma = len(drafts), len(drafts[0]) if drafts else 0
    lo, hi = [0.0] * n, [0.0] * n
    for i in range(n):
        w, c = window[i], correct[i]
        if c != w or w >= gamma:
            lo[i] = hi[i] = float(c)
            continue
        extra, prod, rest = 0.0, 1.0, 0
        d, r, ai = drafts[i], realised[i], a[i]
        for k in range(w, gamma):
            if r[k] == -1:  # the output ran out: rejected at EOS, unknown otherwise
                rest = 0 if natural_end[i] else gamma - k
                break
            prod *= ai[k]
            extra += prod
            if r[k] != d[k]:
                rest = gamma - k - 1
                break
        lo[i] = w + extra
        hi[i] = lo[i] + prod * rest
    return np.asarray(lo), np.asarray(hi)


def core(root: str, loop_rows: int, max_rows: int = 1_000_000) -> dict:
    from dspark_obs.estimators.ceiling.walk import sglang_interval, walk_blocks

    drafts, window, correct, realised, natural_end, greedy, conf = _arrays(root, max_rows)
    n = len(window)
    eq = (drafts == realised).astype(np.float64)
    a = np.where(greedy[:, None], eq, np.nan_to_num(conf, nan=0.5))
    sglang_interval(walk_blocks(drafts[:8], window[:8], correct[:8], realised[:8], natural_end[:8]), a[:8])  # loads
    c0 = time.process_time()   # the compiled loops (numba), as any run after the first in a process finds them
    walk = walk_blocks(drafts, window, correct, realised, natural_end)
    lo, _, hi = sglang_interval(walk, a)
    vec_cpu = time.process_time() - c0
    m = min(n, loop_rows)
    c0 = time.process_time()
    lo2, hi2 = sglang_rule_loop(drafts[:m], window[:m], correct[:m], realised[:m], natural_end[:m], a[:m])
    loop_cpu = time.process_time() - c0
    same = bool(np.allclose(lo[:m], lo2, rtol=0, atol=1e-9) and np.allclose(hi[:m], hi2, rtol=0, atol=1e-9))
    return {"rows": n, "vec_cpu": vec_cpu, "loop_rows": m, "loop_cpu": loop_cpu, "same": same}


def generate_store(root: str, rows: int) -> dict:
    """``bench.gen_store.generate`` in a child: the generator's memory must not count for the estimator."""
    from bench.gen_store import generate

    info = generate(root, rows=rows)
    return {"rows": info["rows"]}


def _cli() -> list[str]:
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("dspark-obs")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dspark_obs"]


def commands(root: str, out: str) -> dict:
    """CPU, wall and peak of each shipped command on the store ``root`` (run ``bench``), in order."""
    steps = {
        "estimate_jobs1": ["estimate", "--data", root, "--run", "bench", "--jobs", "1"],   # one process
        "estimate": ["estimate", "--data", root, "--run", "bench"],                        # all cores
        "calibrate": ["calibrate", "--data", root, "--run", "bench", "--labels", "all"],
        "report": ["report", "--data", root, "--run", "bench", "--out", out, "--no-png"],
    }
    res = {}
    for name, args in steps.items():
        r = run_process(_cli() + args, repeat=1, timeout=7200)
        res[name] = r if "error" in r else {"cpu": r["cpu"][0], "wall": r["wall"][0], "peak_mb": r["peak_rss_mb"]}
        if "error" in r:
            break
    return res


JOBS_PAIRS = 3
"""Runs of ``estimate --jobs 1`` and of the default (all cores) at the largest size, alternating: the ratio of
their median walls.  One run of each spread 1.55-1.81x on one otherwise idle machine (bench/RESULTS.md)."""


def jobs_pairs(root: str, first: dict, pairs: int = JOBS_PAIRS) -> dict:
    """Walls of ``estimate --jobs 1`` and of the default, ``pairs`` runs each, alternating; ``first`` (the
    :func:`commands` of the store) gives the first run of each.  Fewer when a run fails."""
    walls = {"estimate_jobs1": [first["estimate_jobs1"]["wall"]], "estimate": [first["estimate"]["wall"]]}
    for _ in range(pairs - 1):
        for name, jobs in (("estimate", []), ("estimate_jobs1", ["--jobs", "1"])):
            r = run_process(_cli() + ["estimate", "--data", root, "--run", "bench", *jobs], repeat=1, timeout=7200)
            if "error" in r:
                n = min(len(w) for w in walls.values())
                return {k: w[:n] for k, w in walls.items()}
            walls[name].append(r["wall"][0])
    return walls


def _slope(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    lx, ly = np.log(xs), np.log(ys)
    return float(np.polyfit(lx, ly, 1)[0])


def run(*, quick: bool, workdir: str, sizes: list[int] | None = None, memory_cap_gb: float = 12.0) -> dict:
    sizes = sizes or ([100_000, 300_000, 1_000_000] if quick else [1_000_000, 3_000_000, 10_000_000])
    from dspark_obs.estimators.calibration.chunks import DEFAULT_SAMPLE_ROWS
    from dspark_obs.estimators.chunks import DEFAULT_CHUNK_ROWS, DEFAULT_FIT_ROWS

    res: dict = {"estimate.sizes": ",".join(str(s) for s in sizes), "estimate.chunk_rows": DEFAULT_CHUNK_ROWS,
                 "estimate.fit_rows": DEFAULT_FIT_ROWS, "estimate.calibration_sample_rows": DEFAULT_SAMPLE_ROWS}
    done_rows, done_cpu, done_peak = [], [], []
    last_ok = None
    warm_compiled([str(ROOT)])
    for size in sizes:
        root = os.path.join(workdir, f"store-{size}")
        t0 = time.perf_counter()
        info = run_child("bench.estimate:generate_store", timeout=3600, root=root, rows=size)
        if "error" in info:
            res[f"estimate.error.{size}"] = f"generating the store: {info['error']}"
            continue
        res[f"estimate.gen_s.{size}"] = round(time.perf_counter() - t0, 1)
        res[f"estimate.gen_rows_per_s.{size}"] = round(info["rows"] / (time.perf_counter() - t0))
        # Projected peak from the previous size (linear): skip a size that cannot fit.
        if last_ok is not None:
            if len(done_rows) >= 2:  # the line through the last two sizes
                (r1, r2), (p1, p2) = done_rows[-2:], done_peak[-2:]
                projected = (p2 + (p2 - p1) * (size - r2) / (r2 - r1)) / 1024
            else:  # through the origin: an upper bound
                projected = last_ok["peak_rss_mb"] * size / last_ok["rows"] / 1024
            res[f"estimate.projected_peak_gb.{size}"] = round(projected, 1)
            if projected > memory_cap_gb:
                res[f"estimate.skipped.{size}"] = (f"projected peak {projected:.1f} GB > cap {memory_cap_gb} GB "
                                                   "(linear from the previous size)")
                continue
        r = commands(root, os.path.join(workdir, f"report-{size}"))
        failed = {k: v["error"] for k, v in r.items() if "error" in v}
        if failed:
            res[f"estimate.error.{size}"] = "; ".join(f"{k}: {v}" for k, v in failed.items())
            if not {"estimate", "calibrate"} <= set(r) - set(failed):
                continue
        rows = info["rows"]
        est, cal = r["estimate"], r["calibrate"]
        cpu = est["cpu"] + cal["cpu"]
        res[f"estimate.rows_per_s.{size}"] = round(rows / cpu)
        res[f"estimate.estimate_rows_per_s.{size}"] = round(rows / est["cpu"])
        res[f"estimate.calibrate_rows_per_s.{size}"] = round(rows / cal["cpu"])
        res[f"estimate.rows_per_s_wall.{size}"] = round(rows / (est["wall"] + cal["wall"]))
        res[f"estimate.estimate_cpu_s.{size}"] = round(est["cpu"], 2)
        one = r.get("estimate_jobs1", {})
        if "cpu" in one:   # --jobs: the default (all cores) against one process, wall rows/s
            res[f"estimate.jobs1_cpu_s.{size}"] = round(one["cpu"], 2)
            walls = jobs_pairs(root, r) if size == sizes[-1] else {"estimate_jobs1": [one["wall"]],
                                                                   "estimate": [est["wall"]]}
            one_wall, all_wall = (float(np.median(walls[name])) for name in ("estimate_jobs1", "estimate"))
            res["estimate.jobs1_wall_rows_per_s"] = round(rows / one_wall)
            res["estimate.wall_rows_per_s"] = round(rows / all_wall)
            res["estimate.jobs_speedup"] = round(one_wall / all_wall, 2)
            pairs = [a / b for a, b in zip(walls["estimate_jobs1"], walls["estimate"])]
            res["estimate.jobs_pairs"] = len(pairs)
            res["estimate.jobs_speedup_min"], res["estimate.jobs_speedup_max"] = round(min(pairs), 2), round(max(pairs), 2)
        res[f"estimate.calibrate_cpu_s.{size}"] = round(cal["cpu"], 2)
        if "report" in r and "error" not in r["report"]:
            res[f"estimate.report_cpu_s.{size}"] = round(r["report"]["cpu"], 2)
            res["estimate.report_cpu_s"] = res[f"estimate.report_cpu_s.{size}"]
        peak = max(est["peak_mb"], cal["peak_mb"])
        res[f"estimate.peak_mb.{size}"] = round(peak, 1)
        done_rows.append(rows)
        done_cpu.append(cpu)
        done_peak.append(peak)
        last_ok = {"rows": rows, "peak_rss_mb": peak}
        res["estimate.rows_per_s"] = res[f"estimate.rows_per_s.{size}"]
        res["estimate.estimate_rows_per_s"] = res[f"estimate.estimate_rows_per_s.{size}"]
        res["estimate.calibrate_rows_per_s"] = res[f"estimate.calibrate_rows_per_s.{size}"]
        res["estimate.peak_mb"] = round(peak, 1)
        res["estimate.largest_rows"] = rows
    slope = _slope(done_rows, done_cpu)
    if slope is not None:
        res["estimate.scaling_exponent"] = round(slope, 3)
    # core rule vs the per-row loop, on the largest store that ran end to end
    if last_ok is not None:
        largest = [s for s in sizes if f"estimate.peak_mb.{s}" in res][-1]
        root = os.path.join(workdir, f"store-{largest}")
        c = run_child("bench.estimate:core", timeout=3600, root=root, loop_rows=50_000 if quick else 300_000,
                      max_rows=200_000 if quick else 1_000_000)
        if "error" in c:
            res["estimate.core_error"] = c["error"]
        else:
            res["estimate.core_rows_per_s"] = round(c["rows"] / c["vec_cpu"])
            res["estimate.baseline_rows_per_s"] = round(c["loop_rows"] / c["loop_cpu"])
            res["estimate.core_ratio"] = round(res["estimate.core_rows_per_s"] / res["estimate.baseline_rows_per_s"], 1)
            res["estimate.ratio"] = round(res["estimate.rows_per_s"] / res["estimate.baseline_rows_per_s"], 2)
            res["estimate.core_matches_loop"] = c["same"]
    return res


def _estimate_once(tree: str, root: str, jobs: int) -> dict:
    """One ``dspark-obs estimate --jobs N`` process with the package of ``tree``; its figures and the load."""
    import sys

    cmd = [sys.executable, "-m", "dspark_obs.cli", "estimate", "--data", root, "--run", "bench", "--jobs", str(jobs)]
    load = os.getloadavg()[0]
    r = run_process(cmd, repeat=1, timeout=7200, cwd=tree, env={"PYTHONPATH": tree})
    if "error" in r:
        raise RuntimeError(f"{tree}: {r['error']}")
    return {"cpu": r["cpu"][0], "wall": r["wall"][0], "peak_mb": r["peak_rss_mb"],
            "load": round((load + os.getloadavg()[0]) / 2, 2)}


def warm_compiled(trees: list[str]) -> None:
    """One untimed ``estimate`` of each tree on a small store: the first run after an install compiles
    the estimator's loops (numba, 2-3 CPU s, cached beside the package), later runs load them, and a
    timed run should be a later one."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-warm-") as root:
        info = run_child("bench.estimate:generate_store", timeout=600, root=root, rows=3000)
        if "error" in info:
            raise RuntimeError(f"the warm-up store: {info['error']}")
        for tree in trees:
            _estimate_once(tree, root, 1)


def _ceiling_columns(root: str) -> dict:
    import pyarrow.compute as pc

    from dspark_obs.store import Store

    table = Store(root).read("ceiling", "bench")
    table = table.sort_by([("rid", "ascending"), ("prefix_len", "ascending"), ("dp_rank", "ascending"),
                           ("forward_ct", "ascending")])
    return {c: pc.fill_null(table.column(c), float("nan")).to_numpy() for c in ("lo", "mid", "hi")}


def _summary_values(root: str) -> np.ndarray:
    """The run's ``ceiling_summary`` numbers (its bootstrap intervals with them), workloads in order."""
    from dspark_obs.store import Store

    rows = sorted(Store(root).read("ceiling_summary", "bench").to_pylist(), key=lambda r: r["workload"])
    return np.array([[float(v) for k, v in sorted(r.items()) if isinstance(v, (int, float)) and v is not None]
                     for r in rows])


def _validation_values(root: str) -> np.ndarray:
    """The run's ``ceiling_validation`` numbers, groups in order (NaN where a row has none)."""
    from dspark_obs.store import Store

    rows = sorted(Store(root).read("ceiling_validation", "bench").to_pylist(),
                  key=lambda r: (r["group_kind"], r["group"]))
    keys = sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return np.array([[float(r[k]) if isinstance(r.get(k), (int, float)) else np.nan for k in keys] for r in rows])


def before_after(root: str, baseline: str, *, repeat: int = 3, jobs: tuple = (1, 2),
                 baseline_root: str | None = None) -> dict:
    """Both codes' ``estimate`` on ``root``, interleaved (the order flips each round); medians per code and jobs.

    ``baseline_root``: the baseline reads this store instead, one its own writer made (the same data in
    the layout it writes), so a change of layout is timed as users get it: writer and reader together."""
    import statistics

    trees = {"before": str(Path(baseline).resolve()), "after": str(ROOT)}
    roots = {"before": baseline_root or root, "after": root}
    runs: dict = {(name, j): [] for name in trees for j in jobs}
    columns = {}
    warm_compiled(list(trees.values()))
    for i in range(repeat):
        for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
            for j in jobs:
                runs[(name, j)].append(_estimate_once(trees[name], roots[name], j))
                print(f"  round {i + 1} {name} --jobs {j}: {runs[(name, j)][-1]}", flush=True)
            if i == repeat - 1 or i == repeat - 2:
                columns[name] = {**_ceiling_columns(roots[name]), "summary": _summary_values(roots[name]),
                                 "validation": _validation_values(roots[name])}
    rows = _store_rows(root)
    if _store_rows(roots["before"]) != rows:
        raise ValueError(f"the baseline's store {roots['before']} holds other data than {root}")
    out = {"rows": rows, "repeat": repeat, "stores": roots}
    for (name, j), rs in runs.items():
        cpu = statistics.median(r["cpu"] for r in rs)
        wall = statistics.median(r["wall"] for r in rs)
        out[f"{name}.jobs{j}"] = {"cpu_s": round(cpu, 2), "rows_per_cpu_s": round(rows / cpu),
                                  "wall_s": round(wall, 2), "wall_rows_per_s": round(rows / wall),
                                  "peak_mb": round(max(r["peak_mb"] for r in rs)), "load": [r["load"] for r in rs]}
    for j in jobs:
        out[f"speedup.jobs{j}.cpu"] = round(out[f"before.jobs{j}"]["cpu_s"] / out[f"after.jobs{j}"]["cpu_s"], 2)
        out[f"speedup.jobs{j}.wall"] = round(out[f"before.jobs{j}"]["wall_s"] / out[f"after.jobs{j}"]["wall_s"], 2)
    if len(jobs) > 1:
        out["after.jobs_wall_gain"] = round(out[f"after.jobs{jobs[0]}"]["wall_s"] / out[f"after.jobs{jobs[-1]}"]["wall_s"], 2)
    out["max_abs_diff"] = {c: float(np.nanmax(np.abs(columns["before"][c] - columns["after"][c]), initial=0.0))
                           for c in ("lo", "mid", "hi")}
    for table in ("summary", "validation"):
        a, b = columns["before"][table], columns["after"][table]
        same_nan = a.shape == b.shape and bool((np.isnan(a) == np.isnan(b)).all())
        a, b = np.nan_to_num(a), np.nan_to_num(b)
        out[f"{table}_max_rel_diff"] = (float(np.max(np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)),
                                                                                1e-300), initial=0.0))
                                        if same_nan else float("inf"))
    return out


def _store_rows(root: str) -> int:
    import pyarrow.dataset as ds

    return ds.dataset(os.path.join(root, "step_reqs"), format="parquet").count_rows()


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from bench.common import machine

    ap = argparse.ArgumentParser(description="dspark-obs estimate, this tree against a baseline tree, as processes")
    ap.add_argument("--baseline", required=True, help="a source tree of the code to compare with (e.g. main's)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="request-step rows of the generated store")
    ap.add_argument("--store", help="use (or generate once into) this store; default: a temporary one")
    ap.add_argument("--baseline-store", help="the store the baseline reads, written by its own tree "
                    "(`cd TREE && python -m bench.gen_store S --rows N`); default: --store")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", default="1,2", help="the --jobs values to time, comma-separated")
    args = ap.parse_args(argv)
    import tempfile

    root = args.store or os.path.join(tempfile.mkdtemp(prefix="bench-estimate-"), f"store-{args.rows}")
    if not os.path.isdir(os.path.join(root, "step_reqs")):
        info = run_child("bench.estimate:generate_store", timeout=3600, root=root, rows=args.rows)
        if "error" in info:
            raise SystemExit(f"generating the store: {info['error']}")
    print(f"machine: {machine()}", flush=True)
    res = before_after(root, args.baseline, repeat=args.repeat, jobs=tuple(int(j) for j in args.jobs.split(",")),
                       baseline_root=args.baseline_store)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
