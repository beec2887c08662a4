"""The report's docstring examples run (doctests), and its command is documented in its help."""

from __future__ import annotations

import doctest
import importlib

import pytest
from typer.testing import CliRunner

from dspark_obs.cli import app

MODULES = ["thresholds", "stats", "bootstrap", "gates", "inputs", "calibration", "ceiling", "text", "summary"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(f"dspark_obs.report.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {module.__name__}"


def test_report_help_names_every_option_and_the_exit_codes():
    result = CliRunner().invoke(app, ["report", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in ("--data", "--out", "--run", "--since", "--baseline", "--baseline-since", "--thresholds",
                   "--no-png", "--no-history", "--recompute", "--bootstrap", "--now"):
        assert option in result.output, option
    assert "Exit codes" in result.output
