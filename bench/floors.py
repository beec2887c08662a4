"""Floors: what the speed targets cost in the libraries alone, before a command computes anything.

Each figure is work a command cannot leave out, given the store's format (Parquet, read and written
with pyarrow) and the tables it must read and write, timed alone on this machine in a fresh child
process (CPU seconds of that process: user + system, all threads; imports not counted unless said):

* **estimate** at N request-steps: reading its inputs once (the columns of ``step_reqs`` and ``tokens``
  it reads, every row group once, with pyarrow, the cheaper of the two readers: DuckDB's per-chunk
  queries took 10 s under cProfile where this takes 8 at 10M), plus writing its ``ceiling`` once (the run's own rows,
  as the store writes them, to memory; and uncompressed, the cheapest encoding). Their sum against the
  target's CPU seconds (N / 1M). Beside it, the top-k read again as fixed-width binary, the cheapest
  layout measured, on one file.
* **calibrate --labels all**: reading its inputs once (as for ``estimate``), plus the operations of its
  bootstrap's matrix products, counted while the command's own code runs
  (``dspark_obs.estimators.calibration.cell_sums.bootstrap_products``, ``--jobs 1``), split by
  precision, over the rate this machine multiplies at in each with one BLAS thread (the best rate per
  CPU second; products of the largest shape seen, five or more, their mean). Beside it, the products as if
  all were float32, which moves the intervals (``bench/RESULTS.md``).
* **ingest --server-info** (the file of ``bench.ingest``): the command on a one-record file (its
  start-up: imports, the CLI, one tiny commit; median of three, as a process), plus msgspec's scan of
  every body into a struct with no fields (JSON validated, nothing built: the least any decoder does),
  plus pyarrow writing the tables the command wrote (read back from its store). Against the CPU
  seconds of 400k rows/s and of 10x the json+pandas baseline (its figure from the same run, when given).
* **ingest memory**: the peak RSS of a process that imports what the command must (pyarrow, its
  compute and Parquet modules, msgspec) and reads the largest body, against ``dspark-obs --version``'s
  peak plus 3x the body.

A floor above its target shows the target out of reach on this machine with these libraries,
whatever the command's own code does. ``python -m bench.floors --store STORE --body FILE [--json OUT]``
(``STORE``: a ``bench.gen_store`` store on which ``estimate`` ran; ``FILE``: ``bench.ingest``'s bodies).
"""

from __future__ import annotations

import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine, run_child, run_process

RUN = "bench"
STEP_COLUMNS = ["dp_rank", "forward_ct", "segment", "rid", "prefix_len", "verify_len", "correct_drafts", "cap_trim",
                "bonus_token", "draft_tokens", "confidence", "emu_block_accept", "emu_expected_given_window"]
"""The ``step_reqs`` columns ``estimate`` reads (:mod:`dspark_obs.estimators.ceiling.inputs`)."""
TOKEN_COLUMNS = ["rid", "pos", "token_id", "logprob", "top_ids", "top_logprobs"]
"""The ``tokens`` columns it reads."""
CALIBRATE_COLUMNS = {"step_reqs": ["rid", "req_pool_index", "dp_rank", "forward_ct", "prefix_len", "verify_len",
                                   "correct_drafts", "cap_trim", "confidence", "survival"],
                     "ceiling": ["rid", "forward_ct", "prefix_len", "mid", "survival_mid"]}
"""The columns ``calibrate --labels all`` reads (:mod:`dspark_obs.estimators.calibration.events`)."""


