"""``dspark-obs ingest``: import a server's files into the store under one run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import console, fail as _fail, parse_labels as _parse_labels


def register(app: typer.Typer) -> None:
    app.command()(ingest)


def _importer(flag: str, resolver, redact_text: bool):
    """The import function of one file flag; each importer module loads only when its flag is given."""
    if flag == "--server-info":
        # at call time: the CLI imports every command module to declare its options
        from collectors.importers.serverinfo import import_server_info

        return import_server_info
    if flag in ("--generate", "--request-log"):
        # at call time: the CLI imports every command module to declare its options
        from collectors.importers.requests import import_generate, import_request_log

        fn = import_generate if flag == "--generate" else import_request_log
        return lambda store, run_id, p: fn(store, run_id, p, workload=resolver, redact_text=redact_text)
    if flag == "--estimator-jsonl":
        # at call time: the CLI imports every command module to declare its options
        from collectors.importers.estimator import import_estimator_jsonl

        return lambda store, run_id, p: import_estimator_jsonl(store, run_id, p, redact_text=redact_text)
    # at call time: the CLI imports every command module to declare its options
    from collectors.importers import artifacts

    return {"--sps-table": artifacts.import_cost_table, "--sps-records": artifacts.import_sps_records,
            "--sts": artifacts.import_sts}[flag]


def ingest(
    out: str = typer.Option(..., help="The store: a directory or an object-store URL (s3://bucket/prefix)."),
    run_id: str = typer.Option(..., help="Run to import into. Letters, digits, '.', '_', '-'."),
    server_info: list[Path] = typer.Option([], help="JSON lines, each a /server_info body (as `curl -s URL/server_info >> FILE` saves them); repeatable."),
    generate: list[Path] = typer.Option([], help="JSON lines, each a /generate response body; repeatable."),
    request_log: list[Path] = typer.Option([], help="SGLang --log-requests-format json lines and/or --export-metrics-to-file lines; repeatable."),
    estimator_jsonl: list[Path] = typer.Option([], help="SGLang's block-accept estimator JSONL (SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH) -> estimator_records; repeatable."),
    sps_table: list[Path] = typer.Option([], help="Cost table JSON (1-D or additive, --speculative-dspark-sps-table-path) -> cost_tables; repeatable."),
    sps_records: list[Path] = typer.Option([], help="SPS profiler STEM.records.jsonl / STEM.rounds.jsonl / OUT.manifest.json -> sps_records, sps_rounds; repeatable."),
    sts: list[Path] = typer.Option([], help="STS calibration JSON (--speculative-dspark-confidence-sts-path) -> sts_calibrations; repeatable."),
    workload_map: Optional[Path] = typer.Option(None, help="CSV with columns rid,workload (overrides the rid pattern) and optionally temperature (the request's sampling, 0 = greedy, for requests whose files do not say)."),
    temperature: Optional[float] = typer.Option(None, min=0.0, help="Sampling temperature of every request whose files do not say (a /generate body does not echo it); 0 = greedy. Default: `estimate` infers it from the committed tokens."),
    rid_pattern: Optional[str] = typer.Option(None, help="Regex for the workload in a rid (named group 'workload' or group 1). Default: the text before the last '-' when the rest is a number."),
    replace: bool = typer.Option(False, help="Drop the run's data and its results (estimates, calibrations, reports) first (local store only) instead of refusing an existing run."),
    redact_text: bool = typer.Option(False, help="Store no prompt or output text."),
    label: list[str] = typer.Option([], help="KEY=VALUE label stored on the run; repeatable."),
) -> None:
    """Import what an SGLang DSpark server left on disk, without a live server.

    Lines that do not fit SGLang's formats go to `dead_letters` with the reason; the import goes on.

    A `/generate` body does not say how its request was sampled: a request log (`--request-log`)
    does; else `--temperature T` or a `temperature` column in `--workload-map` state it
    (table `sampling_overrides`); else `dspark-obs estimate` infers it from the committed tokens.

    Example: `dspark-obs ingest --out data --run-id prod-1 --server-info info.jsonl --request-log metrics.log --estimator-jsonl est.jsonl`
    \f
    Long: typer declares the options in the signature, one a line (the help above is this docstring up to the
    form feed); the body only checks them and calls the library.
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.arrow_startup import keep_pandas_out

    keep_pandas_out()  # first, before any Arrow array: the importers never hand pyarrow a pandas object
    # at call time: the CLI imports every command module to declare its options
    from collectors.importers import now
    from collectors.workloads import WorkloadResolver
    from dspark_obs.store import open_store
    from dspark_obs import schema
    from dspark_obs.store import validate_run_id

    try:
        validate_run_id(run_id)
    except ValueError as exc:
        _fail(str(exc))
    files = {"--server-info": server_info, "--generate": generate, "--request-log": request_log,
             "--estimator-jsonl": estimator_jsonl, "--sps-table": sps_table, "--sps-records": sps_records,
             "--sts": sts}
    if not any(files.values()):
        _fail(f"nothing to import: give at least one of {', '.join(files)}")
    for flag, paths in files.items():
        for p in paths:
            if not p.is_file():
                _fail(f"{flag} {p}: no such file")
    try:
        resolver = (WorkloadResolver.from_csv(workload_map, rid_pattern) if workload_map
                    else WorkloadResolver(rid_pattern))
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    labels = _parse_labels(label)
    store = open_store(out)
    if run_id in {r["run_id"] for r in store.read("runs").to_pylist()}:
        if not replace:
            _fail(f"run {run_id!r} already exists in {out}; pick another --run-id or pass --replace")
        if not store.local:
            _fail("--replace works on a local store only; pick another --run-id")
        store.drop_run_everywhere(run_id)  # its results too: they describe the data being replaced

    store.upsert_run(run_id, started_at=now(), source="import",
                     labels={**labels, "imported": ",".join(f.lstrip("-") for f, p in files.items() if p),
                             **({"redact_text": "true"} if redact_text else {})})
    results = []
    for flag, paths in files.items():
        if paths:
            importer = _importer(flag, resolver, redact_text)
            results.extend(importer(store, run_id, p) for p in paths)

    _write_sampling_and_workloads(store, run_id, resolver, temperature, results)
    total_rows = sum(r.total_rows for r in results)
    run_fields = {"ended_at": now(), "end_reason": "completed"}
    if not total_rows:  # an empty or all-bad input is an error, not an empty run that looks fine
        total_dead = sum(r.dead_letters for r in results)
        if not total_dead and store.local:
            for table in schema.STORE_TABLES:
                store.drop_run(table, run_id)
            _fail(f"nothing to import: the files hold no lines; no run {run_id!r} was created", code=1)
        run_fields["end_reason"] = f"error: nothing usable imported ({total_dead} lines dead-lettered)"
    info = next((r.meta for r in results if r.meta.get("args")), None)
    if info:
        run_fields.update(mode=info["mode"], gamma=info["gamma"], dp_size=info["dp_size"],
                          server_version=info["version"], startup_time=info["startup_time"],
                          server_info=info["args"])
    store.upsert_run(run_id, **run_fields)
    total_dead = _print_results(results, run_id, out)
    if not total_rows:
        _fail(f"no usable line in the input: all {total_dead} went to dead_letters of run {run_id!r} "
              f"(see `dspark-obs sql --data {out} \"select reason from dead_letters where run_id = '{run_id}'\"`)",
              code=1)


