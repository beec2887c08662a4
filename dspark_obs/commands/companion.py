"""``dspark-obs companion``: replay a run on a cap-accept server and pair the two.

:func:`run_companion` is the library function (the demo calls it):
:func:`prepare` checks the server (cap-accept, same block size), plans the
replay (:mod:`collectors.sglang.companion`) and empties the server's record
deque; the collector then replays while polling as usual (``companion_of``
set on the new run); :func:`measure` compares every replay's committed tokens
with the original's and writes ``companion_pairing`` (per request) and
``companion_pairing_summary`` (one row) under the companion run.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer

from dspark_obs.console import in_range, positive

if TYPE_CHECKING:  # the collector, DuckDB and Arrow load when a companion runs, not with the CLI
    import pyarrow as pa

    from collectors.sglang.companion import ReplayPlan, ServerCheck
    from collectors.sglang.session import CollectOptions, CollectSummary


@dataclass
class CompanionOptions:
    of: str  # run to replay
    url: str  # the cap-accept server
    run_id: Optional[str] = None  # default: <of>-cap-<UTC time>
    sample: Optional[int] = None
    fraction: Optional[float] = None
    seed: int = 0
    concurrency: Optional[int] = None  # default: the run's
    log_requests: Optional[str | Path] = None
    prompts: Optional[str | Path] = None
    rid_suffix: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    poll_interval: float = 1.0
    flush_interval: float = 5.0
    top_logprobs: int = 5
    redact_text: Optional[bool] = None  # default: as the original run
    workload: Optional[Callable[[str], Optional[str]]] = None  # rid -> workload for file inputs


@dataclass
class CompanionReport:
    run_id: str
    of_run: str
    server: ServerCheck
    plan: ReplayPlan
    collect: Optional[CollectSummary]
    pairing: pa.Table  # companion_pairing rows
    summary: dict[str, Any]  # the companion_pairing_summary row
    cleared_records: bool = False


def default_run_id(of: str) -> str:
    return f"{of}-cap-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%S')}"


def prepare(store, opts: CompanionOptions) -> tuple[ServerCheck, ReplayPlan, CollectOptions, bool]:
    """Check the server, plan the replay, empty the server's deque; nothing is written yet."""
    from collectors.importers import WorkloadResolver
    from collectors.sglang.companion import (
        CompanionError, check_server, clear_records, collect_options, plan_replay, require_cap_accept,
    )
    from dspark_obs import sql as sqlmod

    url = opts.url.rstrip("/")
    run_id = opts.run_id or default_run_id(opts.of)
    check = check_server(url)
    require_cap_accept(check)
    if run_id in store.runs():
        raise CompanionError(f"run {run_id!r} already exists in {store.root}: choose another --run-id "
                             "(a companion is always a new run)")
    con = sqlmod.connect(store.root)
    plan = plan_replay(store, con, opts.of, log_requests=opts.log_requests, prompts=opts.prompts,
                       sample=opts.sample, fraction=opts.fraction, seed=opts.seed, concurrency=opts.concurrency,
                       rid_suffix=opts.rid_suffix, workload=opts.workload or WorkloadResolver())
    require_cap_accept(check, gamma=plan.gamma)
    redact = opts.redact_text if opts.redact_text is not None else plan.run_labels.get("redact_text") == "true"
    copts = collect_options(plan, url=url, run_id=run_id, labels=opts.labels,
                            poll_interval=opts.poll_interval, flush_interval=opts.flush_interval,
                            top_logprobs=opts.top_logprobs, redact_text=redact)
    cleared = clear_records(url) if check.records_held else False
    return check, plan, copts, cleared


def _tokens(con, run: str, rids: set[str]) -> pa.Table:
    import pyarrow as pa  # at call time: Arrow's import is most of the CLI's start-up
    import pyarrow.compute as pc

    table = con.sql("SELECT rid, pos, token_id FROM tokens WHERE run_id = $run",
                    params={"run": run}).to_arrow_table()
    return table.filter(pc.is_in(table.column("rid"), value_set=pa.array(sorted(rids), pa.string())))


