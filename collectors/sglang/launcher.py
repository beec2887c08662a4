"""Launch mode: start the server as a child, collect from it, stop it, say why the run ended.

``dspark-obs collect --out DIR -- python -m sglang.launch_server ...`` runs the
command with what collection needs in its environment:

* ``SGLANG_DSPARK_DEBUG_DUMP`` — every component, unless the caller set it;
* ``SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH`` and
  ``SGLANG_DSPARK_FOLDED_PROPOSAL=0`` when an estimator JSONL is asked for;
* ``--enable-metrics`` appended to an ``sglang.launch_server`` command.

The verify mode is the child's ``SGLANG_RAGGED_VERIFY_MODE`` (SGLang's default
``static`` when unset) and is stored on the run.  The child gets its own
process group, so a terminal's Ctrl-C reaches the collector only; the
collector polls one last time, then forwards the signal to the child's group,
waits ``shutdown_timeout`` seconds and kills it if it is still there.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import httpx

MODES = ("static", "compact", "cap-accept")
DEBUG_DUMP_ALL = "core,step_cpu_time,step_gpu_time,draft_gpu_time,target_verify_gpu_time,reqs"
SGLANG_DEFAULT_PORT = 30000


class LaunchError(RuntimeError):
    """The child could not be started or never became healthy; the message says how to fix it."""


@dataclass
class LaunchSpec:
    command: list[str]
    url: Optional[str] = None  # default: from the command's --host/--port
    estimator_jsonl: Optional[str] = None
    startup_timeout: float = 1800.0
    shutdown_timeout: float = 30.0
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    log_path: Optional[str] = None  # child's stdout+stderr; default: inherited


def _flag_value(command: Sequence[str], flag: str) -> Optional[str]:
    for i, arg in enumerate(command):
        if arg == flag and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def url_from_command(command: Sequence[str]) -> str:
    """``http://host:port`` the child will listen on (SGLang's defaults: 127.0.0.1:30000).

    >>> url_from_command(["python", "-m", "sglang.launch_server", "--port=31000", "--host", "0.0.0.0"])
    'http://127.0.0.1:31000'
    """
    host = _flag_value(command, "--host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    port = _flag_value(command, "--port") or str(SGLANG_DEFAULT_PORT)
    if not port.isdigit():
        raise LaunchError(f"--port {port!r} in the server command is not a number")
    return f"http://{host}:{int(port)}"


def is_sglang_server(command: Sequence[str]) -> bool:
    return any("sglang.launch_server" in a for a in command) or (
        len(command) > 1 and os.path.basename(command[0]) == "sglang" and command[1] == "serve")


def server_command(command: Sequence[str]) -> list[str]:
    """The command with ``--enable-metrics`` added for an SGLang server that lacks it."""
    command = list(command)
    if is_sglang_server(command) and "--enable-metrics" not in command:
        command.append("--enable-metrics")
    return command


def child_env(base: Mapping[str, str], *, estimator_jsonl: Optional[str] = None) -> dict[str, str]:
    env = dict(base)
    env.setdefault("SGLANG_DSPARK_DEBUG_DUMP", DEBUG_DUMP_ALL)
    if estimator_jsonl:
        env["SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH"] = str(estimator_jsonl)
        env["SGLANG_DSPARK_FOLDED_PROPOSAL"] = "0"
    return env


def verify_mode(env: Mapping[str, str]) -> str:
    mode = env.get("SGLANG_RAGGED_VERIFY_MODE", "").strip() or "static"
    if mode not in MODES:
        raise LaunchError(f"SGLANG_RAGGED_VERIFY_MODE={mode!r} is not one of {', '.join(MODES)}; "
                          "set it in the collector's environment, e.g. SGLANG_RAGGED_VERIFY_MODE=compact")
    return mode


class ChildServer:
    """The running child: its process, exit future and shutdown."""

    def __init__(self, spec: LaunchSpec) -> None:
        if not spec.command:
            raise LaunchError("no server command after '--', e.g. "
                              "dspark-obs collect --out data -- python -m sglang.launch_server --port 30000 ...")
        self.spec = spec
        self.command = server_command(spec.command)
        self.env = child_env(spec.env, estimator_jsonl=spec.estimator_jsonl)
        self.mode = verify_mode(self.env)
        self.url = (spec.url or url_from_command(self.command)).rstrip("/")
        self.proc: Optional[subprocess.Popen] = None
        self.exit: Optional[asyncio.Future] = None
        self.signal_sent: Optional[str] = None
        self._log = None

    async def start(self) -> None:
        out = None
        if self.spec.log_path:
            self._log = open(self.spec.log_path, "ab")
            out = self._log
        try:
            self.proc = subprocess.Popen(self.command, env=self.env, stdout=out, stderr=out,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"cannot start {self.command[0]!r}: {exc}") from exc
        self.exit = asyncio.ensure_future(asyncio.to_thread(self.proc.wait))

    async def wait_healthy(self, stop: asyncio.Event) -> bool:
        """Poll ``/health`` until 200; False if ``stop`` was set first; LaunchError if the child died."""
        deadline = time.monotonic() + self.spec.startup_timeout
        async with httpx.AsyncClient(base_url=self.url, timeout=5.0) as client:
            while True:
                if self.exit.done():
                    raise LaunchError(f"the server exited with code {self.exit.result()} before {self.url}/health "
                                      "answered; see its output above (or --server-log)")
                if stop.is_set():
                    return False
                try:
                    if (await client.get("/health")).status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise LaunchError(f"{self.url}/health did not answer within {self.spec.startup_timeout:.0f}s; "
                                      "raise --startup-timeout or check --url / the command's --port")
                try:
                    await asyncio.wait_for(stop.wait(), timeout=0.25)
                except asyncio.TimeoutError:
                    pass

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    async def shutdown(self, sig: int = signal.SIGTERM) -> dict[str, str]:
        """Forward ``sig`` to the child's process group, wait, kill if needed; labels for the run."""
        labels: dict[str, str] = {"server_command": " ".join(self.command)[:2000]}
        if self.proc is None:
            return labels
        if not self.exit.done():
            self.signal_sent = signal.Signals(sig).name
            self._signal(sig)
            try:
                await asyncio.wait_for(asyncio.shield(self.exit), timeout=self.spec.shutdown_timeout)
            except asyncio.TimeoutError:
                self.signal_sent += "+SIGKILL"
                self._signal(signal.SIGKILL)
                await self.exit
            labels["server_stopped_by"] = self.signal_sent
        labels["server_exit_code"] = str(self.exit.result())
        if self._log is not None:
            self._log.close()
        return labels
