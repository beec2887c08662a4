"""``dspark-obs companion``: the option checks in front of :func:`collectors.sglang.companion_run.run_companion`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import in_range, positive


def companion(
    of: str = typer.Option(..., "--of", help="Run to replay (its requests, prompts and sampling seeds)."),
    url: str = typer.Option(..., help="Base URL of the cap-accept server (SGLANG_RAGGED_VERIFY_MODE=cap-accept), e.g. http://127.0.0.1:30001."),
    out: str = typer.Option(..., help="Data root holding RUN; the companion run is written there too."),
    run_id: Optional[str] = typer.Option(None, help="Companion run id (default: RUN-cap-YYYYmmddTHHMMSS, UTC)."),
    sample: Optional[int] = typer.Option(None, callback=in_range(1), help="Replay a seeded uniform sample of N requests (in their original order)."),
    fraction: Optional[float] = typer.Option(None, callback=in_range(0.0, 1.0), help="Replay this share (0, 1] of the requests instead of --sample."),
    seed: int = typer.Option(0, help="Seed of --sample / --fraction."),
    concurrency: Optional[int] = typer.Option(None, callback=in_range(1), help="Requests in flight (default: the run's, from requests.concurrency, its labels or its steps)."),
    log_requests: Optional[Path] = typer.Option(None, help="Inputs from SGLang's request log (--log-requests --log-requests-format json --log-requests-level 3), for runs observed in attach mode."),
    prompts: Optional[Path] = typer.Option(None, help="Inputs from a JSONL of {rid, text | input_ids, sampling_params?, output_ids?}."),
    rid_suffix: str = typer.Option("", help="Append this to each rid for its replay (default: rids unchanged)."),
    rid_pattern: Optional[str] = typer.Option(None, help="Regex with a group naming the workload in a rid, for file inputs (default: WORKLOAD-NUMBER, e.g. gsm8k-000017)."),
    label: list[str] = typer.Option([], help="KEY=VALUE label stored on the companion run; repeatable."),
    poll_interval: float = typer.Option(1.0, callback=positive, help="Seconds between /server_info polls (> 0)."),
    flush_interval: float = typer.Option(5.0, callback=positive, help="Seconds between Parquet commits (> 0)."),
) -> None:
    """Replay a run's requests on a cap-accept server and pair the steps: the ceiling's truth.

    Same prompts (token ids where known, else text), same sampling parameters and
    sampling_seed, the run's concurrency and order; refuses a server that is not in
    cap-accept mode. Writes the companion run (`companion_of` = RUN) and the tables
    `companion_pairing` / `companion_pairing_summary`.

    Example: `dspark-obs companion --of run-0412 --url http://127.0.0.1:30001 --out data --sample 200`
    \f
    Long: typer declares the options in the signature, one a line (the help above is this docstring up to the
    form feed); the body only checks them and calls the library.
    """
    # at call time: the CLI imports every command module to declare its options
    from collectors.workloads import WorkloadResolver
    from collectors.sglang.companion import CompanionError
    from collectors.sglang.companion_run import CompanionOptions, format_summary, measure, prepare
    from collectors.sglang.session import CollectError
    from dspark_obs.commands.collect import run_collector
    from dspark_obs.console import console, fail, parse_labels
    from dspark_obs.store import open_store
    from dspark_obs.store import validate_run_id

    if sample is not None and fraction is not None:
        fail("give --sample N or --fraction F, not both")
    if sample is not None and sample < 1:
        fail(f"--sample must be >= 1, got {sample}")
    if fraction is not None and not 0 < fraction <= 1:
        fail(f"--fraction must be in (0, 1], got {fraction}")
    if concurrency is not None and concurrency < 1:
        fail(f"--concurrency must be >= 1, got {concurrency}")
    if poll_interval <= 0 or flush_interval <= 0:
        fail("--poll-interval and --flush-interval must be > 0")
    for flag, path in (("--log-requests", log_requests), ("--prompts", prompts)):
        if path is not None and not path.is_file():
            fail(f"{flag} {path}: no such file")
    try:
        validate_run_id(of)
        if run_id is not None:
            validate_run_id(run_id)
        resolver = WorkloadResolver(rid_pattern)
        store = open_store(out)
    except (ValueError, OSError) as exc:
        fail(str(exc))
    opts = CompanionOptions(of=of, url=url, run_id=run_id, sample=sample, fraction=fraction, seed=seed,
                            concurrency=concurrency, log_requests=log_requests, prompts=prompts,
                            rid_suffix=rid_suffix, labels=parse_labels(label), poll_interval=poll_interval,
                            flush_interval=flush_interval, workload=resolver)
    try:
        check, plan, copts, cleared = prepare(store, opts)
    except CompanionError as exc:
        fail(str(exc))
    for where, why in plan.problems[:10]:
        console.print(f"[yellow]{where}: {why}[/yellow]")
    if len(plan.problems) > 10:
        console.print(f"[yellow]... {len(plan.problems) - 10} more input problems[/yellow]")
    for note in plan.notes:
        console.print(f"[yellow]{note}[/yellow]")
    console.print(f"{check.url} is {check.mode} (gamma {check.gamma}, dp {check.dp_size})"
                  f"{'; cleared its earlier records' if cleared else ''}; replaying {len(plan.requests)} "
                  f"requests of {of} as run {copts.run_id} at concurrency {plan.concurrency}")
    try:
        summary = run_collector(store, copts, total_requests=len(plan.requests))
    except CollectError as exc:
        fail(str(exc))
    _, row = measure(store, plan, copts.run_id)
    console.print(f"run [bold]{copts.run_id}[/bold] ({summary.mode}, companion of {of}): {summary.steps} "
                  f"steps, {summary.requests} requests; ended: {summary.end_reason}")
    console.print(format_summary(row))
    console.print(f"per request: dspark-obs sql --data {out} \"select * from companion_pairing "
                  f"where run_id = '{copts.run_id}' and status <> 'identical'\"")


def register(app: typer.Typer) -> None:
    app.command()(companion)
