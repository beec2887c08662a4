"""Dashboard: time to the first full render of Overview and Calibration in headless Chromium.

Starts ``dspark-obs dashboard --data STORE`` (its own process group) on a
generated store that holds the estimator's results, drives Debian's chromium
(``/usr/bin/chromium``, or ``$BROWSER_PATH``) with Playwright as
``tests/browser`` does, and times each page from navigation until Streamlit's
script run is over, no skeleton is left and every Plotly chart on the page has
drawn.  ``cold``: the first load after the server started (its query caches and
the browser's cache empty); ``warm``: later loads in a new tab of the same
browser profile (median of three); ``new_visitor``: a warm server seen from
a fresh browser profile, which must download and compile Streamlit's and
Plotly's scripts first.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"overview": "", "calibration": "calibration"}
# Every page (``python -m bench.dashboard --all-pages``): each against the same run's floor.
ALL_PAGES = {"overview": "", "ceiling": "ceiling", "windows": "windows", "calibration": "calibration",
             "costmodel": "costmodel", "throughput": "throughput", "requests": "requests", "compare": "compare",
             "sql_console": "sql_console"}
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
_DRAWN = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  if (document.querySelector('[data-testid="stSkeleton"]')) return false;
  const charts = document.querySelectorAll('[data-testid="stPlotlyChart"]').length;
  const drawn = document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot .main-svg').length;
  const h1 = document.querySelector('h1');
  return !!h1 && drawn >= charts ? String(charts) : false;  // "0" is truthy, 0 is not
}"""


def _chromium() -> str | None:
    for candidate in (os.environ.get("BROWSER_PATH"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(data: str, *, floor: bool = False) -> tuple[subprocess.Popen, str]:
    """Serve the dashboard on ``data`` (or, with ``floor``, the bare page of ``dashboard_floor.py``)."""
    from dspark_obs.ui.serve import streamlit_command, streamlit_env

    port = _free_port()
    if floor:
        cmd = streamlit_command(data, port=port, app=Path(__file__).with_name("dashboard_floor.py"))
        env = streamlit_env(data)
    else:
        cmd, env = [sys.executable, "-m", "dspark_obs.cli", "dashboard", "--data", data, "--port", str(port)], None
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dspark-obs dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.3)
    _stop(proc)
    raise RuntimeError("dspark-obs dashboard did not answer /_stcore/health within 120 s")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _load(ctx, url: str, timeout_ms: int) -> tuple[float, int, int]:
    """Seconds from navigation to a fully drawn page in a new tab of ``ctx``; its chart and error counts."""
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit")
    page.wait_for_timeout(50)
    charts = int(page.wait_for_function(_DRAWN, timeout=timeout_ms).json_value())
    elapsed = time.perf_counter() - t0
    errors = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]').count()
    page.close()
    return elapsed, charts, errors


def _pages(browser, url: str, pages: dict[str, str], warm_repeats: int, timeout_ms: int) -> dict:
    out: dict = {}
    # One browser profile, as a user's: its HTTP cache keeps Streamlit's and
    # Plotly's scripts after the first visit.  A fresh profile per load
    # measures a first-time visitor instead (``new_visitor_s``).
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        for name, path in pages.items():
            times, charts, errors = [], 0, 0
            for _ in range(1 + warm_repeats):
                t, charts, errors = _load(ctx, f"{url}/{path}", timeout_ms)
                times.append(t)
            visitor = browser.new_context(viewport={"width": 1400, "height": 1000})
            out[f"{name}.new_visitor_s"] = round(_load(visitor, f"{url}/{path}", timeout_ms)[0], 3)
            visitor.close()
            out[f"{name}.cold_s"] = round(times[0], 3)
            out[f"{name}.warm_s"] = round(statistics.median(times[1:]), 3)
            out[f"{name}.warm_min_s"] = round(min(times[1:]), 3)
            out[f"{name}.warm_max_s"] = round(max(times[1:]), 3)
            out[f"{name}.charts"] = charts
            out[f"{name}.errors"] = errors
    finally:
        ctx.close()
    return out


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant, their reaped children included (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(pid)], cpu[int(pid)] = int(fields[1]), sum(int(v) for v in fields[11:15]) / tick
    total = 0.0
    for pid, seconds in cpu.items():
        p = pid
        while p and p != root:
            p = parent.get(p, 0)
        total += seconds if p == root else 0.0
    return total


