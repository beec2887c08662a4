"""The emulator as a child process (``dspark-obs emulate``), started and stopped as a real server is.

Apart from :mod:`dspark_obs.emulator.server` because it only speaks to the server over HTTP: the
demo and the real-model tests run it without importing the server's web stack.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any, Optional

import httpx


class SubprocessServer:
    """Run ``dspark-obs emulate`` as a child process, as a real server would run.

    The demo uses it so the engine does not share an interpreter (and its GIL)
    with the collector: a closed-loop client's refills then arrive in
    milliseconds, which lockstep batching relies on.
    """

    name = "emulator"
    module: tuple[str, ...] = ("dspark_obs.cli", "emulate")  # python -m ...; takes --host, --port, the options
    cwd: Optional[str] = None
    stop_timeout = 15.0

    def __init__(self, *, host: str = "127.0.0.1", startup_timeout: float = 60.0, **options: Any) -> None:
        self.host, self.startup_timeout, self.options = host, startup_timeout, options
        self.port = 0
        self._proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "SubprocessServer":


        with socket.socket() as sock:
            sock.bind((self.host, 0))
            self.port = sock.getsockname()[1]
        args = [sys.executable, "-m", *self.module, "--host", self.host, "--port", str(self.port)]
        for name, value in self.options.items():
            flag = f"--{name.replace('_', '-')}"
            if isinstance(value, bool):  # a switch: given when True
                args += [flag] if value else []
            elif value is not None:
                args += [flag, str(value)]
        self._proc = subprocess.Popen(args, cwd=self.cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise RuntimeError(f"{self.name} exited with {self._proc.returncode}: {err.strip()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer {self.url}/health within {self.startup_timeout:.0f} s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # SIGTERM: uvicorn shuts down cleanly
            try:
                self._proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __enter__(self) -> "SubprocessServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
