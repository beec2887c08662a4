"""``dspark-obs collect``: check the options, open the store, and run the collector with a progress bar.

The run loop (:func:`run_collector`: signals, the sidecar's metrics, the progress bar; launch mode's
child server) lives here too, so ``companion`` runs its replay through the same loop.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import console, fail as _fail, in_range, positive
from dspark_obs.console import default_run_id as _default_run_id, parse_labels as _parse_labels


def collect(
    server_command: Optional[list[str]] = typer.Argument(None, metavar="[-- SERVER COMMAND...]", help="Launch mode: start this server command as a child (after `--`), collect from it, stop it at the end."),
    url: Optional[str] = typer.Option(None, help="Base URL of the SGLang DSpark server, e.g. http://127.0.0.1:30000. Launch mode: default from the command's --host/--port."),
    out: str = typer.Option(..., help="Where the store lives: a directory (created if missing) or an object-store URL such as s3://bucket/prefix (pyarrow options in the query, e.g. ?endpoint_override=host:9000&scheme=http)."),
    run_id: Optional[str] = typer.Option(None, help="Run id (default: run-YYYYmmddTHHMMSS, UTC). Letters, digits, '.', '_', '-'."),
    workload: Optional[str] = typer.Option(None, help="Drive traffic too: comma-separated workloads, e.g. gsm8k,arena-hard,poetry."),
    requests: Optional[int] = typer.Option(None, callback=in_range(1), show_default=False, help="With --workload: how many requests to send (>= 1) [default: 90]."),
    concurrency: Optional[int] = typer.Option(None, callback=in_range(1), show_default=False, help="With --workload: requests in flight (>= 1) [default: 32]."),
    temperature: float = typer.Option(0.0, callback=in_range(0.0), help="With --workload: sampling temperature (0 = greedy)."),
    max_new_tokens: int = typer.Option(256, callback=in_range(1), help="With --workload: output limit per request (>= 1)."),
    seed: int = typer.Option(0, help="With --workload: seed for prompts and per-request sampling_seed."),
    api: str = typer.Option("generate", help="With --workload: generate (/generate) | openai or completions (/v1/completions) | chat (/v1/chat/completions); OpenAI requests set return_spec_tokens_details and logprobs."),
    poll_interval: float = typer.Option(1.0, callback=positive, help="Seconds between /server_info polls (> 0)."),
    clear_at: int = typer.Option(2000, callback=in_range(0), help="Clear the server's record deque once it holds this many records (each clear loses ~1 step, reported as a gap); 0 never clears."),
    flush_interval: float = typer.Option(5.0, callback=positive, help="Seconds between Parquet commits (the most a crash can lose)."),
    max_buffer_mb: float = typer.Option(256.0, callback=positive, help="Write backlog bound in MiB; beyond it batches are dropped, counted and recorded as write_backlog gaps (the poll loop never waits on disk)."),
    duration: Optional[float] = typer.Option(None, callback=positive, help="Without --workload: stop after this many seconds (default: until Ctrl-C, or until a launched server exits)."),
    label: list[str] = typer.Option([], help="KEY=VALUE label stored on the run; repeatable."),
    redact_text: bool = typer.Option(False, help="Store no prompt or output text (requests and dead letters), and no tokens table: output token ids, their logprobs and top-k spell the text (unless --keep-token-ids)."),
    keep_token_ids: bool = typer.Option(False, help="With --redact-text: still store the tokens table (output token ids, logprobs, top-k)."),
    metrics_port: Optional[int] = typer.Option(None, callback=in_range(0, 65535), help="Serve the sidecar's own Prometheus metrics (dspark_obs:*) on this port (0 picks one)."),
    metrics_host: str = typer.Option("127.0.0.1", help="Address for --metrics-port; keep loopback unless you mean it."),
    writer_id: Optional[str] = typer.Option(None, help="Object-store output: id in every file name so sidecars write side by side (default HOST.PID)."),
    layout: str = typer.Option("flat", help="flat: part files per run | fleet: hive partitions run_id/date/dp_rank, files sorted by rid in small row groups, visible once the writer's manifest commits them (many sidecars, one run; see the README's layout contract)."),
    estimator_jsonl: Optional[Path] = typer.Option(None, help="Launch mode: have the server write SGLang's block-accept estimator JSONL here (sets SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH and SGLANG_DSPARK_FOLDED_PROPOSAL=0) and import it into estimator_records at the end."),
    startup_timeout: float = typer.Option(1800.0, callback=positive, help="Launch mode: seconds to wait for the server's /health."),
    shutdown_timeout: float = typer.Option(30.0, callback=in_range(0.0), help="Launch mode: seconds between forwarding SIGTERM/SIGINT and SIGKILL."),
    server_log: Optional[Path] = typer.Option(None, help="Launch mode: append the server's stdout and stderr here instead of this terminal."),
    resume: bool = typer.Option(False, help="Continue an existing --run-id: the cursor goes on from what the store holds (no record stored twice), finished requests are not sent again, re-sent ones get new rids, the earlier ending is kept in the run's labels. Without it an existing run is refused."),
    include_held: bool = typer.Option(False, help="Also store the records the server already held when the run started (default: the run starts after them, so earlier traffic never joins it)."),
    poll_timeout: float = typer.Option(10.0, callback=positive, help="Seconds one /server_info poll (or clear) may take; a poll that takes longer is a poll_stall gap."),
    request_retries: int = typer.Option(5, callback=in_range(0, 100), help="With --workload: retries of a request that met a connection error (backoff 0.25 s doubling to 4 s); a request still failing is a request_failed gap."),
    request_log: Optional[Path] = typer.Option(None, help="Attach mode on production traffic: follow SGLang's request log (server started with --log-requests --log-requests-format json --log-requests-level 3, its log written to FILE) from where it ends now, rotation-safe, and store each finished request's output_ids and logprobs (requests, tokens) beside its steps."),
    ceiling_fit: Optional[Path] = typer.Option(None, help="With --metrics-port: the ceiling fit of an earlier run of this deployment (`dspark-obs estimate --fit-out FILE`), so the live ceiling estimates sampled requests too (tokens_lost_sampled_*_total), as `estimate --fit-in FILE` would."),
) -> None:
    """Collect a run from a live server into the store (attach mode), or launch the server and collect (launch mode).

    Polls `/server_info` by high-water mark on `forward_ct`, reports lost records as gaps,
    and with `--workload` drives closed-loop traffic itself (run-scoped rids like `gsm8k-000017@RUN`,
    logprobs and top-5 requested) so that `requests` and `tokens` are filled too.

    Attach: `dspark-obs collect --url http://127.0.0.1:30000 --out data --workload gsm8k,poetry --requests 60`

    Launch: `SGLANG_RAGGED_VERIFY_MODE=compact dspark-obs collect --out data -- python -m sglang.launch_server --speculative-algorithm DSPARK ...`

    Exit codes: 0 the run ended (completed, or stopped by a signal) with every loss a row in gaps;
    1 the run ended in error, rows could not be written or every request failed (the run is closed
    with the reason); 2 it could not start (options, server, an existing run without --resume).
    \f
    Long: typer declares the options in the signature, one a line (the help above is this docstring up to the
    form feed); the body only checks them and calls the library.
    """
    # at call time: the CLI imports every command module to declare its options
    from collectors.sglang.session import CollectOptions
    from dspark_obs.store import validate_run_id

    if run_id is not None:
        try:
            validate_run_id(run_id)
        except ValueError as exc:
            _fail(str(exc))
    if not server_command and not url:
        _fail("give --url (attach mode) or a server command after '--' (launch mode), e.g. "
              "dspark-obs collect --out data -- python -m sglang.launch_server --port 30000 ...")
    drive, requests, concurrency = _drive_spec(workload, duration, requests, concurrency, temperature=temperature,
                                               max_new_tokens=max_new_tokens, seed=seed, redact_text=redact_text,
                                               api=api, retries=request_retries)
    if poll_interval <= 0 or flush_interval <= 0 or max_buffer_mb <= 0 or poll_timeout <= 0:
        _fail("--poll-interval, --poll-timeout, --flush-interval and --max-buffer-mb must be > 0")
    store = _open_out(out, writer_id=writer_id, layout=layout)
    opts = CollectOptions(url=(url or "").rstrip("/"), run_id=run_id or _default_run_id("run"),
                          poll_interval=poll_interval, clear_at=clear_at, flush_interval=flush_interval,
                          duration=duration, drive=drive, labels=_parse_labels(label),
                          max_buffer_bytes=int(max_buffer_mb * (1 << 20)), redact_text=redact_text,
                          resume=resume, include_held=include_held, poll_timeout=poll_timeout,
                          keep_token_ids=keep_token_ids, request_log=str(request_log) if request_log else None)
    fit = _ceiling_fit(ceiling_fit, metrics_port)
    launch = None
    if server_command:
        # at call time: the CLI imports every command module to declare its options
        from collectors.sglang.launcher import LaunchSpec

        launch = LaunchSpec(list(server_command), url=url, startup_timeout=startup_timeout,
                            shutdown_timeout=shutdown_timeout,
                            estimator_jsonl=str(estimator_jsonl) if estimator_jsonl else None,
                            log_path=str(server_log) if server_log else None)
    elif estimator_jsonl:
        _fail("--estimator-jsonl needs launch mode (a server command after '--'); "
              "for an existing file use: dspark-obs ingest --estimator-jsonl FILE")
    console.print(f"collecting run {opts.run_id} from {opts.url or 'the launched server'} into {out}"
                  + (f" ({requests} requests, concurrency {concurrency})" if drive else
                     f" (for {duration:g} s)" if duration else " (until Ctrl-C)"), soft_wrap=True, highlight=False)
    summary = run_collector(store, opts, total_requests=requests if drive else None,
                             metrics_port=metrics_port, metrics_host=metrics_host, launch=launch, ceiling_fit=fit)
    _print_summary(summary, out)
    _exit_for(summary)


def _drive_spec(workload: Optional[str], duration: Optional[float], requests: Optional[int],
                concurrency: Optional[int], **spec):
    """``(DriveSpec or None, requests, concurrency)`` for ``--workload`` and its options; a clear error when an
    option does nothing without the others."""
    from collectors.sglang.driver import DriveSpec  # at call time: the driver imports httpx (CLI start-up)

    if workload and duration is not None:
        _fail(f"--duration {duration:g} does nothing with --workload: a driven run ends when its --requests "
              "are done; drop --duration, or drop --workload to collect for a fixed time")
    if not workload and (requests is not None or concurrency is not None):
        flag = "--requests" if requests is not None else "--concurrency"
        _fail(f"{flag} does nothing without --workload (this run only observes the server's traffic); "
              "add --workload gsm8k,poetry to drive requests, or drop it")
    requests = 90 if requests is None else requests
    concurrency = 32 if concurrency is None else concurrency
    if not workload:
        return None, requests, concurrency
    names = [w.strip() for w in workload.split(",") if w.strip()]
    try:
        return DriveSpec(names, requests, concurrency=concurrency, **spec), requests, concurrency
    except ValueError as exc:
        _fail(f"--api: {exc}")


def _open_out(out: str, *, writer_id: Optional[str], layout: str):
    """The store behind ``--out``; a local directory is created if missing (a file there is an error)."""
    from dspark_obs.store import is_url, open_store  # at call time: the store imports pyarrow (CLI start-up)

    if not is_url(out):
        local_out = Path(out[len("file://"):] if out.startswith("file://") else out)
        if local_out.exists() and not local_out.is_dir():
            _fail(f"--out {out} is a file, not a directory; give a directory for the store (created if missing)")
        try:
            local_out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _fail(f"--out {out}: cannot create the store directory: {exc}")
    try:
        return open_store(out, writer_id=writer_id, layout=layout)
    except (ValueError, OSError) as exc:
        _fail(f"--out {out}: {exc}")


def _ceiling_fit(path: Optional[Path], metrics_port: Optional[int]):
    """``--ceiling-fit``'s fit (None without it); it needs ``--metrics-port``."""
    if path is None:
        return None
    from dspark_obs.estimators.ceiling.fit import CeilingFit  # at call time: numpy and scipy (CLI start-up)

    if metrics_port is None:
        _fail("--ceiling-fit feeds the live ceiling of the sidecar's metrics: give --metrics-port too")
    try:
        return CeilingFit.load(path)
    except ValueError as exc:
        _fail(f"--ceiling-fit {exc}")


