"""Measured loss of the collector under faults: per clear, per kill -9 (and after --resume), per outage.

Run: ``.venv/bin/python -m bench.collect_faults [--repeats 3]`` (about a minute; 127.0.0.1 only).
Prints one JSON object per scenario.  The emulator runs in this process with
``real_time=1.0`` (each step takes its modelled device time, ~20-40 ms, as on a
GPU) and ``track_produced`` (the truth: every forward_ct it produced); the
collector runs as ``dspark-obs collect`` in a child process, as in production.

* ``clear``: a driven run with ``--clear-at 8``; loss per clear = decode steps
  produced but not stored / clears (all of them inside ``clear`` gaps).
* ``kill9``: the collector is killed with SIGKILL at a random time after its
  first commit; loss at the kill = produced decode steps up to the kill that
  are not in the store; then ``--resume`` and the loss that remains.
* ``outage``: the server stops for ``--outage-s`` and comes back (a restart);
  requests lost, forward_cts lost (server_restart gaps cover the unread tail)
  and the outage rows' durations.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from dspark_obs.emulator.engine import EngineConfig
from dspark_obs.emulator.server import BackgroundServer
from dspark_obs.store import Store


def _cmd(url: str, out: Path, run: str, *extra: str, requests: int = 48) -> list[str]:
    return [sys.executable, "-m", "dspark_obs.cli", "collect", "--url", url, "--out", str(out), "--run-id", run,
            "--workload", "gsm8k,poetry", "--requests", str(requests), "--concurrency", "8",
            "--max-new-tokens", "96", "--poll-interval", "0.25", "--flush-interval", "1", *extra]


def _produced(srv) -> set[tuple[int, int]]:
    return {(r.index, f) for r in srv.emulator.engine.ranks for f, _ in r.dumper.produced}


def _stored(store: Store, run: str) -> set[tuple[int, int]]:
    t = store.read("steps", run)
    return set(zip(t.column("dp_rank").to_pylist(), t.column("forward_ct").to_pylist()))


def clear(seed: int, work: Path) -> dict:
    with BackgroundServer(EngineConfig(mode="compact", seed=seed, track_produced=True, real_time=1.0)) as srv:
        done = subprocess.run(_cmd(srv.url, work, "c", "--clear-at", "8"), check=True, capture_output=True,
                              text=True, timeout=600)
        store = Store(work)
        lost = len(_produced(srv) - _stored(store, "c"))
        gaps = store.read("gaps", "c").to_pylist()
        found = re.search(r"(\d+) clears", " ".join(done.stdout.split()) + " " + " ".join(done.stderr.split()))
        clears = int(found.group(1)) if found else 0
        return {"scenario": "clear", "seed": seed, "clears": clears, "lost_steps": lost,
                "clear_gap_rows": sum(g["reason"] == "clear" for g in gaps),
                "lost_per_clear": round(lost / clears, 3) if clears else None,
                "gap_reasons": sorted({g["reason"] for g in gaps})}


def kill9(seed: int, work: Path) -> dict:
    rnd = random.Random(seed)
    with BackgroundServer(EngineConfig(mode="compact", seed=seed, track_produced=True, real_time=1.0)) as srv:
        proc = subprocess.Popen(_cmd(srv.url, work, "k", "--clear-at", "0"), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        while not list((work / "steps").glob("run_id=k/part-*.parquet")):
            time.sleep(0.02)
        time.sleep(rnd.uniform(0.2, 2.0))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        at_kill = _produced(srv)
        store = Store(work)
        lost_at_kill = len(at_kill - _stored(store, "k"))
        subprocess.run(_cmd(srv.url, work, "k", "--clear-at", "0", "--resume"), check=True, capture_output=True,
                       timeout=600)
        after = _stored(store, "k")
        steps = store.read("steps", "k")
        return {"scenario": "kill9", "seed": seed, "lost_at_kill": lost_at_kill,
                "lost_after_resume": len(at_kill - after),
                "stored_twice": steps.num_rows - len(after)}


def outage(seed: int, work: Path, outage_s: float) -> dict:
    srv = BackgroundServer(EngineConfig(mode="compact", seed=seed, track_produced=True, real_time=1.0)).start()
    proc = subprocess.Popen(_cmd(srv.url, work, "o", "--clear-at", "0", requests=64), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while not list((work / "requests").glob("run_id=o/part-*.parquet")):
        time.sleep(0.02)
    first = srv
    threading.Thread(target=first.stop).start()  # down ...
    time.sleep(outage_s)
    second = BackgroundServer(EngineConfig(mode="compact", seed=seed + 1, track_produced=True, real_time=1.0),
                              port=first.port).start()  # ... and back, restarted
    rc = proc.wait(timeout=600)
    second.stop()
    store = Store(work)
    gaps = store.read("gaps", "o").to_pylist()
    steps = store.read("steps", "o")
    seg0 = {(r, f) for s, r, f in zip(steps.column("segment").to_pylist(), steps.column("dp_rank").to_pylist(),
                                      steps.column("forward_ct").to_pylist()) if s == 0}
    return {"scenario": "outage", "seed": seed, "outage_s": outage_s, "exit_code": rc,
            "requests_stored": store.read("requests", "o").num_rows,
            "requests_failed": sum(g["reason"] == "request_failed" for g in gaps),
            "lost_steps_first_server": len(_produced(first) - seg0),
            "outage_rows_s": [round(g["duration_s"], 2) for g in gaps if g["reason"] in ("poll_error", "poll_stall")],
            "gap_reasons": sorted({g["reason"] for g in gaps})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--outage-s", type=float, default=2.0)
    args = ap.parse_args(argv)
    for seed in range(args.repeats):
        for name in ("clear", "kill9", "outage"):
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp)
                result = {"clear": lambda: clear(seed, work), "kill9": lambda: kill9(seed, work),
                          "outage": lambda: outage(seed, work, args.outage_s)}[name]()
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
