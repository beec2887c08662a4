"""The ``dspark-obs`` command line.

Each command parses and checks its options, calls one library function, and
turns library errors into a one-line message and exit code 2 (``_fail``).
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from dspark_obs import __version__

app = typer.Typer(
    help="Observe DSpark speculative decoding in SGLang: collect per-step windows, confidences and "
         "acceptance into Parquet, query them with DuckDB, and see what trimming hides.\n\n"
         "Start with `dspark-obs demo`.",
    no_args_is_help=True, add_completion=False, rich_markup_mode="markdown",
)
console = Console(stderr=True)
MODES = ("static", "compact", "cap-accept")


def _fail(message: str, code: int = 2) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dspark-obs {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """dspark-obs."""


def _default_run_id(prefix: str) -> str:
    return f"{prefix}-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%S')}"


def _parse_labels(labels: list[str]) -> dict[str, str]:
    out = {}
    for item in labels:
        if "=" not in item:
            _fail(f"--label expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


@app.command()
def emulate(
    port: int = typer.Option(30000, help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; keep loopback unless you mean it."),
    mode: str = typer.Option("compact", help="Verify mode, as SGLANG_RAGGED_VERIFY_MODE: static | compact | cap-accept."),
    seed: int = typer.Option(0, help="Seed: same seed and prompts commit the same tokens in every mode."),
    gamma: int = typer.Option(6, help="Draft block size (speculative_dspark_block_size)."),
    dp_size: int = typer.Option(1, "--dp-size", help="DP ranks: one dspark_info_record payload per rank."),
    max_records: int = typer.Option(200_000, help="Server-side record deque size (SGLang: 200,000)."),
    max_running_requests: int = typer.Option(256, help="Continuous-batching limit."),
    sps_table: Optional[Path] = typer.Option(None, help="Cost table the scheduler plans with (SGLang JSON, 1-D or additive). Default: the built-in additive table."),
    sts: Optional[Path] = typer.Option(None, help="STS calibration JSON ({temperatures: [...]}) applied to the head."),
    head_temperature: Optional[str] = typer.Option(None, help="Comma-separated per-position miscalibration temperatures of the head (1 = calibrated, <1 over-confident)."),
    real_time: float = typer.Option(0.0, help="0: virtual clock (fast); 1: sleep each step's modelled time."),
) -> None:
    """Serve the DSpark emulator: SGLang 0.5.23's HTTP endpoints over a real scheduler.

    Example: `dspark-obs emulate --port 30000 --mode compact --seed 0`
    """
    from dspark_obs import costtable
    from dspark_obs.emulator.engine import DEFAULT_HEAD_TEMPERATURE, EngineConfig
    from dspark_obs.emulator.server import load_sts_temperatures, serve

    if mode not in MODES:
        _fail(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    try:
        cfg = EngineConfig(
            mode=mode, seed=seed, gamma=gamma, dp_size=dp_size, max_records=max_records,
            max_running_requests=max_running_requests,
            sps_table=costtable.load(sps_table) if sps_table else costtable.default_additive_table(),
            sts_temperatures=load_sts_temperatures(str(sts)) if sts else None,
            head_temperature=tuple(float(x) for x in head_temperature.split(",")) if head_temperature
            else DEFAULT_HEAD_TEMPERATURE,
            real_time=real_time,
        )
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    console.print(f"DSpark emulator ({mode}, gamma {gamma}, dp {dp_size}, seed {seed}) on http://{host}:{port}")
    serve(cfg, host=host, port=port)


@app.command()
def collect(
    url: str = typer.Option(..., help="Base URL of the SGLang DSpark server, e.g. http://127.0.0.1:30000."),
    out: Path = typer.Option(..., help="Data root of the Parquet store (created if missing)."),
    run_id: Optional[str] = typer.Option(None, help="Run id (default: <mode>-<UTC time>). Letters, digits, '.', '_', '-'."),
    workload: Optional[str] = typer.Option(None, help="Drive traffic too: comma-separated workloads, e.g. gsm8k,arena-hard,poetry."),
    requests: int = typer.Option(90, help="With --workload: how many requests to send."),
    concurrency: int = typer.Option(32, help="With --workload: requests in flight."),
    temperature: float = typer.Option(0.0, help="With --workload: sampling temperature (0 = greedy)."),
    max_new_tokens: int = typer.Option(256, help="With --workload: output limit per request."),
    seed: int = typer.Option(0, help="With --workload: seed for prompts and per-request sampling_seed."),
    poll_interval: float = typer.Option(1.0, help="Seconds between /server_info polls."),
    clear_at: int = typer.Option(2000, help="Clear the server's record deque once it holds this many records (each clear loses ~1 step, reported as a gap); 0 never clears."),
    flush_interval: float = typer.Option(5.0, help="Seconds between Parquet commits (the most a crash can lose)."),
    duration: Optional[float] = typer.Option(None, help="Without --workload: stop after this many seconds (default: until Ctrl-C)."),
    label: list[str] = typer.Option([], help="KEY=VALUE label stored on the run; repeatable."),
    redact_text: bool = typer.Option(False, help="Store no prompt or output text."),
) -> None:
    """Collect a run from a live server into the store (attach mode).

    Polls `/server_info` by high-water mark on `forward_ct`, reports lost records as gaps,
    and with `--workload` drives closed-loop traffic itself (rids like `gsm8k-000017`,
    logprobs and top-5 requested) so that `requests` and `tokens` are filled too.

    Example: `dspark-obs collect --url http://127.0.0.1:30000 --out data --workload gsm8k,poetry --requests 60`
    """
    from collectors.sglang.driver import DriveSpec
    from collectors.sglang.session import CollectError, CollectOptions, Collector
    from dspark_obs.store import Store, validate_run_id

    if run_id is not None:
        try:
            validate_run_id(run_id)
        except ValueError as exc:
            _fail(str(exc))
    drive = None
    if workload:
        names = [w.strip() for w in workload.split(",") if w.strip()]
        if requests < 1 or concurrency < 1:
            _fail("--requests and --concurrency must be >= 1")
        drive = DriveSpec(names, requests, concurrency=concurrency, temperature=temperature,
                          max_new_tokens=max_new_tokens, seed=seed, redact_text=redact_text)
    opts = CollectOptions(url=url.rstrip("/"), run_id=run_id or _default_run_id("run"),
                          poll_interval=poll_interval, clear_at=clear_at, flush_interval=flush_interval,
                          duration=duration, drive=drive, labels=_parse_labels(label))
    summary = _run_collector(Store(out), opts, total_requests=requests if drive else None)
    _print_summary(summary, out)


def _run_collector(store, opts, total_requests: Optional[int]):
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from collectors.sglang.session import CollectError, Collector

    show = sys.stderr.isatty()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[steps]} steps"), TimeElapsedColumn(),
                  console=console, disable=not show, transient=True) as progress:
        task = progress.add_task(f"collecting {opts.run_id}", total=total_requests, steps=0)
        counts = {"steps": 0}

        def on_progress(kind: str, n: int) -> None:
            if kind == "steps":
                counts["steps"] += n
                progress.update(task, steps=counts["steps"])
            else:
                progress.advance(task, n)

        collector = Collector(store, opts, on_progress)

        async def main():
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, collector.stop)
            return await collector.run()

        try:
            return asyncio.run(main())
        except CollectError as exc:
            _fail(str(exc))


def _print_summary(s, out: Path) -> None:
    console.print(
        f"run [bold]{s.run_id}[/bold] ({s.mode}, gamma {s.gamma}, dp {s.dp_size}): "
        f"{s.steps} steps, {s.step_reqs} request-steps, {s.requests} requests"
        f"{f' ({s.failed_requests} failed)' if s.failed_requests else ''}, {s.tokens} tokens; "
        f"{s.gaps} gaps ({s.lost_forward_cts} forward_cts at most, {s.clears} clears), "
        f"{s.dead_letters} dead letters, {s.rows_dropped} rows dropped; {s.elapsed_s:.1f}s -> {out}"
    )


@app.command()
def sql(
    query: str = typer.Argument(..., help="A SELECT over the views, or the name of a canned query (see --list)."),
    data: Path = typer.Option(..., help="Data root of the store."),
    format: str = typer.Option("table", "--format", "-f", help="table | csv | json"),
    param: list[str] = typer.Option([], help="NAME=VALUE for a canned query's $NAME parameter; repeatable."),
    limit: Optional[int] = typer.Option(None, help="Return at most this many rows."),
    timeout: float = typer.Option(60.0, help="Cancel the query after this many seconds."),
) -> None:
    """Run DuckDB SQL over the store: one view per table, plus canned queries by name.

    Views: runs, steps, step_reqs, requests, tokens, gaps, dead_letters, and step_reqs_w
    (step_reqs with workload, temperature and window = verify_len - 1).

    Example: `dspark-obs sql --data D "select workload, avg(verify_len) from step_reqs join requests using (run_id, rid) group by 1"`
    """
    from dspark_obs import sql as sqlmod

    if format not in ("table", "csv", "json"):
        _fail(f"--format {format!r} is not one of table, csv, json")
    if not data.is_dir():
        _fail(f"--data {data} is not a directory; collect a run first (dspark-obs demo or dspark-obs collect)")
    params = _parse_labels(param)
    try:
        con = sqlmod.connect(data)
        table = sqlmod.query(con, query, params or None, timeout_s=timeout, limit=limit)
    except sqlmod.QueryTimeout as exc:
        _fail(str(exc))
    except Exception as exc:  # duckdb errors carry the position of the mistake
        _fail(f"query failed: {exc}")
    typer.echo(sqlmod.format_result(table, format))


@app.command("queries")
def list_queries() -> None:
    """List the canned queries `dspark-obs sql NAME` understands."""
    from dspark_obs import sql as sqlmod

    for name, (description, _) in sorted(sqlmod.canned_queries().items()):
        typer.echo(f"{name:28s} {description}")


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-data"), help="Data root to write the demo's runs to."),
    quick: bool = typer.Option(False, help="Fewer requests: finishes in well under a minute."),
    no_dashboard: bool = typer.Option(False, "--no-dashboard", help="Do not serve the dashboard at the end."),
    seed: int = typer.Option(0, help="Seed of the emulator and the traffic."),
) -> None:
    """Emulate a DSpark server, collect a compact run and its cap-accept companion, and summarise.

    Everything runs locally on the embedded emulator; nothing needs a GPU.
    """
    from dspark_obs.demo import run_demo

    try:
        run_demo(out, quick=quick, seed=seed, serve_dashboard=not no_dashboard, console=console)
    except Exception as exc:
        _fail(f"demo failed: {exc}", code=1)


def _register_feature_commands() -> None:
    from dspark_obs.commands import register_all

    register_all(app)


_register_feature_commands()


if __name__ == "__main__":  # pragma: no cover
    app()
