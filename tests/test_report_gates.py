"""Tests for dspark_obs.report.gates: threshold verdicts, drift verdicts with the FDR, the one-line reason."""

from __future__ import annotations

import dataclasses

import pytest

from dspark_obs.report.gates import judge, threshold_verdict
from dspark_obs.report.model import Drift, Figure
from dspark_obs.report.thresholds import Rule, load_thresholds

TH = load_thresholds()


def _fig(metric="debiased_ece", value=0.03, workload="*", position=1, n=1000, **kw) -> Figure:
    return Figure(metric, "r", value, workload=workload, position=position, n=n, **kw)


def _drift(delta, p, baseline=("b",)) -> Drift:
    return Drift(test="t", baseline_runs=list(baseline), baseline_value=0.02, delta=delta, p_value=p)


@pytest.mark.parametrize("value, workload, n, verdict", [
    (0.03, "*", 1000, "pass"),
    (0.06, "*", 1000, "fail"),
    (0.06, "poetry", 1000, "warn"),  # aggregate scope: per-workload breaches warn
    (0.06, "*", 50, "insufficient"),  # below min_n: never a failure
    (None, "*", 1000, "insufficient"),
    (0.05, "*", 1000, "pass"),  # the limit itself passes
])
def test_threshold_verdicts(value, workload, n, verdict):
    assert threshold_verdict(_fig(value=value, workload=workload, n=n), TH).verdict == verdict


def test_min_limits_ci_basis_and_metrics_without_a_limit():
    assert threshold_verdict(_fig("utilisation", 0.80, workload="poetry", position=None), TH).verdict == "fail"
    assert threshold_verdict(_fig("utilisation", 0.90, workload="poetry", position=None), TH).verdict == "pass"
    assert threshold_verdict(_fig("brier", 0.9), TH).verdict == "none"
    th = dataclasses.replace(TH, rules={**TH.rules, "debiased_ece": dataclasses.replace(
        TH.rules["debiased_ece"], basis="ci")})
    straddling = _fig(value=0.06, ci_low=0.04, ci_high=0.08)
    assert threshold_verdict(straddling, th).verdict == "pass"  # the CI reaches below the limit
    t = threshold_verdict(_fig(value=0.07, ci_low=0.055, ci_high=0.09), th)
    assert (t.verdict, t.compared, t.kind) == ("fail", 0.055, "max")


def test_drift_needs_significance_and_a_material_change_in_the_bad_direction():
    figs = [
        _fig(position=1, drift=_drift(+0.05, 1e-6)),   # worse, significant, material -> fail
        _fig(position=2, drift=_drift(+0.01, 1e-6)),   # significant but below drift_min_delta -> pass
        _fig(position=3, drift=_drift(+0.05, 0.5)),    # material but not significant -> pass
        _fig(position=4, drift=_drift(-0.05, 1e-6)),   # better -> improved
        _fig(position=5, workload="poetry", drift=_drift(+0.05, 1e-6)),  # out of scope -> warn
        _fig("auroc", 0.9, position=1, drift=_drift(-0.05, 1e-6)),  # higher is better: a drop is worse
        _fig(position=6, drift=_drift(+0.05, 1e-6, baseline=())),    # no baseline
    ]
    outcome = judge(figs, TH)
    assert [f.drift.verdict for f in figs] == ["fail", "pass", "pass", "improved", "warn", "fail", "no_baseline"]
    assert [f.verdict for f in figs] == ["fail", "pass", "pass", "pass", "warn", "fail", "pass"]
    assert outcome.status == "fail" and outcome.exit_code == 1
    assert outcome.failing_metrics == ["drift:debiased_ece", "drift:auroc"]
    assert figs[0].drift.q_value == pytest.approx(1e-6 * 6 / 5)  # BH: 6 tests, five at p = 1e-6


def test_the_fdr_adjustment_keeps_a_lone_borderline_p_from_failing_among_many_tests():
    figs = [_fig(position=k, drift=_drift(+0.05, 0.04 if k == 1 else 0.9)) for k in range(1, 7)]
    judge(figs, TH)
    assert figs[0].drift.verdict == "pass" and figs[0].drift.q_value == pytest.approx(0.24)


def test_failing_line_names_metrics_and_places_once_per_run():
    figs = [_fig(value=0.09, position=k) for k in (1, 2, 3)] + [_fig("utilisation", 0.5, "poetry", None)]
    outcome = judge(figs, TH)
    assert outcome.failing_line() == "debiased_ece > 0.05 at r */k1, */k2, */k3; utilisation < 0.85 at r poetry"
    many = [_fig(value=0.09, position=k) for k in range(1, 10)]
    assert judge(many, TH).failing_line(max_places=2).endswith("*/k2 (+7 more)")


def test_a_passing_report_has_no_failures_and_warnings_are_listed():
    figs = [_fig(value=0.01), _fig(value=0.09, workload="gsm8k")]
    outcome = judge(figs, TH)
    assert (outcome.status, outcome.failing_line(), len(outcome.warnings)) == ("pass", "", 1)


def test_gate_off_disables_a_limit():
    th = dataclasses.replace(TH, rules={**TH.rules, "debiased_ece": Rule(max=0.05, gate="off")})
    assert threshold_verdict(_fig(value=0.5), th).verdict == "none"
