"""A records firehose: SGLang 0.5.23's ``/server_info`` at a chosen request-step rate, no engine behind it.

The emulator tops out far below 50k request-steps/s on two cores (its engine and
its ``/generate`` handling take the CPU), so a collector polling it is never
tested at the target rate.  This server produces the same records at any rate:

* a pool of realistic step records is built once from the emulator's engine
  (compact mode, full batches, gamma 6, confidences and survivals), then each
  tick stamps ``forward_ct`` and the slot's ``rid`` on a copy of the next pool
  record for every DP rank and hands it to that rank's ``InfoDumper`` — the
  emulator's own, so the pending step, the bounded deque, ``clear()`` and the
  ``omit_defaults`` encoding are exactly the emulator's;
* ``GET /server_info`` (one payload per rank in ``internal_states``),
  ``POST /set_internal_state`` (``dspark_clear_info_records``), ``GET /health``
  and ``GET /metrics`` (``sglang:spec_verify_calls_total``: request-steps) are
  served by the same process, so encoding the records competes with the step
  loop for the interpreter, as SGLang's dump competes with its scheduler;
* the step loop runs on a fixed schedule (one tick every
  ``ranks * batch / rate`` seconds).  A tick that ends after the next one was
  due moves the schedule back: that *slip* is time the step loop lost, as a
  real scheduler whose CPU work is held up loses it.  Lateness (wake-up after
  the tick was due) is kept too: it is what a step loop with no slack between
  its device steps would lose.  ``GET /firehose/stats`` gives the counters.

    python -m bench.firehose --port 30100 --rate 50000 --ranks 4 --batch 256
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402
import numpy as np  # noqa: E402

from dspark_obs.emulator.dumper import _DEFAULTS, InfoDumper  # noqa: E402
from dspark_obs.emulator.server import SubprocessServer  # noqa: E402

GAMMA = 6
# Lateness histogram bounds, ms (cumulative counts, so windows are differences).
LATE_BOUNDS_MS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
_W = ("gsm8k", "arena-hard", "poetry")


def build_pool(*, records: int, batch: int, seed: int = 0) -> list[dict]:
    """``records`` full-batch decode steps from the emulator's engine, as dumper input.

    Each is a step dict (every field, defaults filled back in, no ``forward_ct``
    and no ``step_cpu_ms``: the dumper stamps its own clock gap).
    """
    from bench.common import full_batch_payload

    full = full_batch_payload(records=records, batch=batch, gamma=GAMMA, max_records=4 * records + 64, seed=seed,
                              tag="firehose")["records"]
    pool = []
    for rec in full:
        step = {**_DEFAULTS, **rec}
        step.pop("forward_ct")
        step.pop("step_cpu_ms", None)
        step["reqs"] = [{k: v for k, v in q.items() if k != "rid"} for q in rec["reqs"]]
        pool.append(step)
    return pool


class Firehose:
    """DP ranks of ``InfoDumper`` fed from a pool on a fixed schedule, with the loop's own accounting."""

    def __init__(self, pool: list[dict], *, ranks: int, rate: float, max_records: int,
                 seed: int = 0) -> None:
        if rate <= 0 or ranks < 1 or not pool:
            raise ValueError(f"need rate > 0, ranks >= 1 and a pool; got {rate}, {ranks}, {len(pool)} records")
        self.pool = pool
        self.batch = len(pool[0]["reqs"])
        self.ranks = ranks
        self.rate = rate
        self.period_s = ranks * self.batch / rate
        self.max_records = max_records
        self.lock = threading.Lock()
        self.dumpers = [InfoDumper(gamma=GAMMA, mode="compact", max_records=max_records, clock=time.monotonic)
                        for _ in range(ranks)]
        self.forward_ct = [0] * ranks
        # Each slot's request runs for a pool-like number of steps, then a new rid takes the slot.
        rng = np.random.default_rng(seed)
        self._life = rng.integers(20, 120, size=(ranks, self.batch))
        self._age = rng.integers(0, 120, size=(ranks, self.batch)) % self._life
        self._gen = np.zeros((ranks, self.batch), dtype=np.int64)
        self._rids = [[self._rid(r, j) for j in range(self.batch)] for r in range(ranks)]
        self.ticks = 0
        self.request_steps = 0
        self.slip_s = 0.0
        self.late_sum_s = 0.0
        self.late_max_s = 0.0  # since the last stats() read
        self.late_hist = [0] * (len(LATE_BOUNDS_MS) + 1)
        self.tick_cpu_s = 0.0  # the step loop's own thread CPU
        self.clears = 0
        self.started: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _rid(self, rank: int, slot: int) -> str:
        return f"{_W[(slot + rank) % 3]}-fh{rank}-{slot:04d}-{int(self._gen[rank, slot]):06d}"

    def tick(self) -> None:
        """One decode step on every rank: stamp forward_ct and rids on the next pool record."""
        self._age += 1
        done = self._age >= self._life
        if done.any():
            self._age[done] = 0
            self._gen[done] += 1
            for r, j in zip(*np.nonzero(done)):
                self._rids[r][j] = self._rid(int(r), int(j))
        with self.lock:
            for r, dumper in enumerate(self.dumpers):
                self.forward_ct[r] += 1
                fct = self.forward_ct[r]
                template = self.pool[(fct + 7 * r) % len(self.pool)]
                rids = self._rids[r]
                reqs = [{**q, "rid": rids[j]} for j, q in enumerate(template["reqs"])]
                dumper.observe_decode_step({**template, "forward_ct": fct, "reqs": reqs})
        self.ticks += 1
        self.request_steps += self.ranks * self.batch

    def _loop(self) -> None:
        period = self.period_s
        due = time.monotonic()
        self.started = due
        bounds = [b / 1000.0 for b in LATE_BOUNDS_MS]
        while not self._stop.is_set():
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
                now = time.monotonic()
            late = now - due
            self.late_sum_s += late
            self.late_max_s = max(self.late_max_s, late)
            k = 0
            while k < len(bounds) and late > bounds[k]:
                k += 1
            self.late_hist[k] += 1
            c0 = time.thread_time()
            self.tick()
            self.tick_cpu_s += time.thread_time() - c0
            due += period
            end = time.monotonic()
            if end > due:  # the tick overran the next one's start: the schedule slips
                self.slip_s += end - due
                due = end

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="firehose-step-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def dump(self) -> list[Optional[dict]]:
        with self.lock:
            return [d.dump() for d in self.dumpers]

    def clear(self) -> None:
        with self.lock:
            for d in self.dumpers:
                d.clear()
            self.clears += 1

    def stats(self) -> dict[str, Any]:
        late_max, self.late_max_s = self.late_max_s, 0.0
        return {"t": time.monotonic(), "process_cpu_s": time.process_time(), "ticks": self.ticks,
                "request_steps": self.request_steps, "slip_s": self.slip_s, "late_sum_s": self.late_sum_s,
                "late_max_s": late_max, "late_hist": list(self.late_hist), "tick_cpu_s": self.tick_cpu_s,
                "clears": self.clears, "forward_ct": list(self.forward_ct),
                "produced": [d.records_produced for d in self.dumpers], "period_s": self.period_s}


