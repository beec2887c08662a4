"""Browser-test fixtures: Debian's chromium, a sample store, and `dspark-obs dashboard` on a free port.

Playwright drives Debian's chromium (``/usr/bin/chromium``, or ``$BROWSER_PATH``);
``playwright install`` is never needed.  Without chromium or the playwright
package the tests skip, except when ``$CI`` is set: there they fail, because CI
must install both (``apt-get install -y chromium``; ``pip install playwright``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sample_store import build_sample_store

CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
STARTUP_TIMEOUT_S = 90


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it: the browser test may not be skipped in CI)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    for candidate in (os.environ.get("BROWSER_PATH"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).is_file():
            return candidate
    _missing("Debian's chromium is not installed: apt-get install -y chromium")


@pytest.fixture(scope="module")
def browser(chromium_path):
    """Playwright's sync API runs an event loop on this thread while open: keep it to the module, or later
    tests calling asyncio.run() would fail."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed: pip install playwright (no `playwright install`)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    return build_sample_store(tmp_path_factory.getbasetemp() / "ui-sample")


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory) -> Path:
    """Where page screenshots go: ``$DSPARK_OBS_SCREENSHOTS`` if set, else a pytest tmp dir."""
    explicit = os.environ.get("DSPARK_OBS_SCREENSHOTS")
    path = Path(explicit) if explicit else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dashboard_command() -> list[str]:
    """`dspark-obs dashboard` from this interpreter's environment (the console script, else the module)."""
    script = Path(sys.executable).with_name("dspark-obs")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dspark_obs.cli"]


@pytest.fixture(scope="module")
def dashboard_url(sample_root, tmp_path_factory):
    """Start `dspark-obs dashboard --data <sample> --port <free>` in its own process group; stop it after."""
    port = _free_port()
    log = tmp_path_factory.mktemp("dashboard") / "dashboard.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*_dashboard_command(), "dashboard", "--data", str(sample_root), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dspark-obs dashboard exited with {proc.returncode}:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"dspark-obs dashboard did not answer within {STARTUP_TIMEOUT_S} s:\n{log.read_text()}")
            time.sleep(0.3)
        yield url
    finally:
        _stop_group(proc)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we started (the command and its streamlit child), SIGKILL what lingers."""
    pgid = proc.pid  # start_new_session: the command leads its own group
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while _group_alive(pgid) and time.monotonic() < deadline:
        proc.poll()
        time.sleep(0.2)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=5)
