"""How figures read as text: values, intervals, limits and verdicts (shared by Markdown and HTML).

>>> fmt_value(0.031234, "fraction"), fmt_value(4.04, "tokens"), fmt_value(3.0, "count")
('0.031', '4.04', '3')
>>> fmt_ci(0.02, 0.05, "fraction")
'[0.020, 0.050]'
"""

from __future__ import annotations

import math

from dspark_obs.report.metrics import info
from dspark_obs.report.model import Figure

__all__ = ["fmt_value", "fmt_ci", "fmt_limit", "fmt_drift", "fmt_p", "where", "VERDICT_WORDS"]

VERDICT_WORDS = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "info": "info", "insufficient": "too few",
                 "improved": "improved", "none": "-", "no_baseline": "no baseline", "not_tested": "-"}


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def fmt_value(x, unit: str) -> str:
    if not _ok(x):
        return "-"
    if unit == "count":
        return f"{x:.0f}"
    if unit in ("tokens", "drafts"):
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_ci(lo, hi, unit: str) -> str:
    if not (_ok(lo) and _ok(hi)):
        return ""
    return f"[{fmt_value(lo, unit)}, {fmt_value(hi, unit)}]"


def fmt_limit(fig: Figure) -> str:
    """``<= 0.05`` / ``>= 0.85`` / '' for the figure's threshold."""
    t = fig.threshold
    if t is None or t.kind is None:
        return ""
    return f"{'<=' if t.kind == 'max' else '>='} {t.limit:g}" + (" (CI)" if t.basis == "ci" else "")


def fmt_p(p) -> str:
    if not _ok(p):
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_drift(fig: Figure) -> str:
    """``+0.031 (q=0.002) FAIL`` or the drift verdict's word."""
    d = fig.drift
    if d is None or d.verdict in ("not_tested",):
        return "-"
    if d.verdict in ("no_baseline", "insufficient") or d.delta is None:
        return VERDICT_WORDS.get(d.verdict, d.verdict)
    unit = info(fig.metric).unit
    delta = f"{d.delta:+.3f}" if unit not in ("tokens", "drafts", "count") else f"{d.delta:+.2f}"
    return f"{delta} (q={fmt_p(d.q_value)}) {VERDICT_WORDS.get(d.verdict, d.verdict)}"


def where(fig: Figure) -> str:
    """``*/k3`` or ``poetry`` or ``run`` — the figure's place below its run."""
    parts = [p for p in (fig.workload, f"k{fig.position}" if fig.position is not None else None) if p]
    return "/".join(parts) or "run"
