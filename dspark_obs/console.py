"""The CLI's one stderr console and its one way to fail.

Library errors become CLI errors here only: a red ``error:`` line that says
what went wrong and how to fix it, printed unwrapped so it can be grepped, and
exit code 2.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)


def fail(message: str, code: int = 2) -> NoReturn:
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)
