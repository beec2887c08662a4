"""The emulator's records are SGLang's records: decoded and re-encoded by SGLang's own structs.

The engine runs in this (SGLang) virtual environment; every record of every mode
must convert to SGLang's ``DecodeStepRecord`` (with ``ReqDetail`` entries) and
encode back to the same JSON bytes, once the emulator-only truth fields
(``emu_*``, which a real server never sends) are set aside.  The payload around
them must carry the keys SGLang's ``DsparkInfoDumper.dump`` produces.  And the
emulator's own budgets and windows must be the ones SGLang's planner computes
from the logged confidences.
"""

from __future__ import annotations

import msgspec
import pytest
import torch
from sglang.kernels.ops.speculative.dspark import dspark_schedule as sg_schedule
from sglang.srt.speculative.dspark_components import dspark_observability as sg_obs
from sglang.srt.speculative.dspark_components import dspark_planner as sg_planner
from sglang.srt.speculative.dspark_components import dspark_sps as sg_sps

from dspark_obs.emulator.engine import Engine, EngineConfig, GenerateRequest

WORKLOADS = ("gsm8k", "arena-hard", "poetry")
PAYLOAD_KEYS = {"mode", "gamma", "verify_num_draft_tokens", "components", "records", "simulate_acc_len"}


def _run(mode: str, *, dp_size: int = 1, temperature: float = 0.7, n: int = 18) -> Engine:
    eng = Engine(EngineConfig(mode=mode, seed=11, dp_size=dp_size))
    for i in range(n):
        eng.submit(GenerateRequest(rid=f"{WORKLOADS[i % 3]}-{i:06d}", text=f"[{WORKLOADS[i % 3]}] q {i}",
                                   temperature=temperature, max_new_tokens=60, sampling_seed=i))
    eng.run_until_idle()
    return eng


def _strip_truth(record: dict) -> dict:
    out = dict(record)
    if out.get("reqs") is not None:
        out["reqs"] = [{k: v for k, v in q.items() if not k.startswith("emu_")} for q in out["reqs"]]
    return out


@pytest.mark.parametrize("mode", ["static", "compact", "cap-accept"])
@pytest.mark.parametrize("dp_size", [1, 2])
def test_emulator_records_round_trip_through_sglangs_structs(mode, dp_size):
    eng = _run(mode, dp_size=dp_size)
    payloads = eng.dump()
    assert len(payloads) == dp_size
    total = 0
    for payload in payloads:
        assert set(payload) == PAYLOAD_KEYS
        for record in payload["records"]:
            ours = _strip_truth(record)
            theirs = msgspec.convert(ours, sg_obs.DecodeStepRecord)
            assert msgspec.json.encode(theirs) == msgspec.json.encode(ours)
            total += 1
    assert total > 10


def test_emulator_budgets_and_windows_are_sglangs():
    """Re-plan every compact step with SGLang's planner functions from the logged confidences."""
    eng = _run("compact", temperature=0.0, n=24)
    cfg = sg_planner.DSparkScheduleConfig(gamma=eng.cfg.gamma)
    table = sg_sps.SpsAdditiveCostTable(**msgspec.structs.asdict(eng.cfg.sps_table))
    records = eng.dump()[0]["records"]
    for j, rec in enumerate(records):
        conf = torch.tensor([q["confidence"] for q in rec["reqs"]], dtype=torch.float32)
        lagged = {}
        if j >= eng.cfg.lag_steps:
            old = records[j - eng.cfg.lag_steps]["reqs"]
            lagged = {q["rid"]: sg_schedule.compute_sort_survival(
                torch.tensor([q["confidence"]], dtype=torch.float32))[0] for q in old}
        hist = torch.stack([lagged.get(q["rid"], torch.ones(eng.cfg.gamma)) for q in rec["reqs"]])
        decision = sg_planner.compute_verify_token_budget(history_survival_probs=hist, sps_table=table, cfg=cfg)
        assert decision.budget == rec["budget"], j
        assert decision.predicted_step_seconds * 1e3 == pytest.approx(rec["predicted_step_ms"], rel=1e-9)
        lens = sg_schedule.schedule_verify_lens_topk(confidence=conf, budget=decision.budget, cfg=cfg)
        assert lens.tolist() == [q["verify_len"] for q in rec["reqs"]], j
        surv = sg_schedule.compute_sort_survival(conf)
        assert [[round(float(s), 4) for s in row] for row in surv] == [q["survival"] for q in rec["reqs"]]
