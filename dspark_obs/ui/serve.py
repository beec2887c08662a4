"""Serve the Streamlit dashboard on a data root (``dspark-obs dashboard``, ``demo --serve``).

:func:`serve_dashboard` runs ``python -m streamlit run dspark_obs/ui/app.py`` as
a child process, headless, without usage statistics, with the data root passed
through (after ``--`` and as ``$DSPARK_OBS_DATA``), and waits for it; Ctrl-C or
SIGTERM stop the child too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from dspark_obs.ui.export import find_chromium

__all__ = ["APP_PATH", "streamlit_command", "streamlit_env", "serve_dashboard"]

APP_PATH = Path(__file__).resolve().parent / "app.py"
_console = Console(stderr=True)


def streamlit_command(data_root: str | Path, host: str = "127.0.0.1", port: int = 8501, *,
                      app: str | Path = APP_PATH) -> list[str]:
    """The ``streamlit run`` command line that serves the dashboard (or another ``app``) on ``data_root``."""
    return [
        sys.executable, "-m", "streamlit", "run", str(app),
        "--server.address", host, "--server.port", str(port), "--server.headless", "true",
        "--server.fileWatcherType", "none", "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false", "--client.showErrorDetails", "type",
        "--client.toolbarMode", "viewer", "--theme.base", "light", "--theme.primaryColor", "#1F3B73",
        "--", "--data", str(Path(data_root).resolve()),
    ]


def streamlit_env(data_root: str | Path) -> dict[str, str]:
    """The child's environment: no telemetry, the data root, and a Chromium for kaleido's PNG export."""
    env = dict(os.environ)
    env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    env["STREAMLIT_SERVER_HEADLESS"] = "true"
    env["DSPARK_OBS_DATA"] = str(Path(data_root).resolve())
    if "BROWSER_PATH" not in env:

        browser = find_chromium()
        if browser:
            env["BROWSER_PATH"] = browser
    return env


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def serve_dashboard(data_root: str | Path, host: str = "127.0.0.1", port: int = 8501, *,
                    console: Console | None = None) -> int:
    """Serve the dashboard on ``data_root`` at ``http://host:port`` until interrupted; the exit code.

    Raises ValueError when the data root is a file or the port is taken (the
    message names the fix).  Blocks: returns when Streamlit exits (Ctrl-C,
    SIGTERM, or an error), with Streamlit's exit code (0 after Ctrl-C).
    """
    console = console or _console
    root = Path(data_root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--data {root} is a file; pass the data root directory of a store")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"--port {port} is not a TCP port (1-65535)")
    if not _port_free(host, int(port)):
        raise ValueError(f"{host}:{port} is already in use; pass another --port (or stop what listens there)")
    if not root.exists():
        console.print(f"[yellow]note:[/yellow] {root} does not exist yet; the dashboard says how to collect into it")
    shown = f"[{host}]" if ":" in host else host
    console.print(f"dashboard on [bold]http://{shown}:{port}[/bold] for {root.resolve()} (Ctrl-C to stop)")
    child = subprocess.Popen(streamlit_command(root, host, port), env=streamlit_env(root))

    def _forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, _forward)
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C reached the whole process group: let streamlit shut down
                _forward(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
    return 0 if code in (0, -signal.SIGINT, -signal.SIGTERM) else code