def measure(store, plan: ReplayPlan, run_id: str) -> tuple[pa.Table, dict[str, Any]]:
    import pyarrow as pa  # at call time: Arrow's import is most of the CLI's start-up

    """Identity per request and the step pairing of ``run_id`` against ``plan.of_run``; writes both tables."""
    from dspark_obs import sql as sqlmod
    from dspark_obs.estimators import pairing

    con = sqlmod.connect(store.root)
    finished = {r for r, in con.execute("SELECT DISTINCT rid FROM requests WHERE run_id = $run",
                                        {"run": run_id}).fetchall()}
    crids = plan.companion_rids
    original = _tokens(con, plan.of_run, set(plan.inputs))
    have = set(original.column("rid").to_pylist())
    extra = [(rid, pos, tok) for rid, entry in plan.inputs.items() if rid not in have and entry.output_ids
             for pos, tok in enumerate(entry.output_ids)]  # originals known only from the input file
    if extra:
        rid, pos, tok = zip(*extra)
        original = pa.concat_tables([original, pa.table({"rid": pa.array(rid, pa.string()),
                                                         "pos": pa.array(pos, pa.int32()),
                                                         "token_id": pa.array(tok, pa.int32())}
                                                        ).cast(original.schema)])
    companion = _tokens(con, run_id, set(crids.values()))
    requests = pa.Table.from_pylist(
        [{"rid": rid, "companion_rid": crids[rid], "replayed": crids[rid] in finished,
          "input_kind": entry.input_kind, "input_source": entry.source} for rid, entry in plan.inputs.items()]
        + [{"rid": rid, "companion_rid": None, "replayed": False, "input_kind": None, "input_source": None}
           for rid in plan.no_inputs],
        schema=pa.schema([("rid", pa.string()), ("companion_rid", pa.string()), ("replayed", pa.bool_()),
                          ("input_kind", pa.string()), ("input_source", pa.string())]))
    table, counts = pairing.pairing_report(con, run=plan.of_run, companion=run_id, requests=requests,
                                           original_tokens=original, companion_tokens=companion)
    summary = {"of_run": plan.of_run, "run_requests": plan.run_requests, **counts,
               "sampling_without_seed": plan.sampling_without_seed, "concurrency": plan.concurrency,
               "concurrency_source": plan.concurrency_source, "sample": plan.sample, "rid_suffix": plan.rid_suffix}
    for name in ("companion_pairing", "companion_pairing_summary"):
        if hasattr(store, "drop_run"):
            store.drop_run(name, run_id)
    store.write("companion_pairing", run_id, table)
    store.write("companion_pairing_summary", run_id, [summary])
    return table, summary


def run_companion(store, opts: CompanionOptions, *,
                  progress: Callable[[str, int], None] = lambda kind, n: None) -> CompanionReport:
    """Replay ``opts.of`` on the cap-accept server at ``opts.url`` into a new run, and pair it.

    Raises :class:`~collectors.sglang.companion.CompanionError` (server not in
    cap-accept mode, run or inputs missing) before anything is written, and
    :class:`~collectors.sglang.session.CollectError` if collection cannot start.
    """
    from collectors.sglang.session import collect

    check, plan, copts, cleared = prepare(store, opts)
    summary = collect(store, copts, progress)
    table, counts = measure(store, plan, copts.run_id)
    return CompanionReport(copts.run_id, opts.of, check, plan, summary, table, counts, cleared)


def format_summary(s: dict[str, Any]) -> str:
    """One paragraph: identity and pairing figures of a ``companion_pairing_summary`` row."""
    share = "-" if s.get("pairing_share") is None else f"{s['pairing_share']:.1%}"
    parts = [f"replayed {s['replayed']} of {s['selected']} selected requests ({s['sample']}; "
             f"{s['run_requests']} in the run, {s['no_inputs']} without inputs) at concurrency "
             f"{s['concurrency']} ({s['concurrency_source']})",
             f"identical {s['identical']}, diverged {s['diverged']}, unverified {s['unverified']}, "
             f"failed {s['failed']}",
             f"paired steps {s['paired_steps']} of {s['pairable_steps']} ({share}); "
             f"{s['excluded_steps']} steps of diverged or failed requests excluded"]
    return "; ".join(parts)


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
    from collectors.importers import WorkloadResolver
    from collectors.sglang.companion import CompanionError
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