def _exit_for(summary) -> None:
    """Exit 1 when the run ended in error or lost rows it could not even record (see collect's help)."""
    problems = []
    if summary.end_reason.startswith("error"):
        problems.append(f"the run ended in {summary.end_reason}")
    if summary.rows_failed:
        problems.append(f"{summary.rows_failed} rows could not be written")
    problems += [e for e in summary.write_errors if e.startswith(("runs:", "gaps:"))]
    if problems:
        # at call time: the CLI imports every command module to declare its options
        from rich.markup import escape

        console.print(f"[red]error:[/red] {escape('; '.join(problems))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1)


def run_collector(store, opts, total_requests: Optional[int], *, metrics_port: Optional[int] = None,
                   metrics_host: str = "127.0.0.1", launch=None, ceiling_fit=None):
    # at call time: the CLI imports every command module to declare its options
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from collectors.sglang.metrics import SidecarMetrics
    from collectors.sglang.session import CollectError, Collector
    from dspark_obs.collect_progress import CollectProgress

    metrics = SidecarMetrics(health=metrics_port is not None, ceiling_fit=ceiling_fit)
    if metrics_port is not None:
        try:
            port = metrics.serve(metrics_port, metrics_host)
        except OSError as exc:
            _fail(f"--metrics-port {metrics_port}: {exc}")
        console.print(f"sidecar metrics on http://{metrics_host}:{port}/metrics")
    show = sys.stderr.isatty()
    on_progress = CollectProgress(opts.run_id, total_requests=total_requests,
                                  concurrency=opts.drive.concurrency if opts.drive else 1,
                                  emit=lambda text: console.print(text, soft_wrap=True, highlight=False))
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=10), MofNCompleteColumn(),
                      TextColumn("{task.fields[steps]} steps, {task.fields[rows]} rows stored, "
                                 "{task.fields[gaps]} gaps"), TimeElapsedColumn(),
                      console=console, disable=not show, transient=True) as progress:
            task = progress.add_task(opts.run_id, total=total_requests, steps=0, rows=0, gaps=0)
            if show:
                on_progress.bar = (progress, task)

            async def attach():
                collector = on_progress.collector = Collector(store, opts, on_progress, metrics)
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, collector.stop, sig.name)
                return await collector.run()

            try:
                if launch is None:
                    return asyncio.run(attach())
                # at call time: the CLI imports every command module to declare its options
                from collectors.sglang.launcher import LaunchError

                try:
                    return asyncio.run(launch_and_collect(store, opts, launch, on_progress, metrics))
                except LaunchError as exc:
                    _fail(str(exc))
            except CollectError as exc:
                _fail(str(exc))
    finally:
        metrics.close()


