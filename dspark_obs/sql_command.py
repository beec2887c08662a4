"""``dspark-obs sql``'s body: name check, one read-only query, bounded printing, one time limit.

The query functions are :mod:`dspark_obs.sql` / :mod:`dspark_obs.sql_readonly`;
this module only decides what the command prints and how its errors read.
"""

from __future__ import annotations

import difflib
import re
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import typer

from dspark_obs.console import fail

_NAME = re.compile(r"[A-Za-z_][\w\-]*")


def check_canned_name(query: str, canned: list[str], views: list[str]) -> None:
    """A single word that is not a canned query is a typo: say so, with the closest name, before parsing."""
    word = query.strip()
    if not _NAME.fullmatch(word) or word in canned:
        return
    if word.lower() in views:
        fail(f"{word!r} is a view, not a canned query; query it with: \"select * from {word.lower()}\"")
    close = difflib.get_close_matches(word, canned, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    fail(f"{word!r} is not a canned query; {hint}list them with `dspark-obs queries`, or give a SELECT")


def terminal_width() -> int:
    """The terminal's width ($COLUMNS first, as rich reads it; 80 when unknown, e.g. a pipe)."""
    # at call time: the CLI imports every command module to declare its options
    from rich.console import Console

    return Console().width


def render(table, fmt: str, width: int) -> str:
    """``fmt`` text of ``table`` that fits ``width``: the table as is, folded, or one block per row.

    A result with more columns than fit even folded (each at least ~8 characters) is printed
    the way psql's expanded display does: per row, one ``column  value`` line per column.
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import sql as sqlmod

    if fmt != "table":
        return sqlmod.format_result(table, fmt)
    text = sqlmod.format_result(table, "table")
    if max((len(line) for line in text.splitlines()), default=0) <= width:
        return text
    if table.num_columns * 11 + 1 <= width:
        return sqlmod.format_result(table, "table", width=width)
    if table.num_rows == 0:
        # at call time: the CLI imports every command module to declare its options
        import textwrap

        return textwrap.fill(f"no rows; columns: {', '.join(table.column_names)}", width)
    return _expanded(table, width)


def _expanded(table, width: int) -> str:
    # at call time: the CLI imports every command module to declare its options
    import csv
    import io

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from dspark_obs import sql as sqlmod

    rows = list(csv.reader(io.StringIO(sqlmod.format_result(table, "csv"))))[1:]
    nulls = [table.column(i).is_null().to_pylist() for i in range(table.num_columns)]
    out = Table("column", "value", show_edge=True, header_style="bold")
    out.columns[0].overflow = out.columns[1].overflow = "fold"
    for r, row in enumerate(rows):
        out.add_row(Text(f"row {r + 1}", style="bold"), Text(""))
        for c, (name, cell) in enumerate(zip(table.column_names, row)):
            out.add_row(Text(name), Text("null" if nulls[c][r] else cell), end_section=c == len(row) - 1)
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False, highlight=False)
    console.print(out)
    return console.file.getvalue()


def limit_note(shown: int, total: int) -> str:
    return (f"note: showing {shown} of {total} rows ({total - shown} cut); "
            f"--max-rows N to show more, --max-rows 0 for all")


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Fail with ``what`` once ``seconds`` pass (main thread only; elsewhere no limit is applied)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _expired(_signum, _frame):
        raise TimeoutError(what)

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_sql_command(data: Path, query: str, params: dict[str, Any], *, fmt: str, max_rows: int,
                    limit: int | None, timeout_s: float) -> None:
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import schema
    from dspark_obs import sql as sqlmod
    from dspark_obs import sql_readonly

    start = time.monotonic()
    check_canned_name(query, sorted(sqlmod.canned_queries()), [*schema.TABLES, "step_reqs_w", "quarantined_files"])
    try:
        table = sql_readonly.run(data, query, params or None, limit=limit,
                                 timeout_s=max(timeout_s - (time.monotonic() - start), 1e-3))
    except sqlmod.QueryTimeout:
        fail(f"the query exceeded --timeout {timeout_s:g} s and was interrupted; narrow it with WHERE/LIMIT "
             "or raise --timeout")
    except PermissionError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(f"--param: {exc}" if str(exc).startswith("unknown parameters") else f"query failed: {exc}")
    except Exception as exc:  # duckdb errors carry the position of the mistake
        fail(f"query failed: {exc}")
    total = table.num_rows
    shown = table if not max_rows or total <= max_rows else table.slice(0, max_rows)
    what = (f"the command exceeded --timeout {timeout_s:g} s while printing {shown.num_rows} rows; "
            "lower --max-rows, use --format csv, or raise --timeout")
    try:
        with deadline(timeout_s - (time.monotonic() - start), what):
            typer.echo(render(shown, fmt, terminal_width()))
    except TimeoutError as exc:
        fail(str(exc))
    if shown.num_rows < total:
        typer.echo(limit_note(shown.num_rows, total), err=True)
