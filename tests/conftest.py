"""Shared fixtures: emulator servers and small collected stores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_obs.emulator.engine import Engine, EngineConfig, GenerateRequest
from dspark_obs.emulator.server import BackgroundServer

WORKLOADS = ["gsm8k", "arena-hard", "poetry"]


def run_engine(mode: str, *, n: int = 30, temperature: float = 0.0, seed: int = 1, conc: int = 12,
               **cfg) -> tuple[Engine, dict[str, dict]]:
    """Drive an in-process engine closed-loop; return it and results by rid."""
    eng = Engine(EngineConfig(mode=mode, seed=seed, **cfg))
    pending = [(f"{WORKLOADS[i % 3]}-{i:06d}", i) for i in range(n)]
    futs, results = {}, {}
    while pending or futs:
        while pending and len(futs) < conc:
            rid, i = pending.pop(0)
            futs[rid] = eng.submit(GenerateRequest(
                rid=rid, text=f"[{WORKLOADS[i % 3]}] request {i}", temperature=temperature,
                max_new_tokens=120, sampling_seed=1000 + i, return_logprob=True, top_logprobs_num=5))
        eng.step()
        for rid in [r for r, f in futs.items() if f.done()]:
            results[rid] = futs.pop(rid).result()
    return eng, results


@pytest.fixture
def emulator():
    """Factory: start an emulator HTTP server in this process; stopped after the test."""
    servers = []

    def start(**cfg) -> BackgroundServer:
        port = cfg.pop("port", 0)
        hooks = cfg.pop("test_hooks", False)
        srv = BackgroundServer(EngineConfig(**cfg), port=port, test_hooks=hooks).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


@pytest.fixture(scope="session")
def s3_endpoint():
    """``host:port`` of a local S3-compatible server (moto) on 127.0.0.1, in its own process
    (``tests/s3_server.py``).  The credentials are set in the environment (processes started later
    inherit them)."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("s3_server.py"))], stdout=subprocess.PIPE,
                            text=True)
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        pytest.fail(f"the local S3 server did not start (exit {proc.wait()})")
    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
