"""The ``dspark-obs`` command line: the typer app and its wiring, nothing else.

Every command lives in :mod:`dspark_obs.commands` (one module per command or
pair of commands); each checks its options, calls one library function, and
turns library errors into a one-line message and exit code 2
(:func:`dspark_obs.console.fail`).  This module makes the app, installs the
one-line click errors and registers the commands, so ``import dspark_obs.cli``
stays free of the heavy libraries (each command imports them when it runs).
"""

from __future__ import annotations

import typer

from dspark_obs import __version__
from dspark_obs.allocation import tune_for_chunked_arrays
from dspark_obs.console import install_click_errors

app = typer.Typer(
    help="Observe DSpark speculative decoding in SGLang: collect per-step windows, confidences and "
         "acceptance into Parquet, query them with DuckDB, and see what trimming hides.\n\n"
         "Start with `dspark-obs demo`.",
    no_args_is_help=True, add_completion=False, rich_markup_mode="markdown",
)
install_click_errors()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dspark-obs {__version__}")
        raise typer.Exit()


@app.callback()
def main(ctx: typer.Context, version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                                           help="Print the version and exit.")) -> None:
    """dspark-obs."""
    tune_for_chunked_arrays(command=ctx.invoked_subcommand)  # before any command imports numpy: see dspark_obs.allocation


def _register_commands() -> None:
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.commands import register_all

    register_all(app)


_register_commands()


if __name__ == "__main__":  # pragma: no cover
    app()
