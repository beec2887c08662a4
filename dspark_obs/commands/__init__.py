"""Every CLI command, one module per command (or pair); each registers on ``cli.app``.

Every module here defines a ``register(app: typer.Typer) -> None``; the CLI
imports them all, so a new command is one new file.  The first ones register in
:data:`FIRST` order (``--help`` lists a newcomer's path first: emulate, collect,
sql, queries, demo), the rest by name.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

FIRST = ("emulate", "collect", "sql", "demo")


def register_all(app: typer.Typer) -> None:
    names = [m.name for m in pkgutil.iter_modules(__path__)]
    for name in [n for n in FIRST if n in names] + sorted(n for n in names if n not in FIRST):
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(app)

