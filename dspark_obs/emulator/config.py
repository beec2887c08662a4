"""The emulator's configuration, a request to it and a request in flight: what ``dspark-obs emulate`` and the tests set up.

Apart from the engine (:mod:`dspark_obs.emulator.engine`) so the server, the CLI and the
real-model engine share one declaration of every option and its check.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any, Optional

from dspark_obs import costtable as ct
from dspark_obs.emulator.dumper import ALL_COMPONENTS
from dspark_obs.emulator import model
from dspark_obs.emulator.methods import check_force_budget_frac
from dspark_obs.emulator.sglang_fields import SpecCounters
from dspark_obs.emulator.streams import StreamKey

MODES = ("static", "compact", "cap-accept")
# Over-confident deeper in the block, as raw DSpark heads are (ECE of a few %).
DEFAULT_HEAD_TEMPERATURE = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.7, 0.7)


def default_capture_tiers(max_tokens: int) -> list[int]:
    """CUDA-graph token tiers a ragged compact verify rounds up to."""
    tiers = list(range(8, 65, 8)) + list(range(96, 513, 32)) + list(range(576, max(max_tokens, 576) + 64, 64))
    return tiers


@dataclass
class EngineConfig:
    mode: str = "compact"
    gamma: int = 6
    seed: int = 0
    dp_size: int = 1
    max_running_requests: int = 256
    max_records: int = 200_000
    lag_steps: int = 2
    components: frozenset[str] = ALL_COMPONENTS
    # The table the scheduler plans with (SGLang: --speculative-dspark-sps-table-path);
    # None = SGLang's uninitialised flat table, which verifies the full window.
    sps_table: Optional[ct.CostTable] = field(default_factory=ct.default_additive_table)
    # What the server args report as speculative_dspark_sps_table_path (the file the table came from).
    sps_table_path: Optional[str] = None
    # The hardware's true step-time model, and a context-length term on top of it.
    true_cost: ct.SpsAdditiveCostTable = field(default_factory=ct.default_additive_table)
    context_seconds_per_token: float = 2.0e-9
    step_noise: float = 0.02
    host_overhead_seconds: float = 0.0004
    head_temperature: tuple[float, ...] = DEFAULT_HEAD_TEMPERATURE
    sts_temperatures: Optional[tuple[float, ...]] = None
    # A logit bias of the head per position (0 = none; < 0 under-confident), applied before STS.
    head_bias: tuple[float, ...] = (0.0,)
    expose_truth: bool = True
    track_produced: bool = False  # keep every produced record's key (tests)
    real_time: float = 0.0  # 0 = virtual clock; 1 = sleep each step's time
    # Closed-loop determinism (see Engine._await_closed_loop_refill); 0 = off.
    lockstep_concurrency: int = 0
    lockstep_wait_s: float = 0.25
    # SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH; rows are written only with
    # folded_proposal False (SGLANG_DSPARK_FOLDED_PROPOSAL=0), as in SGLang.
    estimate_path: Optional[str] = None
    folded_proposal: bool = True
    # The server's --log-requests --log-requests-format json --log-requests-level 3, written to this file
    # (SGLang: --log-requests-target); None = off.
    request_log_path: Optional[str] = None
    # SGLang's /set_internal_state dspark_force_budget_frac: the budget is this share of
    # bs * gamma instead of the planner's k* (1.0 = no trimming through the ragged path).
    force_budget_frac: Optional[float] = None
    # False: a target without speculation (one token per request per step, no DSpark records).
    speculative: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)} "
                             "(SGLANG_RAGGED_VERIFY_MODE)")
        if self.gamma < 1 or self.dp_size < 1:
            raise ValueError(f"gamma and dp_size must be >= 1, got {self.gamma}, {self.dp_size}")
        if len(self.head_temperature) < self.gamma:
            self.head_temperature = tuple(self.head_temperature) + (self.head_temperature[-1],) * (
                self.gamma - len(self.head_temperature))
        if len(self.head_bias) < self.gamma:
            self.head_bias = tuple(self.head_bias) + (self.head_bias[-1],) * (self.gamma - len(self.head_bias))
        check_force_budget_frac(self.force_budget_frac)


@dataclass
class GenerateRequest:
    rid: str
    text: Optional[str] = None
    input_ids: Optional[list[int]] = None
    temperature: float = 1.0
    max_new_tokens: int = 128
    sampling_seed: Optional[int] = None
    return_logprob: bool = False
    top_logprobs_num: int = 0


@dataclass
class RunningRequest(SpecCounters):
    """A request in flight on a rank: its target track, output so far and SGLang's per-request counters."""

    req: GenerateRequest
    input_ids: list[int]
    track: model.TargetTrack
    draft_key: tuple[int, ...]
    end: int  # output length at which the request finishes
    finish_reason: dict[str, Any]
    pool_index: int
    submitted_clock: float
    future: concurrent.futures.Future
    output: list[int] = field(default_factory=list)
    first_token_clock: Optional[float] = None  # the rank clock when prefill produced the first token
    # draft_key's SeedSequence, premixed once (model.draft_blocks mixes in the anchor position).
    stream_key: Optional[StreamKey] = None
