"""How a figure reads as text: value, interval, limit, drift and place (shared by ``summary.md`` and ``report.html``).

Both renderers work from the summary dict (what ``summary.json`` holds), so
these take a figure as a dict of that schema.

>>> fmt_value(0.031234, "fraction"), fmt_value(4.04, "tokens"), fmt_value(3.0, "count")
('0.031', '4.04', '3')
>>> f = {"value": 0.031, "unit": "fraction", "ci": {"low": 0.02, "high": 0.05}, "workload": "*", "position": 3,
...      "threshold": {"kind": "max", "limit": 0.05, "basis": "value", "in_scope": True, "gate": "fail"}}
>>> fmt_ci(f), fmt_limit(f), fmt_limit(f, symbols=True), where(f)
('[0.020, 0.050]', '<= 0.05', '≤ 0.05', '*/k3')
"""

from __future__ import annotations

import math

__all__ = ["fmt_value", "fmt_ci", "fmt_limit", "fmt_p", "fmt_delta", "where", "word", "run_line", "counts_line",
           "VERDICT_WORDS"]

VERDICT_WORDS = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "info": "info", "insufficient": "too few",
                 "improved": "improved", "none": "-", "no_baseline": "no baseline", "not_tested": "-"}


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def word(verdict: str) -> str:
    """The verdict as the tables print it (``fail`` -> ``FAIL``)."""
    return VERDICT_WORDS.get(verdict, verdict)


def fmt_value(x, unit: str) -> str:
    """Counts whole, token lengths to 2 places, rates and scores to 3; ``-`` when missing."""
    if not _ok(x):
        return "-"
    if unit == "count":
        return f"{x:.0f}"
    return f"{x:.2f}" if unit in ("tokens", "drafts") else f"{x:.3f}"


def fmt_ci(f: dict) -> str:
    """``[lo, hi]`` of the figure's 95% interval, or '' without one."""
    lo, hi = f["ci"]["low"], f["ci"]["high"]
    return f"[{fmt_value(lo, f['unit'])}, {fmt_value(hi, f['unit'])}]" if _ok(lo) and _ok(hi) else ""


def fmt_limit(f: dict, *, symbols: bool = False) -> str:
    """``<= 0.05`` (``≤`` with ``symbols``), marked ``(CI)`` when the interval is judged, and ``(warn only)``
    when the rule's scope only warns; ``-`` without a threshold."""
    t = f["threshold"]
    if not t or t["kind"] is None:
        return "-"
    sign = ("≤" if symbols else "<=") if t["kind"] == "max" else ("≥" if symbols else ">=")
    return (f"{sign} {t['limit']:g}" + (" (CI)" if t["basis"] == "ci" else "")
            + ("" if t["in_scope"] or t["gate"] == "off" else " (warn only)"))


def fmt_p(x) -> str:
    return "-" if not _ok(x) else ("<0.001" if x < 0.001 else f"{x:.3f}")


def fmt_delta(x, unit: str) -> str:
    """A signed change, to the figure's precision."""
    if not _ok(x):
        return "-"
    return f"{x:+.2f}" if unit in ("tokens", "drafts", "count") else f"{x:+.3f}"


def where(f: dict) -> str:
    """``*/k3``, ``poetry`` or ``run``: the figure's place below its run."""
    parts = [p for p in (f["workload"], f"k{f['position']}" if f["position"] is not None else None) if p]
    return "/".join(parts) or "run"


def run_line(r: dict) -> str:
    """``RUN (compact, gamma 6, 270 steps, ..., companion CAP, companion labels)``."""
    bits = [r["mode"] or "mode unknown", f"gamma {r['gamma']}" if r.get("gamma") else None,
            f"{r['steps']} steps", f"{r['request_steps']} request-steps", f"{r['requests']} requests",
            f"started {r['started_at']}" if r.get("started_at") else None,
            f"companion {r['companion']}" if r.get("companion") else None,
            f"{r['labels']} labels" if r.get("labels") else None]
    return f"{r['run_id']} (" + ", ".join(b for b in bits if b) + ")"


def counts_line(c: dict) -> str:
    return (f"{c['figures']} (pass {c['pass']}, warn {c['warn']}, fail {c['fail']}, info {c['info']}, "
            f"too few samples {c['insufficient']})")
