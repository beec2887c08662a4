"""Estimator truth: the ceiling and the calibration labels against what the server knew.

For each case — greedy, temperature 0.7, and temperature 0.7 with a separately
miscalibrated head — a compact run and its cap-accept companion (the compact
run's requests replayed, as ``dspark-obs companion`` does) are collected from
the emulator (or the real-model emulator with ``--model``).  The compact run's
recorded temperatures are then dropped, as a ``/generate`` import has none, and
``estimate`` must find the sampling itself.  Printed per case (markdown):

* sampling found: requests per (sampling, source);
* greedy: share of steps claimed exact (``lo == hi``), and of those the share
  equal to the server's full-block acceptance (``emu_block_accept``);
* sampled: on censored steps, coverage of ``emu_expected_given_window`` by
  ``[lo, hi]``, mean ``|mid - it|`` and mean width;
* calibration: max over positions of ``|ECE reconstructed - ECE companion|``
  and the same for observed labels (the survivorship bias);
* recalibration: held-out mean ECE of each map (companion labels).

    python -m bench.estimator_truth --out /tmp/truth
    python -m bench.estimator_truth --out /tmp/truth-model --model smollm2-135m   # needs the [model] extra
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.sglang.companion_run import CompanionOptions, run_companion  # noqa: E402
from collectors.sglang.driver import DriveSpec  # noqa: E402
from collectors.sglang.session import CollectOptions, collect  # noqa: E402
from dspark_obs import sql  # noqa: E402
from dspark_obs.emulator.server import SubprocessServer  # noqa: E402
from dspark_obs.estimators import calibration  # noqa: E402
from dspark_obs.estimators.calibration import recalibration
from dspark_obs.estimators.ceiling import estimate_run  # noqa: E402
from dspark_obs.store import Store  # noqa: E402

WORKLOADS = ["gsm8k", "arena-hard", "poetry"]


def _cases(model: str | None) -> list[tuple[str, float, dict]]:
    head = {"head_transform": "0.5,1.0"} if model else {"head_bias": "-1.0"}
    return [("greedy", 0.0, {}), ("sampled", 0.7, {}), ("sampled, separate head", 0.7, head)]


def _drop_temperatures(store: Store, run: str) -> None:
    req = store.read("requests", run).drop_columns(["run_id"])
    req = req.set_column(req.schema.get_field_index("temperature"), "temperature", pa.nulls(req.num_rows, pa.float32()))
    store.drop_run("requests", run)
    store.write("requests", run, req)


def _collect_pair(store: Store, tag: str, temperature: float, head: dict, args) -> tuple[str, str]:
    compact, cap = f"{tag}-compact", f"{tag}-cap"
    opts = {"model": args.model} if args.model else {}
    planned = None
    if args.model:
        from dspark_obs.demo import _model_requests

        planned = [dataclasses.replace(p, temperature=temperature)
                   for p in _model_requests(args.requests, max_new_tokens=args.max_new_tokens, seed=args.seed)]
    spec = DriveSpec(WORKLOADS, args.requests, concurrency=args.concurrency, temperature=temperature,
                     max_new_tokens=args.max_new_tokens, seed=args.seed)
    timeout = 900.0 if args.model else 60.0
    for mode, run in (("compact", compact), ("cap-accept", cap)):
        with SubprocessServer(mode=mode, seed=args.seed, lockstep_concurrency=args.concurrency, lockstep_wait_s=1.0,
                              startup_timeout=timeout, **opts, **head) as server:
            if mode == "compact":
                collect(store, CollectOptions(url=server.url, run_id=run, poll_interval=0.25, flush_interval=2.0,
                                              drive=spec, planned=planned))
            else:
                run_companion(store, CompanionOptions(of=compact, url=server.url, run_id=run, poll_interval=0.25,
                                                      flush_interval=2.0))
    return compact, cap


def _figures(store: Store, run: str, temperature: float) -> dict:
    result = estimate_run(store, run, n_bootstrap=0)
    con = sql.connect(store.root)
    c = con.sql("""SELECT c.lo, c.mid, c.hi, c.censored, c.sampling, s.emu_block_accept AS block,
                          s.emu_expected_given_window AS expected
                   FROM ceiling c JOIN step_reqs s USING (run_id, rid, dp_rank, forward_ct)
                   WHERE c.run_id = $run""", params={"run": run}).fetchnumpy()
    out = {"steps": int(c["lo"].size), "sampling": result.sampling_counts}
    lo, mid, hi = (np.asarray(c[k], dtype=np.float64) for k in ("lo", "mid", "hi"))
    if temperature == 0:
        exact = lo == hi
        out["exact_share"] = float(exact.mean())
        out["exact_right"] = float((mid[exact] == np.asarray(c["block"], dtype=np.float64)[exact]).mean())
    else:
        cen = np.asarray(c["censored"], dtype=bool)
        e = np.asarray(c["expected"], dtype=np.float64)
        out["censored"] = int(cen.sum())
        out["coverage"] = float(((lo <= e + 1e-6) & (e <= hi + 1e-6))[cen].mean())
        out["mae"] = float(np.abs(mid - e)[cen].mean())
        out["width"] = float((hi - lo)[cen].mean())
    ece = {}
    for labels in ("observed", "reconstructed", "companion"):
        cal = calibration.calibrate_run(store, run, labels=labels, n_bootstrap=0)
        rows = [r for r in cal.summary.to_pylist() if r["workload"] == "*" and r["binning"] == "width15"]
        ece[labels] = np.array([r["ece"] for r in sorted(rows, key=lambda r: r["position"])], dtype=np.float64)
    out["ece_companion"] = ece["companion"]
    out["recon_gap"] = float(np.nanmax(np.abs(ece["reconstructed"] - ece["companion"])))
    out["observed_gap"] = float(np.nanmax(np.abs(ece["observed"] - ece["companion"])))
    recal = recalibration.recalibrate_run(store, run, labels="companion", n_bootstrap=0)
    out["recal"] = {m: recal.mean_ece(m) for m in recalibration.METHODS}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="a new or empty directory for the store")
    ap.add_argument("--model", default=None, help="smollm2-135m: the real-model emulator (needs the [model] extra)")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", default="greedy,sampled,separate-head",
                    help="comma-separated subset of greedy, sampled, separate-head")
    args = ap.parse_args(argv)
    args.requests = args.requests or (24 if args.model else 90)
    args.concurrency = args.concurrency or (8 if args.model else 24)
    args.max_new_tokens = args.max_new_tokens or (48 if args.model else 320)
    store = Store(args.out)
    what = args.model or "stochastic emulator"
    print(f"estimator truth on the {what}: {args.requests} requests per run, concurrency {args.concurrency}, "
          f"<= {args.max_new_tokens} new tokens, seed {args.seed}; recorded temperatures dropped\n")
    print("| case | steps | sampling found | greedy: exact claimed / right | sampled: coverage / MAE / width "
          "| max abs ECE gap to companion: reconstructed / observed | held-out mean ECE none / sts / platt / "
          "isotonic / beta |")
    print("|---|---|---|---|---|---|---|")
    wanted = {c.strip() for c in args.cases.split(",")}
    for name, temperature, head in _cases(args.model):
        if name.replace("sampled, separate head", "separate-head") not in wanted:
            continue
        t0 = time.monotonic()
        tag = name.replace(", ", "-").replace(" ", "-")
        compact, _ = _collect_pair(store, tag, temperature, head, args)
        _drop_temperatures(store, compact)
        f = _figures(store, compact, temperature)
        found = ", ".join(f"{n} {k} ({s})" for (k, s), n in f["sampling"].items())
        greedy = f"{f['exact_share']:.1%} / {f['exact_right']:.1%}" if temperature == 0 else "-"
        sampled = (f"{f['coverage']:.1%} / {f['mae']:.3f} / {f['width']:.2f} ({f['censored']} censored)"
                   if temperature else "-")
        recal = " / ".join(f"{f['recal'][m]:.4f}" for m in recalibration.METHODS)
        print(f"| {name}{' (' + ', '.join(f'{k} {v}' for k, v in head.items()) + ')' if head else ''} | {f['steps']} "
              f"| {found} | {greedy} | {sampled} | {f['recon_gap']:.4f} / {f['observed_gap']:.4f} | {recal} |",
              flush=True)
        print(f"<!-- {name}: {time.monotonic() - t0:.0f} s -->", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
