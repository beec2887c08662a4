"""Shared helpers of the benchmark harness: timing statistics, child processes, machine facts.

Every measurement that reports peak memory runs in a fresh child process
(``python -m bench.child MODULE:FUNCTION JSON``) and reads that process's own
``ru_maxrss``, so one benchmark's allocations never inflate another's.  Rates
are given per CPU second of the measuring process (``*_rows_per_s``: what one
core does, whatever else the machine runs) and per wall second (``*_wall``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def full_batch_payload(*, records: int, batch: int, gamma: int, max_records: int, seed: int = 0,
                       tag: str = "request") -> dict:
    """One rank's ``dspark_info_record`` from the emulator's engine: its last ``records`` full-batch steps.

    Closed loop at ``batch`` requests (greedy and temperature 0.7 alternating,
    workloads in turn), stepped until the deque (``max_records``) holds enough
    decode steps at full batch; the ingest body and the firehose's pool both
    start from here.
    """
    from dspark_obs.emulator.engine import Engine, EngineConfig, GenerateRequest

    workloads = ("gsm8k", "arena-hard", "poetry")
    eng = Engine(EngineConfig(mode="compact", seed=seed, gamma=gamma, max_running_requests=batch,
                              max_records=max_records))
    count = [0]
    live: set = set()

    def top() -> None:
        while len(live) < batch:
            i = count[0]
            count[0] += 1
            w = workloads[i % 3]
            fut = eng.submit(GenerateRequest(rid=f"{w}-{i:06d}", text=f"[{w}] {tag} {i}",
                                             temperature=0.0 if i % 2 else 0.7, max_new_tokens=1024,
                                             sampling_seed=i))
            live.add(fut)
            fut.add_done_callback(live.discard)

    top()
    while sum(1 for r in eng.ranks[0].dumper._records if r.get("bs") == batch) < records:
        eng.step()
        top()
    payload = eng.dump()[0]
    payload["records"] = [r for r in payload["records"] if r.get("bs") == batch][-records:]
    return payload


def stats(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def measure(fn: Callable[[], Any], *, repeat: int, warmup: int = 1) -> dict[str, list[float]]:
    """Wall and CPU seconds of ``repeat`` calls of ``fn`` (after ``warmup`` untimed calls)."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"wall": wall, "cpu": cpu}


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, MiB.

    ``VmHWM`` of its own memory map; ``ru_maxrss`` would carry the forking
    parent's peak over the exec (Linux records the old map's high-water mark).
    """
    hwm = _vm_hwm_mb(os.getpid())
    if hwm:
        return hwm
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_child(target: str, *, timeout: float, env: dict | None = None, **kwargs: Any) -> dict:
    """Run ``bench.<module>:<function>(**kwargs)`` in a fresh interpreter; its JSON result.

    The child adds ``peak_rss_mb`` (its own ru_maxrss).  A child that fails or
    times out gives ``{"error": ...}`` instead of raising, so one broken figure
    does not lose the others.
    """
    cmd = [sys.executable, "-m", "bench.child", target, json.dumps(kwargs)]
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {out.returncode}: {' | '.join(tail)[:400]}"}
    return json.loads(lines[-1])


def machine() -> dict[str, Any]:
    """CPU model, cores, memory and load: the context every figure needs."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    return {"cpu_model": model, "cores": os.cpu_count(), "memory_gb": mem_gb, "python": platform.python_version(),
            "loadavg_1m": round(load[0], 2) if load[0] is not None else None}


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M/s"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k/s"
    return f"{x:.1f}/s"


def run_process(cmd: list[str], *, repeat: int, timeout: float = 1800, env: dict | None = None,
                cwd: str | Path = ROOT) -> dict:
    """CPU seconds (user + system, all threads), wall seconds and peak RSS of ``cmd`` run as a process.

    The figures of the command users run: its start-up and imports count, read
    from bytecode caches as an installed package's are (a shell that sets
    ``PYTHONDONTWRITEBYTECODE`` would have every run compile the project's
    modules again: 0.04 CPU s of ``dspark-obs --version``'s 0.21).  Peak RSS is
    the process's own ``VmHWM`` (a high-water mark, read while it runs), not
    the ``ru_maxrss`` of ``wait4``: Linux carries the forking parent's peak over
    the exec into that figure.  A failing command gives ``{"error": ...}``.
    """
    import signal
    import tempfile

    cpu, wall, peak = [], [], 0.0
    for _ in range(repeat):
        with tempfile.TemporaryFile() as err:
            w0 = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, env=_command_env(env))
            hwm = 0.0
            while True:
                hwm = max(hwm, _vm_hwm_mb(proc.pid))
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() - w0 > timeout:
                    proc.send_signal(signal.SIGKILL)
                    os.wait4(proc.pid, 0)
                    return {"error": f"timed out after {timeout:.0f} s: {' '.join(cmd)[:200]}"}
                time.sleep(0.005)
            wall.append(time.perf_counter() - w0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode != 0:
                err.seek(0)
                tail = err.read().decode("utf-8", "replace").strip().splitlines()[-3:]
                return {"error": f"exit {proc.returncode}: {' | '.join(tail)[:400]}"}
        cpu.append(usage.ru_utime + usage.ru_stime)
        peak = max(peak, hwm)
    return {"cpu": cpu, "wall": wall, "peak_rss_mb": peak}


def _command_env(env: dict | None) -> dict:
    """The environment of a timed command: this one, bytecode caches allowed, ``env`` on top."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, **(env or {})}


def _vm_hwm_mb(pid: int) -> float:
    """Peak resident set of a running process, MiB (0 once it has exited)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return 0.0
