"""The CLI's one stderr console, its one way to fail, and its one way to print a table.

Library errors become CLI errors here only: a red ``error:`` line that says
what went wrong and how to fix it, printed unwrapped so it can be grepped, and
exit code 2.  Option errors found while parsing (click's) are printed the same
way: usage, the ``--help`` hint, and one unwrapped ``error:`` line.

Tables go through :func:`print_table`: ``table`` folds cells to fit the
terminal (a number or an id is broken across lines, never cut to ``…``),
``csv`` and ``json`` print the same cells for scripts.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import sys
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer import rich_utils

FORMATS = ("table", "csv", "json")
FORMAT_HELP = "table (folded to fit the terminal) | csv | json (one object per table and line)"

console = Console(stderr=True, width=None if sys.stderr.isatty() or os.environ.get("COLUMNS") else 120)


def fail(message: str, code: int = 2) -> NoReturn:
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def check_choice(flag: str, value: str, choices, hint: str = "") -> str:
    """A plain-string option's check against its choices: the value seen, the ones allowed, a hint."""
    if value not in choices:
        fail(f"{flag} {value!r} is not one of {', '.join(choices)}{hint}")
    return value


def check_format(fmt: str) -> str:
    """``--format``'s check, for commands that take it as a plain string."""
    return check_choice("--format", fmt, FORMATS, "; e.g. --format csv")


def _click_error(exc) -> None:
    """Print a click usage error without a panel: usage, the help hint, one unwrapped ``error:`` line."""
    if exc.__class__.__name__ == "NoArgsIsHelpError":
        return
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        typer.echo(ctx.get_usage(), err=True)
        if ctx.command.get_help_option(ctx) is not None:
            typer.echo(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.", err=True)
    typer.echo(f"error: {exc.format_message()}", err=True)


def install_click_errors() -> None:
    """Route typer's rich error panel (which wraps at the terminal width) to :func:`_click_error`."""

    rich_utils.rich_format_error = _click_error


def _plain(cell: Any) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell)).plain if isinstance(cell, str) else str(cell)


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None if text in ("", "-") else text


def table_records(table: Table) -> tuple[list[str], list[list[str]]]:
    """A rich table's header and rows as plain text (markup removed, header lines joined)."""
    header = [" ".join(_plain(c.header).split()) for c in table.columns]
    columns = [[_plain(x) for x in c.cells] for c in table.columns]
    return header, [list(row) for row in zip(*columns)]


def print_table(table: Table, fmt: str = "table", *, out: Optional[Console] = None) -> None:
    """Print ``table`` as ``fmt`` (table | csv | json) on ``out`` (default: stdout).

    ``table`` folds every column so the table fits the console's width.
    """
    if fmt == "table":
        for column in table.columns:
            column.overflow, column.no_wrap = "fold", False
        (out or Console(highlight=False)).print(table)
        return
    header, rows = table_records(table)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
        typer.echo(buf.getvalue(), nl=False)
    elif fmt == "json":
        title = _plain(table.title) if table.title is not None else None
        typer.echo(json.dumps({"table": title, "rows": [dict(zip(header, map(_value, r))) for r in rows]},
                              ensure_ascii=False))
    else:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")


def positive(value: Optional[float]) -> Optional[float]:
    """Option callback: a number that must be > 0 (click names the option in its error)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value:g} is not in the range x>0; give a positive number")
    return value


def in_range(lo: Optional[float] = None, hi: Optional[float] = None, what: str = ""):
    """Option callback factory: a number in [lo, hi]; the error shows the value and the range."""
    def check(value):
        if value is None or isinstance(value, list):
            return value
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = (f"{lo:g}<=x<={hi:g}" if lo is not None and hi is not None
                      else f"x>={lo:g}" if lo is not None else f"x<={hi:g}")
            raise typer.BadParameter(f"{value:g} is not in the range {bounds}{f' ({what})' if what else ''}")
        return value
    return check


def default_run_id(prefix: str) -> str:
    """``PREFIX-YYYYmmddTHHMMSS`` (UTC): the run id a command picks when none is given."""

    return f"{prefix}-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%S')}"


def parse_labels(labels: list[str], flag: str = "--label") -> dict[str, str]:
    """``KEY=VALUE`` options (``--label``, ``--param``) as a dict; a one-line error naming the flag otherwise."""
    out = {}
    for item in labels:
        if "=" not in item:
            fail(f"{flag} expects {'NAME' if flag == '--param' else 'KEY'}=VALUE, got {item!r}; "
                 f"e.g. {flag} {'run=demo-compact-s0' if flag == '--param' else 'team=infra'}")
        k, v = item.split("=", 1)
        out[k] = v
    return out