def _write_sampling_and_workloads(store, run_id: str, resolver, temperature, results) -> None:
    """``sampling_overrides`` from ``--workload-map``'s temperatures and ``--temperature``; a ``requests`` row
    (its workload) for every rid seen in steps or estimator rows but in no imported request."""
    overrides = [{"rid": rid, "temperature": t, "source": "ingest --workload-map"}
                 for rid, t in sorted(resolver.temperatures.items())]
    if temperature is not None:
        overrides.append({"rid": None, "temperature": temperature, "source": "ingest --temperature"})
    if overrides:
        store.write("sampling_overrides", run_id, overrides)
        console.print(f"sampling_overrides: {len(overrides)} rows (estimate uses them where no temperature "
                      "was recorded)")
    # Rids seen in steps or estimator rows but in no imported request still get their workload.
    # at call time: the CLI imports every command module to declare its options
    import pyarrow as pa
    import pyarrow.compute as pc

    have = store.read("requests", run_id).column("rid")
    seen = pc.unique(pa.concat_arrays([r.seen_rids() for r in results])) if results else pa.array([], pa.string())
    seen = seen.filter(pc.invert(pc.is_in(seen, value_set=have.combine_chunks()))).to_pylist()
    if seen:
        store.write("requests", run_id, [{"rid": rid, "workload": resolver(rid)} for rid in sorted(seen)])


def _print_results(results, run_id: str, out) -> int:
    """One line per importer and the run's total; the dead letters in all."""
    for r in results:
        rows = ", ".join(f"{n} {t}" for t, n in sorted(r.rows.items())) or "no rows"
        extra = f", {r.gaps} gaps" if r.gaps else ""
        skipped = f", {r.skipped} lines skipped" if r.skipped else ""
        console.print(f"{r.kind}: {rows}{extra}, {r.dead_letters} dead letters{skipped}")
    total_dead = sum(r.dead_letters for r in results)
    console.print(f"run [bold]{run_id}[/bold]: {sum(r.total_rows for r in results)} rows imported, "
                  f"{total_dead} dead letters -> {out}")
    return total_dead
