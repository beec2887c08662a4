"""Live collection: the collector against the emulator at full speed, and what it costs the server.

Three processes besides this one: the emulator (``python -m dspark_obs.cli
emulate``, as a server runs: its own interpreter and core), a closed-loop load
generator (``python -m bench.collect loadgen``: keep-alive HTTP/1.1 on raw
asyncio streams, one connection per request in flight, so the batch stays full
at ``--max-running-requests``) and the collector (``Collector`` from
``collectors.sglang.session`` with the store, in its own process).

The emulator's step-loop rate is read from its own counter
(``sglang:spec_verify_calls_total`` on ``/metrics``: request-steps) over
fixed windows: windows without the collector before it starts and after it
stops, windows with it polling in between; the slowdown is
``1 - median(with) / median(without)``.  Beside it, ``collect.observation_share``
is the live figure the collector stores per run (its polls' round trips over
its wall time: what ``doctor`` and the sidecar report without a baseline).  The collector never clears (``clear_at
0``: every clear loses the server's pending step); the emulator's record deque
(``--max-records 48``) holds three poll intervals at the measured step rate, so
nothing wraps between polls, every record is read, and the server encodes each
record about three times (``/server_info`` always sends the whole deque).  Gaps, dead letters, rows and the collector's RSS over
time (bounded memory) come from the collector's own process.

The emulator cannot produce 50k request-steps/s on two cores, so a second
measurement (``collect.firehose.*``) runs the collector against
``bench.firehose``: SGLang's ``/server_info`` over the emulator's own
``InfoDumper``, fed pre-built emulator records at 50k request-steps/s (4 DP
ranks x bs 256 x ~49 steps/s, gamma 6, confidences and survivals) by a step
loop on a fixed schedule in the process that serves ``/server_info``.  It runs
alone, then collected for a sustained period, then alone again.
``step_loop_slowdown`` is ``1 - median rate with / median rate without``: a
tick that ends after the next one was due moves the schedule back, so time the
loop loses to ``/server_info`` (the encoding holds the interpreter) lowers its
rate.  ``late_share_*`` is the share of time the ticks started late: what a
step loop with no slack between device steps would lose.  The collector must
store every produced record: its store is checked per rank for contiguous
``forward_ct``s, each a full batch (``rows_stored_match``).

The collector's settings, and why.  SGLang's ``/server_info`` re-sends the
whole record deque every poll (2.1 us of encoding per request entry here), so
the server's cost is ``deque size / poll cycle`` records per second, whatever
the poll interval:

* never clearing (``clear_at 0``) loses nothing as long as the deque holds a
  poll cycle, but every record is encoded (and decoded by the collector) about
  ``deque / (steps per cycle)`` times, and a deque whose encoding takes longer
  than the slack between two steps (~19 ms of a 20.5 ms tick: ~8 records per
  rank at bs 256 x 4 ranks) stalls the step loop once per poll;
* clearing encodes each record about once, but SGLang's ``clear()`` drops the
  pending step, and the collector clears only after decoding the poll, so at
  49 steps/s every clear also loses the steps produced meanwhile (a ``clear``
  gap; tried with SGLang's own 200,000-record deque and ``clear_at 8``: 3,732
  of ~8,600 forward_cts lost in 16 s, as the first poll read the whole backlog).

The default (each rank's deque holds ``FIREHOSE_DEQUE_S`` = 0.65 s of its
steps: 32 records at 50k; poll interval 0.05 s; never clear) is what a user who
must not lose records would run: the deque holds the collector's poll cycle
with margin as long as the collector keeps up (it polled every ~0.55 s at 50k
on a machine at load 2, every ~1.1 s at load 5).  A real SGLang 0.5.23 deque is
fixed at 200,000 records, so this setting needs a server whose deque size can
be set (the emulator's ``--max-records``); on SGLang itself at this rate a
collector must clear, with the losses above.  The full run also measures the
other end (``collect.firehose.lean.*``: 8 records, 0.01 s polls), and the
default at 12.5k and 25k request-steps/s (``collect.firehose.at_RATE.*``:
there it stored every record with no gap, at a 0.6 % / 1.3 % slowdown, load 2-3).
At 50k neither setting meets the targets on this machine: the collector
handles ~55-70k request entries per CPU second (whole-body decode ~4 us, Arrow
tables ~2 us, the sidecar's Prometheus aggregation ~4 us in the event loop,
Parquet ~2-4 us per row, under one interpreter lock) and got 0.4-0.65 of a
core on the shared machine, so it cannot re-read a deque with margin, the deque
wraps (``deque_wrap`` gaps, each counted), and the server's encoding of 32k
entries per poll (~70 ms of CPU, more when the OS deschedules it) stalls the
step loop well past its slack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import run_child  # noqa: E402

_W = ("arena-hard", "poetry", "gsm8k")
FIREHOSE_DEQUE_S = 0.65  # each rank's deque holds this much of its records; see the module docstring
FIREHOSE_POLL_S = 0.05
FIREHOSE_LEAN_RECORDS = 8  # its /server_info encodes in less than one step period
FIREHOSE_LEAN_POLL_S = 0.01
FIREHOSE_LOWER_RATES = (12_500, 25_000)
_METRIC = re.compile(rb"^sglang:spec_verify_calls_total\{[^}]*\} ([0-9.e+]+)", re.M)


# -- the load generator (its own process) -------------------------------------------

async def _worker(host: str, port: int, first: int, stride: int, stop: float, done: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = first
    try:
        while time.monotonic() < stop:
            w = _W[i % len(_W)]
            body = json.dumps({"rid": f"{w}-{i:08d}", "text": f"[{w}] bench request {i}",
                               "sampling_params": {"temperature": 0.0 if i % 2 else 0.7,
                                                   "max_new_tokens": 1024, "sampling_seed": i}}).encode()
            writer.write(b"POST /generate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
            await reader.readexactly(length)
            done[0] += 1
            i += stride
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _loadgen(url: str, concurrency: int, duration: float) -> int:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    done = [0]
    stop = time.monotonic() + duration
    await asyncio.gather(*(_worker(host, int(port), k, concurrency, stop, done) for k in range(concurrency)))
    return done[0]


# -- the collector (its own process, via bench.child) ---------------------------------

def collector(url: str, out: str, duration: float, poll_interval: float, clear_at: int = 0,
              run_id: str = "bench-collect") -> dict:
    """Collect for ``duration`` seconds; the summary and this process's RSS every half second."""
    from collectors.sglang.session import CollectOptions, Collector
    from dspark_obs.store import Store

    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            samples.append(_rss_mb(os.getpid()))

    threading.Thread(target=sample, daemon=True).start()
    opts = CollectOptions(url=url, run_id=run_id, poll_interval=poll_interval, clear_at=clear_at,
                          flush_interval=2.0, duration=duration)
    t0 = time.process_time()
    summary = asyncio.run(Collector(Store(out), opts).run())
    cpu = time.process_time() - t0
    stop.set()
    return {"steps": summary.steps, "step_reqs": summary.step_reqs, "gaps": summary.gaps,
            "lost_forward_cts": summary.lost_forward_cts, "dead_letters": summary.dead_letters,
            "rows_dropped": summary.rows_dropped, "polls": summary.polls, "poll_errors": summary.poll_errors,
            "clears": summary.clears, "observation_server_s": summary.observation_server_s,
            "observation_requests": summary.observation_requests,
            "elapsed_s": summary.elapsed_s, "cpu_s": cpu, "rss_mb": samples, "end_reason": summary.end_reason}


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