def measure_paired(data: str, *, rounds: int, pages: dict[str, str], timeout_ms: int = 180_000) -> dict:
    """Each page's warm load right after a floor load, ``rounds`` times round-robin (both servers up).

    On a shared machine the load drifts by the minute; a page timed beside its
    own floor load cancels that drift, so the ratio is the median of the pairs'
    ratios.  Also the CPU seconds of each load (browser, both servers), which
    queueing for a core does not inflate.
    """
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    if chromium is None:
        return {"error": "Debian's chromium is not installed (apt-get install -y chromium)"}
    floor_proc, floor_url = _start(data, floor=True)
    proc, url = _start(data)
    me = os.getpid()
    samples: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in pages}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            for r in range(rounds + 1):  # round 0 warms both servers' caches and the browser's
                for name, path in pages.items():
                    c0 = _tree_cpu_s(me)
                    floor_s = _load(ctx, floor_url, timeout_ms)[0]
                    c1 = _tree_cpu_s(me)
                    page_s = _load(ctx, f"{url}/{path}", timeout_ms)[0]
                    c2 = _tree_cpu_s(me)
                    if r:
                        samples[name].append((page_s, floor_s, c2 - c1, c1 - c0))
            browser.close()
    finally:
        _stop(proc)
        _stop(floor_proc)
    med = lambda xs: round(statistics.median(xs), 3)  # noqa: E731
    return {name: {"warm_s": med([s[0] for s in rows]), "floor_s": med([s[1] for s in rows]),
                   "over_floor": med([s[0] / s[1] for s in rows]),
                   "cpu_s": med([s[2] for s in rows]), "floor_cpu_s": med([s[3] for s in rows]),
                   "cpu_over_floor": med([s[2] / s[3] for s in rows if s[3] > 0])}
            for name, rows in samples.items()}


def measure(data: str, *, warm_repeats: int = 3, timeout_ms: int = 180_000, pages: dict[str, str] = PAGES) -> dict:
    """Cold, warm and new-visitor seconds of each page of ``PAGES`` on the store at ``data``,
    and of the framework's floor (``dashboard_floor.py``: one Plotly chart, no data) in the same run."""
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    if chromium is None:
        return {"error": "Debian's chromium is not installed (apt-get install -y chromium)"}
    out: dict = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            for floor, served in ((True, {"floor": ""}), (False, pages)):
                proc, url = _start(data, floor=floor)
                try:
                    out.update(_pages(browser, url, served, warm_repeats, timeout_ms))
                finally:
                    _stop(proc)
        finally:
            browser.close()
    return out


def run(*, data: str, rows: int, warm_repeats: int = 3) -> dict:
    try:
        r = measure(data, warm_repeats=warm_repeats)
    except Exception as exc:  # a missing browser or a dashboard that does not start: report, go on
        return {"dashboard.error": f"{type(exc).__name__}: {exc}"[:400]}
    if "error" in r:
        return {"dashboard.error": r["error"]}
    res = {"dashboard.store_rows": rows}
    res.update({f"dashboard.{k}": v for k, v in r.items()})
    res["dashboard.first_render_s"] = max(r["overview.warm_s"], r["calibration.warm_s"])
    res["dashboard.first_render_cold_s"] = max(r["overview.cold_s"], r["calibration.cold_s"])
    res["dashboard.floor_s"] = r["floor.warm_s"]
    res["dashboard.over_floor"] = round(res["dashboard.first_render_s"] / r["floor.warm_s"], 2)
    return res


def main(argv: list[str] | None = None) -> int:
    """Every page's warm render against the same run's floor on a generated store (with estimator results)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000, help="request-steps of the generated store")
    ap.add_argument("--workdir", default="/tmp/dspark-bench-dashboard", help="where the store is generated")
    ap.add_argument("--all-pages", action="store_true", help="every page, not only Overview and Calibration")
    ap.add_argument("--page", action="append", choices=sorted(ALL_PAGES), default=None,
                    help="only this page (repeatable); the floor is always timed beside it")
    ap.add_argument("--warm-repeats", type=int, default=3)
    ap.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                    help="time each page right after a floor load, ROUNDS times round-robin (ratio: median of "
                         "the pairs; with CPU seconds): steadier on a loaded machine than one floor per run")
    args = ap.parse_args(argv)
    chosen = ({p: ALL_PAGES[p] for p in args.page} if args.page else ALL_PAGES if args.all_pages else PAGES)
    sys.path.insert(0, str(ROOT))
    from bench.gen_store import RUN_ID, generate

    store = Path(args.workdir) / f"store-{args.rows}"
    if not (store / "calibration").is_dir():
        generate(store, rows=args.rows)
        for cmd in (["estimate", "--data", str(store), "--run", RUN_ID],
                    ["calibrate", "--data", str(store), "--run", RUN_ID, "--labels", "observed"]):
            subprocess.run([sys.executable, "-m", "dspark_obs.cli", *cmd], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
    load_before = os.getloadavg()[0]
    if args.paired:
        paired = measure_paired(str(store), rounds=args.paired, pages=chosen)
        print(json.dumps({"rows": args.rows, "rounds": args.paired, "load_1m_before": round(load_before, 2),
                          "load_1m_after": round(os.getloadavg()[0], 2), **paired}, indent=1))
        return 0
    r = measure(str(store), warm_repeats=args.warm_repeats, pages=chosen)
    floor = r.get("floor.warm_s")
    out = {"rows": args.rows, "load_1m_before": round(load_before, 2), "load_1m_after": round(os.getloadavg()[0], 2),
           "floor_warm_s": floor}
    for name in chosen:
        warm = r.get(f"{name}.warm_s")
        out[name] = {"warm_s": warm, "cold_s": r.get(f"{name}.cold_s"), "charts": r.get(f"{name}.charts"),
                     "errors": r.get(f"{name}.errors"),
                     "over_floor": round(warm / floor, 2) if warm and floor else None}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