def make_app(hose: Firehose, *, port: int):
    """The Starlette app: SGLang's endpoints the collector reads, over ``hose``."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    from dspark_obs.emulator.engine import EngineConfig
    from dspark_obs.emulator.server import SGLANG_VERSION, _server_args

    args = {**_server_args(EngineConfig(gamma=GAMMA, dp_size=hose.ranks, max_running_requests=hose.batch,
                                        max_records=hose.max_records), port), "firehose_rate": hose.rate}
    startup_time = time.time()
    env = {"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_DEBUG_DUMP": "all"}
    launch = " ".join(sys.argv)

    async def server_info(request) -> Response:
        internal = [{"last_gen_throughput": 0.0, "avg_spec_accept_length": 3.2, "dspark_info_record": p}
                    for p in hose.dump()]
        body = {**args, "internal_states": internal, "version": SGLANG_VERSION, "launch_command": launch,
                "startup_time": startup_time, "env": env}
        return Response(msgspec.json.encode(body), media_type="application/json")

    async def set_internal_state(request) -> Response:
        try:
            sargs = msgspec.json.decode(await request.body()).get("server_args", {})
        except (msgspec.DecodeError, AttributeError):
            return JSONResponse({"updated": False}, status_code=400)
        if any(k != "dspark_clear_info_records" for k in sargs):
            return JSONResponse({"updated": False})
        if sargs.get("dspark_clear_info_records"):
            hose.clear()
        return JSONResponse({"updated": True})

    async def metrics(request) -> Response:
        return PlainTextResponse(
            "# TYPE sglang:spec_verify_calls_total counter\n"
            f'sglang:spec_verify_calls_total{{model_name="firehose",engine_type="unified"}} {hose.request_steps}\n',
            media_type="text/plain; version=0.0.4")

    async def health(request) -> Response:
        return Response(status_code=200)

    async def stats(request) -> Response:
        return JSONResponse(hose.stats())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        hose.start()
        try:
            yield
        finally:
            hose.stop()

    return Starlette(routes=[
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/set_internal_state", set_internal_state, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/firehose/stats", stats, methods=["GET"]),
    ], lifespan=lifespan)


class FirehoseProcess(SubprocessServer):
    """``python -m bench.firehose`` as a child process (its own interpreter, as a server runs)."""

    name = "firehose"
    module = ("bench.firehose",)
    cwd = str(ROOT)
    stop_timeout = 30.0

    def __init__(self, *, rate: float, ranks: int, batch: int, max_records: int, pool: int,
                 host: str = "127.0.0.1", startup_timeout: float = 120.0) -> None:
        super().__init__(host=host, startup_timeout=startup_timeout, rate=rate, ranks=ranks, batch=batch,
                         max_records=max_records, pool=pool)

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc else -1


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30100)
    ap.add_argument("--rate", type=float, default=50_000.0, help="request-steps per second, all ranks")
    ap.add_argument("--ranks", type=int, default=4, help="DP ranks (one payload each)")
    ap.add_argument("--batch", type=int, default=256, help="requests per step per rank")
    ap.add_argument("--max-records", type=int, default=64, help="each rank's record deque")
    ap.add_argument("--pool", type=int, default=64, help="distinct emulator records to cycle through")
    a = ap.parse_args(argv)
    import uvicorn

    hose = Firehose(build_pool(records=a.pool, batch=a.batch), ranks=a.ranks, rate=a.rate,
                    max_records=a.max_records)
    app = make_app(hose, port=a.port)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
