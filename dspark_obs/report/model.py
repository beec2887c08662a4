"""What a report is made of: figures with intervals, their threshold and drift verdicts.

A :class:`Figure` is one number the report judges (the ECE at position 3 of
all workloads of a run, the utilisation of poetry, ...).  Sections build
figures with a :class:`Drift` holding the comparison with the baseline;
:mod:`dspark_obs.report.gates` then fills in :class:`ThresholdVerdict`, the
drift verdict and the combined verdict.  :meth:`Figure.to_json` is the figure's
shape in ``summary.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dspark_obs.report.metrics import info

__all__ = ["Figure", "Drift", "ThresholdVerdict", "VERDICTS", "DRIFT_VERDICTS", "THRESHOLD_VERDICTS", "clean"]

THRESHOLD_VERDICTS = ("pass", "fail", "warn", "insufficient", "none")
DRIFT_VERDICTS = ("pass", "improved", "warn", "fail", "no_baseline", "not_tested", "insufficient")
VERDICTS = ("pass", "warn", "fail", "info", "insufficient")


def clean(x: Any) -> Any:
    """None for NaN/inf and numpy scalars as Python numbers (JSON-safe)."""
    if x is None:
        return None
    if hasattr(x, "item") and not isinstance(x, (list, dict, str)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclass
class Drift:
    """The figure against the baseline: the test's inputs and outcome (verdict set by the gates)."""

    test: str
    baseline_runs: list[str]
    baseline_value: float | None = None
    baseline_ci: tuple[float | None, float | None] = (None, None)
    baseline_n: int | None = None
    delta: float | None = None
    delta_ci: tuple[float | None, float | None] = (None, None)
    p_value: float | None = None
    q_value: float | None = None
    min_delta: float | None = None
    verdict: str = "not_tested"
    note: str = ""

    def to_json(self) -> dict:
        return {"test": self.test, "baseline_runs": list(self.baseline_runs),
                "baseline_value": clean(self.baseline_value),
                "baseline_ci": {"low": clean(self.baseline_ci[0]), "high": clean(self.baseline_ci[1])},
                "baseline_n": clean(self.baseline_n), "delta": clean(self.delta),
                "delta_ci": {"low": clean(self.delta_ci[0]), "high": clean(self.delta_ci[1])},
                "p_value": clean(self.p_value), "q_value": clean(self.q_value),
                "min_delta": clean(self.min_delta), "verdict": self.verdict, "note": self.note}


@dataclass
class ThresholdVerdict:
    kind: str | None  # max | min | None (no limit)
    limit: float | None
    basis: str
    gate: str  # fail | warn | off: what a breach does for this row
    in_scope: bool
    compared: float | None  # the number held to the limit (value, or the CI end with basis "ci")
    verdict: str
    min_n: int = 0

    def to_json(self) -> dict:
        return {"kind": self.kind, "limit": clean(self.limit), "basis": self.basis, "gate": self.gate,
                "in_scope": self.in_scope, "compared": clean(self.compared), "min_n": self.min_n,
                "verdict": self.verdict}


@dataclass
class Figure:
    """One judged number of one run (see the module docstring)."""

    metric: str
    run_id: str
    value: float | None
    workload: str | None = None  # '*' = all workloads; None = a per-run figure
    position: int | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_method: str | None = None
    n: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    drift: Drift | None = None
    threshold: ThresholdVerdict | None = None
    verdict: str = "info"

    @property
    def section(self) -> str:
        return info(self.metric).section

    @property
    def key(self) -> str:
        """``metric/run/workload/k`` — unique within a report."""
        parts = [self.metric, self.run_id]
        if self.workload is not None:
            parts.append(self.workload)
        if self.position is not None:
            parts.append(f"k{self.position}")
        return "/".join(parts)

    @property
    def label(self) -> str:
        """Where the figure belongs, for messages: ``run */k3`` or ``run poetry`` or ``run``."""
        where = [w for w in (self.workload, f"k{self.position}" if self.position is not None else None) if w]
        return self.run_id + (" " + "/".join(where) if where else "")

    def to_json(self) -> dict:
        m = info(self.metric)
        return {
            "id": self.key, "section": m.section, "metric": self.metric, "title": m.title,
            "run_id": self.run_id, "workload": self.workload, "position": self.position,
            "value": clean(self.value), "unit": m.unit, "better": m.better,
            "ci": {"low": clean(self.ci_low), "high": clean(self.ci_high), "level": 0.95, "method": self.ci_method},
            "n": clean(self.n), "detail": {k: clean(v) for k, v in self.detail.items()},
            "threshold": self.threshold.to_json() if self.threshold else None,
            "drift": self.drift.to_json() if self.drift else None,
            "verdict": self.verdict,
        }
