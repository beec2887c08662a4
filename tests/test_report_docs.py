"""The report command is documented in its help (its docstring examples run in test_doctests)."""

from __future__ import annotations

from typer.testing import CliRunner

from dspark_obs.cli import app


def test_report_help_names_every_option_and_the_exit_codes():
    result = CliRunner().invoke(app, ["report", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in ("--data", "--out", "--run", "--since", "--baseline", "--baseline-since", "--thresholds",
                   "--no-png", "--no-history", "--recompute", "--bootstrap", "--now"):
        assert option in result.output, option
    assert "Exit codes" in result.output
