"""``dspark-obs sql`` and ``dspark-obs queries``: DuckDB SQL over the store, canned queries by name."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import fail as _fail, in_range, positive
from dspark_obs.console import FORMAT_HELP, check_format, parse_labels as _parse_labels


def sql(
    query: str = typer.Argument(..., help="A SELECT over the views, or the name of a canned query (list them: `dspark-obs queries`)."),
    data: Path = typer.Option(..., help="Data root of the store."),
    format: str = typer.Option("table", "--format", "-f", help="table | csv | json"),
    param: list[str] = typer.Option([], help="NAME=VALUE for a canned query's $NAME parameter; repeatable."),
    max_rows: int = typer.Option(100, callback=in_range(0), help="Print at most this many rows; a note on stderr says how many were cut. 0 = all."),
    limit: Optional[int] = typer.Option(None, callback=in_range(0), help="Stop the query itself after this many rows (no note)."),
    timeout: float = typer.Option(60.0, callback=positive, help="Time limit in seconds for the whole command: the query and its printing."),
) -> None:
    """Run DuckDB SQL over the store: one view per table, plus canned queries by name.

    Views: runs, steps, step_reqs, requests, tokens, gaps, dead_letters, and step_reqs_w
    (step_reqs with workload, temperature and window = verify_len - 1); quarantined_files lists
    unreadable part files moved aside (see `dspark-obs doctor`). Canned queries: `dspark-obs queries`.

    Read-only at the engine level: each statement runs on a connection of its own that cannot
    open or write any file; only SELECT, EXPLAIN [ANALYZE] SELECT and catalogue PRAGMAs run.

    Example: `dspark-obs sql --data D "select workload, avg(verify_len) from step_reqs join requests using (run_id, rid) group by 1"`
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.sql_command import run_sql_command

    check_format(format)
    if not data.is_dir():
        _fail(f"--data {data} is not a directory; collect a run first (dspark-obs demo or dspark-obs collect)")
    run_sql_command(data, query, _parse_labels(param, "--param"), fmt=format, max_rows=max_rows, limit=limit,
                    timeout_s=timeout)
    _warn_quarantined(data)


def _warn_quarantined(data: Path) -> None:
    """Say on stderr when part files were moved aside as unreadable (the query ran without them)."""
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import quarantine

    moved = quarantine.listing(data).num_rows
    if moved:
        typer.echo(f"warning: {moved} unreadable part file(s) of this store are quarantined and not read; "
                   "list them with `dspark-obs doctor --data D` or `select * from quarantined_files`", err=True)


def list_queries(format: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP)) -> None:
    """List the canned queries `dspark-obs sql NAME` understands."""
    # at call time: the CLI imports every command module to declare its options
    from rich.table import Table
    from rich.text import Text

    from dspark_obs import sql as sqlmod
    from dspark_obs.console import print_table

    check_format(format)
    table = Table("name", "description", box=None, header_style="bold", pad_edge=False)
    for name, (description, _) in sorted(sqlmod.canned_queries().items()):
        table.add_row(Text(name), Text(description))
    print_table(table, format)


def register(app: typer.Typer) -> None:
    app.command()(sql)
    app.command("queries")(list_queries)
