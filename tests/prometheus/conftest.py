"""Prometheus tier: a real Prometheus (Debian's ``prometheus``) scrapes the sidecar during emulator runs.

Run by ``make test-prometheus`` (which installs the package)::

    python -m pytest tests/prometheus -p no:cacheprovider -o python_files='prometheus_*.py'

The test files are named ``prometheus_*.py`` so the main run never collects
them; this conftest is imported there too and only defines fixtures.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _quoted(targets: list[str]) -> str:
    return ", ".join(f"'{t}'" for t in targets)


class Prometheus:
    """A Prometheus server on 127.0.0.1 with its own config and TSDB directory; stopped by the fixture."""

    def __init__(self, workdir: Path, *, sidecars: list[str], servers: list[str], rules: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("the prometheus binary is missing: `make test-prometheus` installs Debian's prometheus "
                        "package (apt-get install -y prometheus)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {rules}\n"
            "scrape_configs:\n"
            f"  - job_name: dspark-obs\n    static_configs:\n      - targets: [{_quoted(sidecars)}]\n"
            f"  - job_name: sglang\n    static_configs:\n      - targets: [{_quoted(servers)}]\n")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus did not become ready on {self.url}")

    def query(self, expr: str) -> list[dict]:
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        body = resp.json()
        assert body.get("status") == "success", (expr, body)
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
