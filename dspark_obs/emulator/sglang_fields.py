"""What the emulator's engines hand out in SGLang's formats: the tokenizer, a decode step's record
fields and a finished request's ``spec_*`` meta info (both engines fill them the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dspark_obs.emulator import model

def tokenize(text: str) -> list[int]:
    """The emulator's tokenizer: one id per whitespace-separated word."""
    span = model.VOCAB_SIZE - model.FIRST_WORD_ID
    return [model.FIRST_WORD_ID + model.stable_hash(w) % span for w in text.split()] or [model.FIRST_WORD_ID]


def detokenize(ids: list[int]) -> str:
    return "".join(f" w{t}" for t in ids if t != model.EOS_TOKEN_ID)


def bump_histogram(hist: list[int], i: int) -> None:
    """Count one more ``i`` in a histogram list, growing it as needed (``spec_*_histogram``)."""
    if len(hist) <= i:
        hist.extend([0] * (i + 1 - len(hist)))
    hist[i] += 1


@dataclass(kw_only=True)
class SpecCounters:
    """A request's speculative counters, kept as SGLang keeps them for ``meta_info``'s ``spec_*`` fields.

    Both engines' running requests extend it (keyword-only, so their own fields come first).
    """

    verify_ct: int = 0
    correct_drafts: int = 0
    correct_hist: list[int] = field(default_factory=list)
    cap_tokens: int = 0
    cap_hist: list[int] = field(default_factory=list)
    block_accept_tokens: int = 0

    def count_verify(self, correct: int, window: int, *, sent: bool, cap_accept: bool, cap_trim: int) -> None:
        """One verify of ``window`` drafts that accepted ``correct``; ``sent``: the window was a cap."""
        self.verify_ct += 1
        self.correct_drafts += correct
        bump_histogram(self.correct_hist, correct)
        if sent:
            self.cap_tokens += window + 1
            bump_histogram(self.cap_hist, window + 1)
        if cap_accept:
            self.block_accept_tokens += correct + 1 + cap_trim


def decode_step_record(rank: Any, *, bs: int, decision: Any, num_verify_tokens: int, step_s: float,
                       draft_s: float, reqs: list[dict]) -> dict[str, Any]:
    """One decode step's ``DecodeStepRecord`` fields, as SGLang's dumper fills them (both engines).

    ``decision`` is the step's budget decision (None in static mode); ``step_s``
    and ``draft_s`` the step's and the drafter's seconds.
    """
    cfg = rank.engine.cfg
    budget = None if decision is None else decision.budget
    return {
        "forward_ct": rank.forward_ct, "bs": bs, "mode": cfg.mode, "budget": budget,
        "lag_steps": None if cfg.mode == "static" else cfg.lag_steps,
        "num_running_reqs": bs, "num_verify_tokens": num_verify_tokens,
        "verify_tokens_local": -1 if budget is None else min(bs + budget, bs * (cfg.gamma + 1)),
        "verify_tokens_dp_synced": -1, "verify_tokens_graph_key": num_verify_tokens,
        "predicted_step_ms": None if decision is None or decision.predicted_step_seconds is None
        else decision.predicted_step_seconds * 1e3,
        "predicted_theta": None if decision is None else decision.predicted_theta,
        "step_gpu_ms": round(step_s * 1e3, 4), "draft_gpu_ms": round(draft_s * 1e3, 4),
        "target_verify_gpu_ms": round(max(step_s - draft_s, 0.0) * 1e3, 4), "reqs": reqs,
    }


def spec_meta_info(r: SpecCounters, *, gamma: int, mode: str, completion: int) -> dict[str, Any]:
    """A finished request's ``spec_*`` fields of ``meta_info``, as SGLang sends them (only when it verified).

    ``r`` holds the request's counters (both engines' running requests are :class:`SpecCounters`).
    """
    if r.verify_ct <= 0:
        return {}
    proposed = r.verify_ct * gamma
    meta: dict[str, Any] = dict(spec_accept_rate=r.correct_drafts / proposed,
                                spec_accept_length=completion / r.verify_ct,
                                spec_num_correct_drafts=r.correct_drafts, spec_num_proposed_drafts=proposed,
                                spec_verify_ct=r.verify_ct)
    if r.cap_tokens > 0:
        meta["spec_cap_length"] = r.cap_tokens / r.verify_ct
    if mode == "cap-accept":
        meta["spec_block_accept_length"] = r.block_accept_tokens / r.verify_ct
    if r.correct_hist:
        meta["spec_correct_drafts_histogram"] = r.correct_hist
    if r.cap_hist:
        meta["spec_cap_lens_histogram"] = r.cap_hist
    return meta


def round6(values: np.ndarray) -> list[float]:
    """``[round(float(v), 6) for v in values]``, vectorised where that is provably the same.

    ``rint(v * 1e6) / 1e6`` is the correctly rounded result unless ``v * 1e6`` lies
    within rounding error of a half; those few values go through ``round``.
    """
    scaled = values * 1e6
    out = (np.rint(scaled) / 1e6).tolist()
    for i in np.flatnonzero(np.abs(scaled - np.floor(scaled) - 0.5) < 1e-6).tolist():
        out[i] = round(float(values[i]), 6)
    return out
