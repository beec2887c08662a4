"""``dspark-obs compact``: rewrite a run's request tables as few files of disjoint rid ranges."""

from __future__ import annotations

from typing import Optional

import typer

from dspark_obs.console import FORMAT_HELP, check_format, fail, in_range, print_table
from dspark_obs.console import console as err
from dspark_obs.engine_options import data_root


def compact(
    data: str = typer.Option(..., help="Data root of the store: a local directory (from `dspark-obs collect`, "
                                       "`ingest` or `demo`)."),
    run: list[str] = typer.Option([], help="Run to compact; repeatable. Default: every run of the store."),
    file_rows: Optional[int] = typer.Option(None, callback=in_range(65_536), help="Rows per compacted file, at "
                                            "least one row group (65,536): what the rewrite holds in memory at a "
                                            "time. Default: 32 row groups (2,097,152 rows)."),
    format: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Rewrite each run's step_reqs, tokens and requests as few files of disjoint rid ranges.

    A collector commits a file per table every few seconds, each holding the requests in flight, so every
    file spans most of the run's rids; `estimate`, `calibrate` and `report` read a run in chunks of rids
    and pay for every file a chunk's rids touch (a 3M-row run in 147 files: `estimate` 1.30x the CPU of
    the same run compacted). Compaction rewrites the files once; tables already in disjoint ranges are
    left alone, so running it again is cheap. Rows keep their order within a request.

    Safe to interrupt: the new files are written in full before the old ones go, and the next `compact`
    finishes or discards what an interrupted one left. A collector may keep writing the run (its new files
    are kept as they are); while the files move, a reader may count a request's rows twice, so compact
    when no estimator reads the run. Local stores only.

    Examples:

    `dspark-obs compact --data D --run prod-1`, then `dspark-obs estimate --data D --run prod-1`

    `dspark-obs compact --data D` (every run)
    \f
    Long: typer declares the options in the signature; the body checks them and calls the library.
    """
    # at call time: the CLI imports every command module to declare its options
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from dspark_obs.compaction import FILE_ROWS, compact_run
    from dspark_obs.store import Store, is_url

    check_format(format)
    if is_url(data):
        fail(f"--data {data}: compaction rewrites a local store; an object store's files are left as they are")
    store = Store(data_root(data))
    runs = run or [r for r in store.runs() if any(store.part_files(t, r, fleet_layout=False)
                                                  for t in ("step_reqs", "tokens", "requests"))]
    unknown = sorted(set(run) - set(store.runs()))
    if unknown:
        fail(f"--run {', '.join(unknown)}: not in {data}; runs: {', '.join(store.runs()) or 'none'}")
    table = Table("run", "table", "files before", "files after", "rows", "MB before", "MB after",
                  title=f"Compaction of {data}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("compacting", total=0)
        for run_id in runs:
            def progress(name: str, done: int, total: int, run_id: str = run_id) -> None:
                bar.update(task, description=f"{run_id} {name}", completed=done, total=total)
            try:
                done = compact_run(store, run_id, file_rows=file_rows or FILE_ROWS, progress=progress)
            except (ValueError, OSError) as exc:
                fail(f"run {run_id}: {exc}")
            for c in done:
                table.add_row(run_id, c.table, str(c.files_before), str(c.files_after), str(c.rows),
                              f"{c.bytes_before / 1e6:.1f}", f"{c.bytes_after / 1e6:.1f}")
    print_table(table, format)


def register(app: typer.Typer) -> None:
    app.command()(compact)
