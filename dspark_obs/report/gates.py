"""Judge figures: threshold verdicts, drift verdicts (with the FDR adjustment), the report's status.

Threshold: a figure breaches its limit when the compared number (the value, or
with ``basis = "ci"`` the end of its CI nearest the limit) is past it; the
breach fails the report when the rule's ``gate`` is ``fail`` and the row is in
the rule's scope, and warns otherwise.  Fewer samples than ``min_n`` give
``insufficient``, never a failure.

Drift: every tested figure's p-value enters one Benjamini-Hochberg adjustment
(q-values, false discovery rate ``[drift].fdr``); a figure has drifted when its
q-value is at most the FDR *and* the change is at least ``drift_min_delta``.  A
drift for the worse fails (or warns, per ``drift``); one for the better is
``improved``.

>>> from dspark_obs.report.model import Figure
>>> from dspark_obs.report.thresholds import load_thresholds
>>> figs = [Figure("debiased_ece", "r", 0.09, workload="*", position=1, n=1000)]
>>> outcome = judge(figs, load_thresholds())
>>> outcome.status, figs[0].threshold.verdict, outcome.failing_line()
('fail', 'fail', 'debiased_ece > 0.05 at r */k1')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dspark_obs.report.metrics import info
from dspark_obs.report.model import Figure, ThresholdVerdict
from dspark_obs.report.stats import benjamini_hochberg
from dspark_obs.report.thresholds import Thresholds

__all__ = ["Outcome", "judge", "threshold_verdict"]


@dataclass
class Outcome:
    """The report's status and what failed (``failures``: (figure, 'threshold' | 'drift'))."""

    status: str
    failures: list[tuple[Figure, str]] = field(default_factory=list)
    warnings: list[tuple[Figure, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "fail" else 0

    @property
    def failing_metrics(self) -> list[str]:
        """``metric`` for threshold failures, ``drift:metric`` for drift failures; unique, in order."""
        return list(dict.fromkeys(f.metric if kind == "threshold" else f"drift:{f.metric}"
                                  for f, kind in self.failures))

    def failing_line(self, *, max_places: int = 6) -> str:
        """One line naming every failing metric and where it failed (for stderr)."""
        groups: dict[tuple[str, str], list[Figure]] = {}
        for fig, kind in self.failures:
            groups.setdefault((kind, fig.metric), []).append(fig)
        parts = []
        for (kind, metric), figs in groups.items():
            places = [f.label for f in figs]
            shown = _compact(places[:max_places]) + (f" (+{len(places) - max_places} more)"
                                                     if len(places) > max_places else "")
            if kind == "threshold":
                t = figs[0].threshold
                op = ">" if t.kind == "max" else "<"
                parts.append(f"{metric} {op} {t.limit:g} at {shown}")
            else:
                worse = "up" if info(metric).better == "lower" else "down"
                parts.append(f"{metric} drifted {worse} vs baseline at {shown}")
        return "; ".join(parts)


def _compact(labels: list[str]) -> str:
    """``r */k1, r */k2`` -> ``r */k1, */k2`` (the run is said once per run)."""
    out, last_run = [], None
    for label in labels:
        run, _, rest = label.partition(" ")
        out.append(rest if run == last_run and rest else label)
        last_run = run
    return ", ".join(out)


def threshold_verdict(fig: Figure, th: Thresholds) -> ThresholdVerdict:
    """The threshold verdict of one figure (see the module docstring)."""
    rule, in_scope = th.rule(fig.metric, workload=fig.workload, position=fig.position)
    kind = "max" if rule.max is not None else "min" if rule.min is not None else None
    limit = rule.max if kind == "max" else rule.min
    gate = rule.gate if in_scope else ("warn" if rule.gate != "off" else "off")
    base = dict(kind=kind, limit=limit, basis=rule.basis, gate=gate, in_scope=in_scope, min_n=rule.min_n)
    if kind is None or rule.gate == "off":
        return ThresholdVerdict(**base, compared=None, verdict="none")
    if fig.value is None or (isinstance(fig.value, float) and math.isnan(fig.value)):
        return ThresholdVerdict(**base, compared=None, verdict="insufficient")
    if fig.n is not None and fig.n < rule.min_n:
        return ThresholdVerdict(**base, compared=fig.value, verdict="insufficient")
    ci = rule.basis == "ci"
    upper = fig.ci_low if ci and fig.ci_low is not None else fig.value  # held to max
    lower = fig.ci_high if ci and fig.ci_high is not None else fig.value  # held to min
    if rule.min is not None and lower < rule.min:
        base.update(kind="min", limit=rule.min)
        return ThresholdVerdict(**base, compared=lower, verdict=gate)
    if rule.max is not None and upper > rule.max:
        base.update(kind="max", limit=rule.max)
        return ThresholdVerdict(**base, compared=upper, verdict=gate)
    return ThresholdVerdict(**base, compared=upper if kind == "max" else lower, verdict="pass")


def _drift_verdicts(figures: list[Figure], th: Thresholds) -> None:
    tested: list[Figure] = []
    for fig in figures:
        d = fig.drift
        if d is None:
            continue
        rule, _ = th.rule(fig.metric, workload=fig.workload, position=fig.position)
        d.min_delta = rule.drift_min_delta
        if rule.drift == "off":
            d.verdict = "not_tested"
        elif not d.baseline_runs:
            d.verdict = "no_baseline"
        elif d.p_value is None or d.delta is None:
            d.verdict = "insufficient" if d.verdict == "not_tested" else d.verdict
        elif fig.n is not None and fig.n < rule.min_n:
            d.verdict = "insufficient"
        else:
            tested.append(fig)
    for fig, q in zip(tested, benjamini_hochberg([f.drift.p_value for f in tested])):
        d = fig.drift
        d.q_value = q
        rule, in_scope = th.rule(fig.metric, workload=fig.workload, position=fig.position)
        better = info(fig.metric).better
        worse = (d.delta > 0) if better == "lower" else (d.delta < 0) if better == "higher" else True
        if q <= th.fdr and abs(d.delta) >= rule.drift_min_delta:
            d.verdict = (rule.drift if in_scope else "warn") if worse else "improved"
        else:
            d.verdict = "pass"


def _combined(fig: Figure) -> str:
    verdicts = [fig.threshold.verdict if fig.threshold else "none", fig.drift.verdict if fig.drift else "not_tested"]
    for v in ("fail", "warn"):
        if v in verdicts:
            return v
    if "pass" in verdicts or "improved" in verdicts:
        return "pass"
    if "insufficient" in verdicts:
        return "insufficient"
    return "info"


def judge(figures: list[Figure], th: Thresholds) -> Outcome:
    """Set every figure's threshold, drift and combined verdicts; the report's :class:`Outcome`."""
    for fig in figures:
        fig.threshold = threshold_verdict(fig, th)
    _drift_verdicts(figures, th)
    outcome = Outcome(status="pass")
    for fig in figures:
        fig.verdict = _combined(fig)
        for kind, verdict in (("threshold", fig.threshold.verdict),
                              ("drift", fig.drift.verdict if fig.drift else None)):
            if verdict == "fail":
                outcome.failures.append((fig, kind))
            elif verdict == "warn":
                outcome.warnings.append((fig, kind))
    outcome.status = "fail" if outcome.failures else "pass"
    return outcome
