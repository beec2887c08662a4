"""``dspark-obs doctor``: check a store and say what is wrong with it, with the fix.

Why a command: the problems a store can have — a part file cut short, a run
whose collector died before closing it, a hidden ``.tmp`` a ``kill -9`` left
— do not show in query results; they show as numbers that are quietly short.
The doctor sweeps unreadable files into quarantine (the same sweep every
reader does), lists them, and lists unclosed runs and leftover temporary
files.  Exit code 0: nothing found; 1: something to look at (listed).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import in_range


def register(app: typer.Typer) -> None:
    app.command()(doctor)


def doctor(
    data: Path = typer.Option(..., help="Data root of the store."),
    mark_crashed_after: Optional[float] = typer.Option(None, callback=in_range(0), help="Close unclosed runs whose newest file is older than this many minutes as crashed (at that file's time); their collectors are gone. Default: only list them."),
) -> None:
    """Check a store: quarantine unreadable part files, list unclosed runs and leftover .tmp files.

    Exit code 0 when nothing was found, 1 when something is listed.

    Example: `dspark-obs doctor --data data`
    """
    from dspark_obs import quarantine
    from dspark_obs.console import console, fail
    from collectors.sglang import runlife
    from dspark_obs.store import Store

    if not data.is_dir():
        fail(f"--data {data} is not a directory; give the data root a collector wrote (--out)")
    moved = quarantine.sweep(data)
    listed = quarantine.listing(data)
    problems = 0
    for row in listed.to_pylist():
        problems += 1
        new = " (moved now)" if any(m["path"] == row["path"] for m in moved) else ""
        typer.echo(f"quarantined{new}: {row['table_name']} run {row['run_id']} {row['file_name']} "
                   f"({row['size_bytes']} bytes): {row['error']} -> {row['path']}")
    store = Store(data)
    runs = store.read("runs")
    now = _dt.datetime.now(_dt.timezone.utc)
    for row in runs.to_pylist():
        if row.get("ended_at") is None and mark_crashed_after is not None:
            last = runlife.last_commit(store, row["run_id"]) or row["started_at"]
            if now - last >= _dt.timedelta(minutes=mark_crashed_after):
                typer.echo(f"closed run {row['run_id']}: {runlife.mark_crashed(store, row['run_id'], row)}")
                continue
        if row.get("ended_at") is None:
            problems += 1
            typer.echo(f"unclosed run: {row['run_id']} started {row['started_at']} has no ended_at; if its "
                       f"collector is gone, `dspark-obs collect --run-id {row['run_id']} --resume ...` marks it "
                       "crashed (at its last committed file) and continues it")
    for tmp in sorted(Path(data).glob("*/run_id=*/.*.tmp")):
        problems += 1
        typer.echo(f"leftover temporary file (a write interrupted by a crash; readers ignore it): {tmp}")
    if problems:
        console.print(f"{problems} finding(s) in {data}")
        raise typer.Exit(1)
    typer.echo(f"{data}: {len(runs)} runs, no unreadable files, no unclosed runs, no leftover temporary files")