# -- the orchestration ------------------------------------------------------------------

def _verify_calls(url: str) -> float:
    import httpx

    m = _METRIC.search(httpx.get(f"{url}/metrics", timeout=10).content)
    return float(m.group(1)) if m else 0.0


def _windows(url: str, n: int, seconds: float) -> list[float]:
    rates = []
    for _ in range(n):
        c0, t0 = _verify_calls(url), time.monotonic()
        time.sleep(seconds)
        rates.append((_verify_calls(url) - c0) / (time.monotonic() - t0))
    return rates


def run(*, quick: bool, workdir: str, tiny: bool = False) -> dict:
    """Both measurements: the emulator (``collect.*``) and the firehose (``collect.firehose.*``)."""
    try:
        res = run_emulator(quick=quick, workdir=workdir, tiny=tiny)
    except Exception as exc:  # one broken half must not lose the other
        res = {"collect.error": f"{type(exc).__name__}: {exc}"[:400]}
    res.update(run_firehose(quick=quick, workdir=workdir, tiny=tiny))
    if not quick:  # the other end of the trade-off: a deque whose encoding fits between two steps
        res.update(run_firehose(quick=quick, workdir=workdir, max_records=FIREHOSE_LEAN_RECORDS,
                                poll_interval=FIREHOSE_LEAN_POLL_S, prefix="collect.firehose.lean."))
        for rate in FIREHOSE_LOWER_RATES:  # what the default settings sustain, below the target
            res.update(run_firehose(quick=quick, workdir=workdir, rate=rate, windows_on=6,
                                    prefix=f"collect.firehose.at_{rate}."))
    return res