async def launch_and_collect(store, opts, spec, on_progress, metrics):
    """Launch mode: child up, healthy, collect, forward the signal, import the estimator JSONL.

    Long: the signal handlers must cover every await from the launch to the shutdown in one frame.
    """
    # at call time: the CLI imports every command module to declare its options
    import asyncio

    from collectors.sglang.launcher import ChildServer
    from collectors.sglang.session import CollectError, Collector
    from dspark_obs.collect_progress import CollectProgress

    child = ChildServer(spec)
    opts.url, opts.mode = opts.url or child.url, child.mode
    opts.labels.setdefault("launch_mode", "true")
    loop = asyncio.get_running_loop()
    received: list[int] = []
    early_stop = asyncio.Event()
    collector: list = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        if collector:
            collector[0].stop(sig.name)
        early_stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    await child.start()
    console.print(f"launched {' '.join(child.command)[:200]} (pid {child.proc.pid}, "
                  f"{child.mode}); waiting for {child.url}/health")
    try:
        healthy = await child.wait_healthy(early_stop)
    except BaseException:
        await child.shutdown()
        raise
    if not healthy:
        await child.shutdown(received[0] if received else signal.SIGTERM)
        raise CollectError(f"interrupted by {received[0].name if received else 'a signal'} before "
                           f"{child.url} was healthy; nothing was collected")
    col = Collector(store, opts, on_progress, metrics)
    if isinstance(on_progress, CollectProgress):
        on_progress.collector = col
    collector.append(col)
    if received:
        col.stop(received[0].name)

    async def before_close():
        return await child.shutdown(received[0] if received else signal.SIGTERM)

    try:
        summary = await col.run(server_exit=child.exit, before_close=before_close)
    except BaseException:
        await child.shutdown(received[0] if received else signal.SIGTERM)
        raise
    if spec.estimator_jsonl:
        # at call time: the CLI imports every command module to declare its options
        from collectors.importers.estimator import import_estimator_jsonl

        try:
            res = await asyncio.to_thread(import_estimator_jsonl, store, opts.run_id, spec.estimator_jsonl,
                                          redact_text=opts.redact_text)
            console.print(f"estimator JSONL: {res.total_rows} rows imported into estimator_records, "
                          f"{res.dead_letters} dead letters")
        except OSError as exc:
            console.print(f"[yellow]estimator JSONL {spec.estimator_jsonl} not imported: {exc}[/yellow]")
    return summary


def _print_summary(s, out) -> None:
    console.print(
        f"run [bold]{s.run_id}[/bold] ({s.mode}, gamma {s.gamma}, dp {s.dp_size}): "
        f"{s.steps} steps, {s.step_reqs} request-steps, {s.requests} requests"
        f"{f' ({s.failed_requests} failed)' if s.failed_requests else ''}, {s.tokens} tokens; "
        f"{s.gaps} gaps ({s.lost_forward_cts} forward_cts at most"
        f"{f' plus {s.open_gaps} of unknown length' if getattr(s, 'open_gaps', 0) else ''}, {s.clears} clears), "
        f"{s.dead_letters} dead letters, {s.rows_dropped} rows dropped"
        f"{f', {s.requests_missing_steps} requests missing steps' if getattr(s, 'requests_missing_steps', 0) else ''}"
        f"{f', {s.rows_failed} rows failed to write' if getattr(s, 'rows_failed', 0) else ''}; "
        f"ended: {s.end_reason}; {s.elapsed_s:.1f}s -> {out}", soft_wrap=True
    )


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_interspersed_args": False})(collect)