def _cpu(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def _files(store: str, table: str) -> list[str]:
    from dspark_obs.store import Store

    return Store(store).part_files(table, RUN)


def _read(store: str, table: str, columns: list[str]) -> int:
    """Every row group of ``table``'s files of the run read once with pyarrow (one thread); the rows."""
    import pyarrow.parquet as pq

    rows = 0
    for path in _files(store, table):
        pf = pq.ParquetFile(path)
        for g in range(pf.metadata.num_row_groups):
            rows += pf.read_row_group(g, columns=columns, use_threads=False).num_rows
    return rows


def _reads(store: str, tables: dict[str, list[str]]) -> dict:
    """CPU seconds and rows of :func:`_read` of each table's ``columns``."""
    out: dict = {}
    for table, columns in tables.items():
        counted = []
        out[f"read_{table}_cpu_s"] = round(_cpu(lambda: counted.append(_read(store, table, columns))), 3)
        out[f"{table}_rows"] = counted[0]
    return out


def estimate_io(store: str) -> dict:
    """CPU seconds of reading the estimate's inputs once and writing its ``ceiling`` once (child process)."""
    import pyarrow.parquet as pq

    from dspark_obs.clustering import write_options

    out = _reads(store, {"step_reqs": STEP_COLUMNS, "tokens": TOKEN_COLUMNS})
    ceiling = [pq.read_table(p) for p in _files(store, "ceiling")]
    out["ceiling_rows"] = sum(t.num_rows for t in ceiling)
    for label, extra in (("store", {}), ("uncompressed", {"compression": "none"})):
        out[f"write_ceiling_{label}_cpu_s"] = round(_cpu(
            lambda: [pq.write_table(t, io.BytesIO(), **{**write_options(t), **extra}) for t in ceiling]), 3)
    return out


def topk_layouts(store: str) -> dict:
    """The top-k of one ``tokens`` file read as stored (lists) and as fixed-width binary (child process)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = _files(store, "tokens")[0]
    table = pq.read_table(path, columns=["top_ids", "top_logprobs"])
    n = table.num_rows
    blob = {}
    for name in table.column_names:
        flat = pc.list_flatten(table.column(name).combine_chunks()).to_numpy()
        width = flat.size // n
        if width * n != flat.size:
            return {"error": f"{name}: lists of different lengths"}
        blob[name] = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width * flat.itemsize), n,
                                                          [None, pa.py_buffer(np.ascontiguousarray(flat))])
    tmp = tempfile.mkdtemp(prefix="bench-floors-")
    try:
        copy = f"{tmp}/blob.parquet"
        pq.write_table(pa.table(blob), copy, compression="zstd", use_dictionary=False)
        out = {"topk_file_rows": n}
        for label, p in (("lists", path), ("binary", copy)):
            f = pq.ParquetFile(p)
            runs = [_cpu(lambda: [f.read_row_group(g, columns=["top_ids", "top_logprobs"], use_threads=False)
                                  for g in range(f.metadata.num_row_groups)]) for _ in range(3)]
            out[f"topk_read_{label}_cpu_s"] = round(min(runs), 3)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bootstrap_operations(store: str, chunk_rows: int | None = None) -> dict:
    """What ``calibrate --labels all`` computes (``calibrate_kinds``, in this process, as ``--jobs 1``) with its
    bootstrap products counted, then the rate of this machine's products of the largest shape seen, in
    float32 and float64 (child process).  ``chunk_rows``: the command's default, or fewer (a small store)."""
    import numpy as np

    from dspark_obs import sql
    from dspark_obs.estimators import calibration
    from dspark_obs.estimators.calibration import cell_sums

    counted = {"float32": 0.0, "float64": 0.0}
    largest = [(0, 0, 0)]
    products = cell_sums.bootstrap_products

    def counting(weights, whole, rest):
        r, u = weights.shape
        wide = "float32" if cell_sums.exact_in_float32(weights, whole) else "float64"
        counted[wide] += 2.0 * r * u * whole.shape[1]
        counted["float64"] += 2.0 * r * u * rest.shape[1]
        largest[0] = max(largest[0], (r, u, max(whole.shape[1], rest.shape[1])), key=lambda s: s[0] * s[1] * s[2])
        return products(weights, whole, rest)

    cell_sums.bootstrap_products = counting
    try:
        wall = time.perf_counter()
        con = sql.connect(store)
        cpu = _cpu(lambda: calibration.calibrate_kinds(con, RUN, calibration.LABEL_KINDS, chunk_rows=chunk_rows))
        wall = time.perf_counter() - wall
    finally:
        cell_sums.bootstrap_products = products
    if not any(counted.values()):
        return {"error": "no bootstrap product ran: a run of one chunk is summed in one pass (give chunk_rows)"}
    reads = _reads(store, CALIBRATE_COLUMNS)
    r, u, c = largest[0]
    rng = np.random.default_rng(0)
    a, b = rng.random((r, u)), rng.random((u, c))
    rates = {}
    for dtype in ("float32", "float64"):
        x, y = a.astype(dtype), b.astype(dtype)
        x @ y
        runs = []
        while len(runs) < 5 or sum(runs) < 0.5:   # a small product: enough of them to time
            runs.append(_cpu(lambda: x @ y))
        rates[dtype] = 2.0 * r * u * c * len(runs) / sum(runs)
    return {"calibrate_cpu_s": round(cpu, 2), "calibrate_wall_s": round(wall, 2),
            "gflop_float32": round(counted["float32"] / 1e9, 1), "gflop_float64": round(counted["float64"] / 1e9, 1),
            "gflops_per_cpu_s_float32": round(rates["float32"] / 1e9, 1),
            "gflops_per_cpu_s_float64": round(rates["float64"] / 1e9, 1), "product_shape": [r, u, c],
            "products_cpu_s": round(counted["float32"] / rates["float32"] + counted["float64"] / rates["float64"], 2),
            "products_all_float32_cpu_s": round((counted["float32"] + counted["float64"]) / rates["float32"], 2),
            **reads}


def ingest_parts(body: str, store: str) -> dict:
    """msgspec's scan of every body (no struct field: nothing built) and pyarrow's writes of the tables
    ``ingest`` committed to ``store`` (child process)."""
    import msgspec
    import pyarrow.parquet as pq

    from dspark_obs.clustering import write_options
    from dspark_obs.store import Store

    class Nothing(msgspec.Struct):
        pass

    decoder = msgspec.json.Decoder(Nothing)
    bodies = [line for line in Path(body).read_bytes().splitlines() if line.strip()]
    out = {"bodies": len(bodies), "scan_cpu_s": round(min(_cpu(lambda: [decoder.decode(b) for b in bodies])
                                                          for _ in range(3)), 3)}
    tables = [pq.read_table(p) for t in ("steps", "step_reqs") for p in Store(store).part_files(t, RUN)]
    out["write_cpu_s"] = round(min(_cpu(lambda: [pq.write_table(t, io.BytesIO(), **write_options(t))
                                                 for t in tables]) for _ in range(3)), 3)
    out["rows"] = sum(t.num_rows for t in tables if "batch_index" in t.column_names)
    return out


def ingest_memory(body: str) -> dict:
    """Peak RSS of a process that imports what ``ingest`` must and holds the largest body (child process)."""
    import msgspec  # noqa: F401
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    size, at = _largest_line(body)
    with open(body, "rb") as f:
        f.seek(at)
        held = f.read(size)
    return {"largest_body_bytes": len(held)}


def _largest_line(path: str, block: int = 1 << 20) -> tuple[int, int]:
    """``(length, offset)`` of the longest line of ``path`` (newline excluded), read a MB at a time."""
    best, start, at = (0, 0), 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            end = chunk.find(b"\n")
            while end >= 0:
                best = max(best, (at + end - start, start))
                start = at + end + 1
                end = chunk.find(b"\n", end + 1)
            at += len(chunk)
    return max(best, (at - start, start))


def run(*, store: str, body: str, rows: int | None = None, baseline_cpu_s: float | None = None,
        chunk_rows: int | None = None) -> dict:
    """Every floor, each beside its target (``baseline_cpu_s``: the json+pandas ingest of ``body``, same run;
    ``chunk_rows``: calibrate's chunks, for a store too small to have more than one)."""
    res: dict = {f"floors.machine.{k}": v for k, v in machine().items()}
    est = _without_peak(run_child("bench.floors:estimate_io", timeout=3600, store=store))
    res.update({f"floors.estimate.{k}": v for k, v in est.items()})
    if "error" not in est:
        rows = rows or est["step_reqs_rows"]
        floor = est["read_step_reqs_cpu_s"] + est["read_tokens_cpu_s"] + est["write_ceiling_uncompressed_cpu_s"]
        res["floors.estimate.floor_cpu_s"] = round(floor, 2)
        res["floors.estimate.target_cpu_s"] = round(rows / 1e6, 2)
        res["floors.estimate.floor_rows_per_s"] = round(rows / floor)
    topk = _without_peak(run_child("bench.floors:topk_layouts", timeout=1800, store=store))
    res.update({f"floors.topk.{k}": v for k, v in topk.items()})
    # one BLAS thread: the products' best rate per CPU second (two threads spend 6-10% more CPU on each)
    cal = _without_peak(run_child("bench.floors:bootstrap_operations", timeout=3600, store=store,
                                  chunk_rows=chunk_rows, env={"OPENBLAS_NUM_THREADS": "1"}))
    res.update({f"floors.calibrate.{k}": v for k, v in cal.items()})
    if "error" not in cal and rows:
        reads = sum(v for k, v in cal.items() if k.startswith("read_"))
        res["floors.calibrate.floor_cpu_s"] = round(reads + cal["products_cpu_s"], 2)
        res["floors.calibrate.target_cpu_s"] = round(rows / 1e6, 2)
    res.update(_ingest_floors(body, baseline_cpu_s))
    return res


def _ingest_floors(body: str, baseline_cpu_s: float | None) -> dict:
    """The ingest command's start-up, its scan and writes, and its memory floor (see the module docstring)."""
    from bench.ingest import cli_command

    res: dict = {}
    tmp = tempfile.mkdtemp(prefix="bench-floors-ingest-")
    try:
        one = f"{tmp}/one.jsonl"
        Path(one).write_bytes(_one_record(body))
        starts = [run_process(cli_command() + ["ingest", "--out", f"{tmp}/one-{i}", "--run-id", RUN, "--server-info",
                                               one], repeat=1) for i in range(3)]
        start = next((r for r in starts if "error" in r), {"cpu": [r["cpu"][0] for r in starts]})
        version = run_process(cli_command() + ["--version"], repeat=3)
        full = run_process(cli_command() + ["ingest", "--out", f"{tmp}/all", "--run-id", RUN, "--server-info", body],
                           repeat=1)
        parts = _without_peak(run_child("bench.floors:ingest_parts", timeout=1800, body=body, store=f"{tmp}/all"))
        memory = run_child("bench.floors:ingest_memory", timeout=600, body=body)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name, r in (("startup", start), ("version", version), ("command", full), ("parts", parts)):
        if "error" in r:
            res[f"floors.ingest.{name}.error"] = r["error"]
    res.update({f"floors.ingest.{k}": v for k, v in parts.items() if k != "error"})
    if not any("error" in r for r in (start, version, full, parts)):
        startup = statistics.median(start["cpu"])
        floor = startup + parts["scan_cpu_s"] + parts["write_cpu_s"]
        res.update({"floors.ingest.startup_cpu_s": round(startup, 3), "floors.ingest.floor_cpu_s": round(floor, 3),
                    "floors.ingest.command_cpu_s": round(full["cpu"][0], 3),
                    "floors.ingest.target_cpu_s": round(parts["rows"] / 400_000, 3),
                    "floors.ingest.floor_rows_per_s": round(parts["rows"] / floor)})
        if baseline_cpu_s:
            res["floors.ingest.tenth_of_baseline_cpu_s"] = round(baseline_cpu_s / 10, 3)
    if "error" in memory or "error" in version:
        res["floors.ingest_memory.error"] = memory.get("error") or version.get("error")
        return res
    idle, body_mb = version["peak_rss_mb"], memory["largest_body_bytes"] / 2**20
    res.update({"floors.ingest_memory.peak_mb": memory["peak_rss_mb"], "floors.ingest_memory.version_peak_mb":
                round(idle, 1), "floors.ingest_memory.body_mb": round(body_mb, 1),
                "floors.ingest_memory.allowed_peak_mb": round(idle + 3 * body_mb, 1),
                "floors.ingest_memory.above_version_per_body": round((memory["peak_rss_mb"] - idle) / body_mb, 2)})
    return res


def _without_peak(result: dict) -> dict:
    """A child's figures without its peak RSS (a floor's child holds what it times: its peak is no figure)."""
    return {k: v for k, v in result.items() if k != "peak_rss_mb"}


def _one_record(body: str) -> bytes:
    """The first body of ``body`` cut to its first record (what a one-record ingest reads)."""
    with open(body, "rb") as f:
        doc = json.loads(f.readline())
    for state in doc.get("internal_states", []):
        record = state.get("dspark_info_record")
        if record:
            record["records"] = record["records"][:1]
    return json.dumps(doc).encode() + b"\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="a bench.gen_store store on which dspark-obs estimate ran")
    ap.add_argument("--body", required=True, help="bench.ingest's file of /server_info bodies")
    ap.add_argument("--baseline-cpu-s", type=float, help="the json+pandas ingest of --body, CPU s (same run)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    res = run(store=args.store, body=args.body, baseline_cpu_s=args.baseline_cpu_s)
    print(json.dumps(res, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
