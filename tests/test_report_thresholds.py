"""Tests for dspark_obs.report.thresholds: the defaults, merging a user file, overrides and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_obs.report.metrics import METRICS
from dspark_obs.report.thresholds import ThresholdsError, default_text, load_thresholds

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "thresholds.toml"


def _file(tmp_path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def test_the_example_file_is_the_packaged_defaults():
    assert EXAMPLE.read_text() == default_text()
    assert load_thresholds(EXAMPLE).rules == load_thresholds().rules


def test_defaults_cover_every_metric_with_sensible_limits():
    th = load_thresholds()
    assert th.source == "defaults" and set(th.rules) == set(METRICS)
    assert (th.labels, th.binning, th.n_bootstrap, th.fdr) == ("best", "width15", 1000, 0.05)
    assert th.rules["debiased_ece"].max == 0.05 and th.rules["ece"].max == 0.08
    assert th.rules["utilisation"].min == 0.85 and th.rules["utilisation"].scope == "each"
    assert th.rules["auroc"].min == 0.75 and th.rules["estimator_coverage"].min == 0.9
    assert th.rules["sts_predicted_gain"].gate == "warn"
    assert not th.rules["brier"].has_limit and th.rules["brier"].drift == "warn"


def test_scope_decides_which_rows_a_breach_fails():
    th = load_thresholds()
    assert th.rule("ece", workload="*", position=2)[1] is True
    assert th.rule("ece", workload="poetry", position=2)[1] is False  # aggregate scope: warn only
    assert th.rule("utilisation", workload="poetry")[1] is True  # scope each
    assert th.rule("costmodel_mape")[1] is True  # per-run figures are always in scope


def test_a_user_file_merges_over_the_defaults_and_overrides_are_most_specific_first(tmp_path):
    th = load_thresholds(_file(tmp_path, """
[report]
n_bootstrap = 300
[metrics.debiased_ece]
max = 0.04
[[metrics.debiased_ece.override]]
workload = "poetry"
max = 0.07
[[metrics.debiased_ece.override]]
workload = "poetry"
position = 6
max = 0.09
gate = "warn"
[[metrics.debiased_ece.override]]
position = 6
max = 0.06
[metrics.utilisation]
max = 0.999
"""))
    assert th.n_bootstrap == 300 and th.binning == "width15"  # untouched keys keep their defaults
    assert th.rule("debiased_ece", workload="*", position=1)[0].max == 0.04
    assert th.rule("debiased_ece", workload="*", position=6)[0].max == 0.06
    rule, in_scope = th.rule("debiased_ece", workload="poetry", position=3)
    assert (rule.max, in_scope) == (0.07, True)  # an override naming the workload gates it
    rule, _ = th.rule("debiased_ece", workload="poetry", position=6)
    assert (rule.max, rule.gate) == (0.09, "warn")
    assert th.rule("debiased_ece", workload="gsm8k", position=3)[1] is False
    util = th.rules["utilisation"]
    assert (util.max, util.min) == (0.999, None)  # a user limit replaces the default one


@pytest.mark.parametrize("text, message", [
    ("[metrics.ece\n", "not valid TOML"),
    ("[metrics.eec]\nmax = 1", r"unknown metrics \['eec'\] in \[metrics\]; known: ece, debiased_ece"),
    ("[metrics.ece]\nmaximum = 1", r"\[metrics.ece\]: unknown keys \['maximum'\]; allowed: max, min"),
    ("[metrics.ece]\nmax = 'high'", r"\[metrics.ece\].max must be a number, got 'high'"),
    ("[metrics.ece]\ngate = 'loud'", r"\[metrics.ece\].gate must be one of fail, warn, off, got 'loud'"),
    ("[metrics.ece]\nmin = 0.5\nmax = 0.1", "min 0.5 is above max 0.1"),
    ("[[metrics.ece.override]]\nmax = 0.1", "names neither a workload nor a position"),
    ("[drift]\nfdr = 1.5", r"\[drift\].fdr must be in \(0, 1\), got 1.5"),
    ("[report]\nlabels = 'truth'", r"\[report\].labels must be one of best, companion, reconstructed, observed"),
    ("version = 2", "thresholds version 2 is not supported"),
    ("[gates]\nx = 1", r"unknown top-level keys \['gates'\]"),
])
def test_invalid_files_name_the_key_and_what_is_allowed(tmp_path, text, message):
    with pytest.raises(ThresholdsError, match=message):
        load_thresholds(_file(tmp_path, text))


def test_an_unreadable_file_says_so(tmp_path):
    with pytest.raises(ThresholdsError, match="cannot read it"):
        load_thresholds(tmp_path / "missing.toml")
