"""DSpark cost tables in SGLang's JSON formats, with vectorised lookups.

Two kinds, as ``--speculative-dspark-sps-table-path`` accepts them:

* ``SpsCostTable`` (1-D): steps per second at a number of batch tokens, looked
  up at the floor probe (SGLang's ``floor_probe_index``).
* ``SpsAdditiveCostTable``: ``T(bs, K) = bias + alpha(bs) + theta(M)``,
  ``M = bs + K``, both terms linearly interpolated and clamped to the probes.

Field names and validation follow ``dspark_sps.py`` so files round-trip
through SGLang's own ``load_sps_table_from_path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

import msgspec
import numpy as np


class SpsCostTable(msgspec.Struct, frozen=True):
    """1-D table: ``sample_steps_per_sec`` measured at ``sample_batch_tokens``."""

    sample_batch_tokens: list[int]
    sample_steps_per_sec: list[float]
    max_batch_tokens: int

    def __post_init__(self) -> None:
        if not self.sample_batch_tokens:
            raise ValueError("SpsCostTable needs at least one probe in sample_batch_tokens.")
        if self.sample_batch_tokens != sorted(set(self.sample_batch_tokens)):
            raise ValueError(
                f"sample_batch_tokens must be strictly increasing, got {self.sample_batch_tokens}."
            )
        if len(self.sample_batch_tokens) != len(self.sample_steps_per_sec):
            raise ValueError(
                "sample_batch_tokens and sample_steps_per_sec must have equal length, got "
                f"{len(self.sample_batch_tokens)} vs {len(self.sample_steps_per_sec)}."
            )
        if self.max_batch_tokens < self.sample_batch_tokens[-1]:
            raise ValueError(
                f"max_batch_tokens must be >= the largest probe, got {self.max_batch_tokens}"
                f" < {self.sample_batch_tokens[-1]}."
            )

    def steps_per_sec(self, batch_tokens: np.ndarray) -> np.ndarray:
        """Steps/s at each batch-token count (floor probe, clamped)."""
        probes = np.asarray(self.sample_batch_tokens, dtype=np.int64)
        sps = np.asarray(self.sample_steps_per_sec, dtype=np.float64)
        idx = np.searchsorted(probes, np.asarray(batch_tokens, dtype=np.int64), side="right") - 1
        return sps[np.clip(idx, 0, probes.size - 1)]

    def step_seconds(self, *, num_reqs: int, budget: np.ndarray) -> np.ndarray:
        sps = self.steps_per_sec(num_reqs + np.asarray(budget))
        return 1.0 / sps


class SpsAdditiveCostTable(msgspec.Struct, frozen=True):
    """Additive table: ``bias_seconds + alpha(bs) + theta(bs + K)``."""

    bias_seconds: float
    bs_probes: list[int]
    alpha_seconds: list[float]
    m_probes: list[int]
    theta_seconds: list[float]

    def __post_init__(self) -> None:
        for name, probes, values in (
            ("bs", self.bs_probes, self.alpha_seconds),
            ("m", self.m_probes, self.theta_seconds),
        ):
            if not probes:
                raise ValueError(f"SpsAdditiveCostTable needs {name}_probes.")
            if probes != sorted(set(probes)):
                raise ValueError(f"{name}_probes must be strictly increasing, got {probes}.")
            if len(probes) != len(values):
                raise ValueError(
                    f"{name}_probes and its values must have equal length, got "
                    f"{len(probes)} vs {len(values)}."
                )
        if self.bias_seconds <= 0:
            raise ValueError(f"bias_seconds must be > 0, got {self.bias_seconds}.")

    def alpha(self, bs: np.ndarray | float) -> np.ndarray:
        return np.interp(np.asarray(bs, dtype=np.float64), self.bs_probes, self.alpha_seconds)

    def theta(self, m: np.ndarray | float) -> np.ndarray:
        return np.interp(np.asarray(m, dtype=np.float64), self.m_probes, self.theta_seconds)

    def step_seconds(self, *, num_reqs: int | np.ndarray, budget: np.ndarray | int) -> np.ndarray:
        """``T(bs, K)`` in seconds; ``budget`` is K, the verify tokens above one per request."""
        num_reqs = np.asarray(num_reqs, dtype=np.float64)
        return self.bias_seconds + self.alpha(num_reqs) + self.theta(num_reqs + np.asarray(budget))


CostTable = Union[SpsCostTable, SpsAdditiveCostTable]


def uninitialized_table(*, max_batch_tokens: int) -> SpsCostTable:
    """SGLang's flat placeholder when no table is given: verify the full window."""
    return SpsCostTable(sample_batch_tokens=[1], sample_steps_per_sec=[1.0],
                        max_batch_tokens=max_batch_tokens)


def is_uninitialized(table: CostTable) -> bool:
    return isinstance(table, SpsCostTable) and len(table.sample_batch_tokens) <= 1


def to_json(table: CostTable) -> str:
    return msgspec.json.encode(table).decode()


def from_json(text: str | bytes) -> CostTable:
    """Decode either kind, the way SGLang's ``load_sps_table_from_path`` tells them apart (``"bias_seconds"``
    in the text); a malformed table is a ValueError naming the kind tried, its fields and the problem.

    >>> from_json('{"sample_batch_tokens": [8, 4], "sample_steps_per_sec": [9, 9], "max_batch_tokens": 8}')
    Traceback (most recent call last):
    ...
    ValueError: not an SGLang DSpark cost table (1-D: {sample_batch_tokens, sample_steps_per_sec, max_batch_tokens}; \
the additive kind has "bias_seconds"): sample_batch_tokens must be strictly increasing, got [8, 4].
    """
    raw = text.encode() if isinstance(text, str) else text
    additive = b'"bias_seconds"' in raw
    try:
        return msgspec.json.decode(raw, type=SpsAdditiveCostTable if additive else SpsCostTable)
    except msgspec.ValidationError as exc:
        kind = ("additive: {bias_seconds, bs_probes, alpha_seconds, m_probes, theta_seconds}" if additive else
                '1-D: {sample_batch_tokens, sample_steps_per_sec, max_batch_tokens}; the additive kind has '
                '"bias_seconds"')
        raise ValueError(f"not an SGLang DSpark cost table ({kind}): {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ValueError(f"not an SGLang DSpark cost table: not JSON: {exc}") from exc


def load(path: str | Path) -> CostTable:
    return from_json(Path(path).read_bytes())


def default_additive_table() -> SpsAdditiveCostTable:
    """A plausible H200-class table for a large MoE target at gamma 6.

    The emulator steps on it and the scheduler plans with it; its shape (a fixed
    launch cost, a mild per-request term and a per-token term that steepens past
    the compute knee) is what SGLang's profiler fits on real hardware.
    """
    return SpsAdditiveCostTable(
        bias_seconds=0.0080,
        bs_probes=[1, 8, 16, 32, 64, 128, 256],
        alpha_seconds=[0.0, 0.0004, 0.0008, 0.0016, 0.0032, 0.0064, 0.0128],
        m_probes=[1, 64, 128, 256, 512, 1024, 2048],
        theta_seconds=[0.0, 0.00275, 0.0055, 0.012, 0.028, 0.068, 0.160],
    )
