"""CLI commands that live beside their feature; each module registers on ``cli.app``.

Every module here defines a ``register(app: typer.Typer) -> None``; the CLI
imports them all, so a new command is one new file.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer


def register_all(app: typer.Typer) -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(app)