def run_emulator(*, quick: bool, workdir: str, tiny: bool = False) -> dict:
    from dspark_obs.emulator.server import SubprocessServer

    concurrency = 32 if tiny else 512 if quick else 1024
    window_s = 1.0 if tiny else 3.0 if quick else 5.0
    n_off = 1 if tiny else 2 if quick else 5
    n_on = 2 if tiny else 3 if quick else 10
    warmup = 4.0 if tiny else 15.0 if quick else 30.0
    # /server_info always sends the whole deque, so the server's cost per poll is
    # max_records * bs entries: keep the deque small and poll it ~3x per fill.
    max_records = 48
    res: dict = {"collect.concurrency": concurrency, "collect.max_records": max_records}
    with SubprocessServer(mode="compact", seed=0, max_running_requests=concurrency, max_records=max_records,
                          startup_timeout=120) as srv:
        loadgen = subprocess.Popen([sys.executable, "-m", "bench.collect", "loadgen", "--url", srv.url,
                                    "--concurrency", str(concurrency), "--duration", "3600"], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(warmup)
            before = _windows(srv.url, n_off, window_s)
            steps_per_s = statistics.median(before) / concurrency
            # Each poll reads about a third of the deque new: the server encodes each record ~3 times.  The
            # collector sleeps poll_interval *after* each poll, so a poll cycle is longer than the interval;
            # at 2x (tried) the deque wrapped between polls.
            poll = round(min(2.0, max(0.1, max_records / (3.0 * max(steps_per_s, 1e-3)))), 2)
            res["collect.records_per_s"] = round(steps_per_s, 1)
            res["collect.poll_interval_s"] = poll
            out = tempfile.mkdtemp(prefix="bench-collect-", dir=workdir)
            holder: dict = {}
            duration = window_s * n_on + 4.0
            th = threading.Thread(target=lambda: holder.update(run_child(
                "bench.collect:collector", timeout=duration + 120, url=srv.url, out=out, duration=duration,
                poll_interval=poll)))
            th.start()
            time.sleep(2.0)  # the collector's start-up and first poll
            during = _windows(srv.url, n_on, window_s)
            th.join()
            after = _windows(srv.url, n_off, window_s)
        finally:
            loadgen.send_signal(signal.SIGTERM)
            try:
                loadgen.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                loadgen.kill()
                loadgen.wait()
    without = before + after
    res["collect.step_loop_rate_without"] = round(statistics.median(without))
    res["collect.step_loop_rate_with"] = round(statistics.median(during))
    res["collect.step_loop_rate_without_min"] = round(min(without))
    res["collect.step_loop_rate_without_max"] = round(max(without))
    res["collect.step_loop_rate_with_min"] = round(min(during))
    res["collect.step_loop_rate_with_max"] = round(max(during))
    res["collect.step_loop_slowdown"] = round(1 - statistics.median(during) / statistics.median(without), 4)
    res["collect.request_steps_per_s"] = res["collect.step_loop_rate_with"]
    c = holder
    if "error" in c:
        res["collect.error"] = c["error"]
        return res
    rss = [x for x in c["rss_mb"] if x == x]
    res.update({
        "collect.gaps": c["gaps"], "collect.lost_forward_cts": c["lost_forward_cts"],
        "collect.dead_letters": c["dead_letters"], "collect.rows_dropped": c["rows_dropped"],
        "collect.rows": c["step_reqs"], "collect.steps": c["steps"], "collect.polls": c["polls"],
        "collect.rows_per_s": round(c["step_reqs"] / c["elapsed_s"]) if c["elapsed_s"] else None,
        "collect.collector_cpu_share": round(c["cpu_s"] / c["elapsed_s"], 3) if c["elapsed_s"] else None,
        # the live figure (runs.observation_server_s / collect_s): an upper bound beside step_loop_slowdown
        "collect.observation_share": round(c["observation_server_s"] / c["elapsed_s"], 4) if c["elapsed_s"] else None,
        "collect.poll_round_trip_ms": round(1000 * c["observation_server_s"] / c["observation_requests"], 1)
        if c["observation_requests"] else None,
        "collect.peak_mb": c["peak_rss_mb"],
        "collect.rss_first_half_max_mb": round(max(rss[: len(rss) // 2]), 1) if len(rss) > 1 else None,
        "collect.rss_second_half_max_mb": round(max(rss[len(rss) // 2:]), 1) if len(rss) > 1 else None,
    })
    return res


# -- the firehose: the collector at a chosen record rate ------------------------------

def _hose_stats(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/firehose/stats", timeout=30).json()


def _hose_windows(url: str, n: int, seconds: float) -> list[dict]:
    """Per window: request-steps/s, the share of time the schedule slipped, lateness, server CPU."""
    out = []
    a = _hose_stats(url)
    for _ in range(n):
        time.sleep(seconds)
        b = _hose_stats(url)
        dt, ticks = b["t"] - a["t"], max(b["ticks"] - a["ticks"], 1)
        out.append({"rate": (b["request_steps"] - a["request_steps"]) / dt,
                    "slip_share": (b["slip_s"] - a["slip_s"]) / dt,
                    "late_share": (b["late_sum_s"] - a["late_sum_s"]) / dt,
                    "late_mean_ms": 1000 * (b["late_sum_s"] - a["late_sum_s"]) / ticks,
                    "late_max_ms": 1000 * b["late_max_s"],
                    "late_over_10ms": sum(b["late_hist"][4:]) - sum(a["late_hist"][4:]),
                    "ticks": ticks,
                    "server_cpu_share": (b["process_cpu_s"] - a["process_cpu_s"]) / dt,
                    "tick_cpu_share": (b["tick_cpu_s"] - a["tick_cpu_s"]) / dt})
        a = b
    return out


def _stored_forward_cts(out: str, run_id: str) -> dict:
    """Per DP rank in the store: distinct forward_cts, their range, and the rows of those steps."""
    import pyarrow.compute as pc

    from dspark_obs.store import Store

    steps = Store(out).read("steps", run_id)
    res = {}
    for rank in pc.unique(steps.column("dp_rank")).to_pylist():
        part = steps.filter(pc.equal(steps.column("dp_rank"), rank))
        fcts = part.column("forward_ct")
        res[rank] = {"distinct": len(pc.unique(fcts)), "rows": part.num_rows, "first": pc.min(fcts).as_py(),
                     "last": pc.max(fcts).as_py(), "bs_sum": pc.sum(part.column("bs")).as_py()}
    return res


def run_firehose(*, quick: bool, workdir: str, tiny: bool = False, rate: float = 50_000.0, ranks: int = 4,
                 batch: int = 256, max_records: int | None = None,
                 poll_interval: float = FIREHOSE_POLL_S, clear_at: int = 0,
                 prefix: str = "collect.firehose.", windows_on: int | None = None) -> dict:
    """The collector against the firehose: alone, then collected for a sustained period, then alone."""
    from bench.firehose import FirehoseProcess

    if tiny:  # a deque of two seconds: the smoke test checks every record arrives, not timing
        rate, ranks, batch, max_records, poll_interval = 2_000.0, 2, 16, 128, 0.05
    if max_records is None:  # ~FIREHOSE_DEQUE_S of each rank's steps: 32 records at 50k, 16 at 25k
        max_records = max(FIREHOSE_LEAN_RECORDS, math.ceil(FIREHOSE_DEQUE_S * rate / (ranks * batch)))
    window_s = 1.0 if tiny else 3.0 if quick else 5.0
    n_off = 1 if tiny else 2 if quick else 4
    n_on = windows_on or (2 if tiny else 4 if quick else 24)  # sustained: 2 minutes at full settings
    k = prefix
    res: dict = {k + "target_rate": rate, k + "ranks": ranks, k + "batch": batch, k + "max_records": max_records,
                 k + "poll_interval_s": poll_interval, k + "clear_at": clear_at}
    run_id = "bench-firehose"
    out = tempfile.mkdtemp(prefix="bench-firehose-", dir=workdir)
    with FirehoseProcess(rate=rate, ranks=ranks, batch=batch, max_records=max_records,
                         pool=8 if tiny else 64) as hose:
        time.sleep(1.0 if tiny else 2.0)
        before = _hose_windows(hose.url, n_off, window_s)
        holder: dict = {}
        duration = window_s * n_on + 3.0
        th = threading.Thread(target=lambda: holder.update(run_child(
            "bench.collect:collector", timeout=duration + 120, url=hose.url, out=out, duration=duration,
            poll_interval=poll_interval, clear_at=clear_at, run_id=run_id)))
        s0 = _hose_stats(hose.url)
        th.start()
        time.sleep(2.0)  # the collector's start-up and first poll
        during = _hose_windows(hose.url, n_on, window_s)
        th.join()
        s1 = _hose_stats(hose.url)
        after = _hose_windows(hose.url, n_off, window_s)
    without = before + after

    def med(ws: list[dict], key: str) -> float:
        return statistics.median(w[key] for w in ws)

    res.update({
        k + "rows_per_s": round(med(during, "rate")),
        k + "rate_without": round(med(without, "rate")),
        k + "rate_with_min": round(min(w["rate"] for w in during)),
        k + "rate_without_min": round(min(w["rate"] for w in without)),
        k + "step_loop_slowdown": round(1 - med(during, "rate") / med(without, "rate"), 4),
        k + "slip_share_with": round(med(during, "slip_share"), 4),
        k + "slip_share_without": round(med(without, "slip_share"), 4),
        k + "late_share_with": round(med(during, "late_share"), 4),
        k + "late_share_without": round(med(without, "late_share"), 4),
        k + "late_mean_ms_with": round(med(during, "late_mean_ms"), 2),
        k + "late_mean_ms_without": round(med(without, "late_mean_ms"), 2),
        k + "late_max_ms_with": round(max(w["late_max_ms"] for w in during), 1),
        k + "late_max_ms_without": round(max(w["late_max_ms"] for w in without), 1),
        k + "late_over_10ms_share_with": round(sum(w["late_over_10ms"] for w in during)
                                               / sum(w["ticks"] for w in during), 4),
        k + "server_cpu_share_with": round(med(during, "server_cpu_share"), 3),
        k + "server_cpu_share_without": round(med(without, "server_cpu_share"), 3),
        k + "step_loop_cpu_share": round(med(without, "tick_cpu_share"), 3),
        k + "server_clears": s1["clears"] - s0["clears"],
    })
    c = holder
    if "error" in c:
        res[k + "error"] = c["error"]
        return res
    rss = [x for x in c["rss_mb"] if x == x]
    stored = _stored_forward_cts(out, run_id)
    # Every forward_ct between the first and the last one stored, on every rank, is a full batch.
    span = sum(r["last"] - r["first"] + 1 for r in stored.values())
    res.update({
        k + "gaps": c["gaps"], k + "lost_forward_cts": c["lost_forward_cts"],
        k + "dead_letters": c["dead_letters"], k + "rows_dropped": c["rows_dropped"],
        k + "polls": c["polls"], k + "clears": c["clears"], k + "poll_errors": c["poll_errors"],
        k + "steps": c["steps"], k + "rows": c["step_reqs"],
        k + "rows_produced": span * batch,
        k + "missing_forward_cts": span - sum(r["distinct"] for r in stored.values()),
        k + "duplicate_steps": sum(r["rows"] - r["distinct"] for r in stored.values()),
        k + "rows_stored_match": c["step_reqs"] == span * batch == sum(r["bs_sum"] for r in stored.values()),
        k + "produced_while_collected": s1["request_steps"] - s0["request_steps"],
        k + "collected_s": round(c["elapsed_s"], 1),
        k + "collector_rows_per_s_wall": round(c["step_reqs"] / c["elapsed_s"]) if c["elapsed_s"] else None,
        k + "collector_rows_per_cpu_s": round(c["step_reqs"] / c["cpu_s"]) if c["cpu_s"] else None,
        k + "collector_cpu_share": round(c["cpu_s"] / c["elapsed_s"], 3) if c["elapsed_s"] else None,
        k + "collector_peak_mb": c["peak_rss_mb"],
        k + "rss_first_half_max_mb": round(max(rss[: len(rss) // 2]), 1) if len(rss) > 1 else None,
        k + "rss_second_half_max_mb": round(max(rss[len(rss) // 2:]), 1) if len(rss) > 1 else None,
    })
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="load generator for the live-collection benchmark")
    ap.add_argument("mode", choices=["loadgen"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--duration", type=float, default=30.0)
    args = ap.parse_args(argv)
    done = asyncio.run(_loadgen(args.url, args.concurrency, args.duration))
    print(json.dumps({"requests": done}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
