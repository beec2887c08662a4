"""The README documents every table, column and command, and stays in step with the code."""

from pathlib import Path

from typer.testing import CliRunner

from dspark_obs import schema
from dspark_obs.cli import app

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_data_model_section_is_the_schemas_own_description():
    begin, end = "<!-- data-model:begin -->\n", "<!-- data-model:end -->"
    section = README.split(begin, 1)[1].split(end, 1)[0]
    assert section == schema.data_model_markdown(), (
        "README's data model is stale: regenerate it from dspark_obs.schema.data_model_markdown()")


def test_every_command_is_documented_and_has_help():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    commands = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert len(commands) >= 11
    for name in commands:
        assert f"dspark-obs {name}" in README or f"make {name}" in README, name
        assert CliRunner().invoke(app, [name, "--help"]).exit_code == 0, name
