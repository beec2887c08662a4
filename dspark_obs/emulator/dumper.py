"""SGLang's DSpark info dumper, with its exact bookkeeping.

Mirrors ``DsparkInfoDumper``: a step is observed, held as *pending* until the
next step (its device results drain then), and only then appended to a bounded
deque.  ``dump()`` drains the pending step first; ``clear()`` drops the deque
*and* the pending step, which is why every clear loses about one
``forward_ct``.  ``step_cpu_ms`` is the clock gap between consecutive decode
steps, absent after a clear, after a non-decode batch, or past one second.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional

from dspark_obs.records import INFO_DUMP_MAX_RECORDS, INFO_DUMP_MAX_STEP_CPU_SECONDS

ALL_COMPONENTS = frozenset(
    {"core", "step_cpu_time", "step_gpu_time", "draft_gpu_time", "target_verify_gpu_time", "reqs"}
)
_CORE_FIELDS = (
    "bs", "mode", "budget", "lag_steps", "num_running_reqs", "num_verify_tokens",
    "verify_tokens_local", "verify_tokens_dp_synced", "verify_tokens_graph_key",
    "predicted_step_ms", "predicted_theta",
)
_DEFAULTS: dict[str, Any] = {
    "bs": -1, "mode": "", "budget": None, "lag_steps": None, "num_running_reqs": -1,
    "num_verify_tokens": -1, "verify_tokens_local": -1, "verify_tokens_dp_synced": -1,
    "verify_tokens_graph_key": -1, "predicted_step_ms": None, "predicted_theta": None,
    "step_cpu_ms": None, "step_gpu_ms": None, "draft_gpu_ms": None,
    "target_verify_gpu_ms": None, "reqs": None,
}
_TIMER_COMPONENT = {
    "step_gpu_ms": "step_gpu_time",
    "draft_gpu_ms": "draft_gpu_time",
    "target_verify_gpu_ms": "target_verify_gpu_time",
}


class InfoDumper:
    """Collects decode-step records the way one SGLang DP rank does."""

    def __init__(self, *, gamma: int, mode: str, components: frozenset[str] = ALL_COMPONENTS,
                 max_records: int = INFO_DUMP_MAX_RECORDS, clock: Callable[[], float],
                 track_produced: bool = False) -> None:
        unknown = set(components) - ALL_COMPONENTS
        if unknown:
            raise ValueError(
                f"unknown SGLANG_DSPARK_DEBUG_DUMP components {sorted(unknown)}; "
                f"valid: {sorted(ALL_COMPONENTS)} or 'all'"
            )
        self.gamma = gamma
        self.mode = mode
        self.components = frozenset(components)
        self._clock = clock
        self._records: deque[dict] = deque(maxlen=max_records)
        self._pending: Optional[dict] = None
        self._prev_stamp: Optional[float] = None
        self.records_produced = 0  # ever appended (for tests and the emulator's own stats)
        # (forward_ct, rids) of every record ever appended, when tracking: the
        # ground truth a collector's output is checked against.
        self.produced: Optional[list[tuple[int, tuple]]] = [] if track_produced else None

    @property
    def enabled(self) -> bool:
        return bool(self.components)

    def observe_decode_step(self, step: dict[str, Any]) -> None:
        """``step`` holds every field of a record; the dumper keeps what components allow."""
        if not self.enabled:
            return
        now = self._clock()
        step_cpu_ms = None
        if self._prev_stamp is not None:
            gap = now - self._prev_stamp
            if 0.0 < gap <= INFO_DUMP_MAX_STEP_CPU_SECONDS:
                step_cpu_ms = round(gap * 1000.0, 4)
        self._drain_pending()
        self._pending = {**step, "step_cpu_ms": step_cpu_ms}
        self._prev_stamp = now

    def note_non_decode_step(self) -> None:
        if not self.enabled:
            return
        self._drain_pending()
        self._prev_stamp = None

    def clear(self) -> None:
        self._records.clear()
        self._pending = None
        self._prev_stamp = None

    def dump(self) -> Optional[dict]:
        if not self.enabled:
            return None
        self._drain_pending()
        return {
            "mode": self.mode,
            "gamma": self.gamma,
            "verify_num_draft_tokens": self.gamma + 1,
            "components": sorted(self.components),
            "records": list(self._records),
            "simulate_acc_len": None,
        }

    def _drain_pending(self) -> None:
        step, self._pending = self._pending, None
        if step is None:
            return
        record: dict[str, Any] = {"forward_ct": step["forward_ct"]}
        if "core" in self.components:
            for name in _CORE_FIELDS:
                record[name] = step.get(name)
        if "step_cpu_time" in self.components:
            record["step_cpu_ms"] = step["step_cpu_ms"]
        for name, component in _TIMER_COMPONENT.items():
            if component in self.components:
                record[name] = step.get(name)
        if "reqs" in self.components:
            record["reqs"] = step.get("reqs")
        # omit_defaults=True: a field equal to its default is not sent.
        self._records.append({k: v for k, v in record.items()
                              if k == "forward_ct" or v != _DEFAULTS[k] or
                              (v is not None and _DEFAULTS[k] is None)})
        self.records_produced += 1
        if self.produced is not None:
            self.produced.append((step["forward_ct"], tuple(q.get("rid") for q in step.get("reqs") or ())))
