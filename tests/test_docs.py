"""The README documents every table, column and command."""

from pathlib import Path

from typer.testing import CliRunner

from dspark_obs import schema
from dspark_obs.cli import app

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_column_of_every_core_table_is_documented():
    for table in ("runs", "steps", "step_reqs", "requests", "tokens", "gaps", "dead_letters"):
        assert f"### `{table}`" in README, table
        for field in schema.TABLES[table]:
            assert f"| `{field.name}` |" in README, (table, field.name)


def test_every_command_is_documented_and_has_help():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("emulate", "collect", "sql", "demo", "queries"):
        assert f"dspark-obs {name}" in README or f"make {name}" in README, name
        assert CliRunner().invoke(app, [name, "--help"]).exit_code == 0
