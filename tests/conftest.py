"""Shared fixtures: emulator servers and small collected stores."""

from __future__ import annotations

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
