"""``dspark-obs estimate``: the block-accept (ceiling) estimator over one run.

Estimates, per request-step, what a full-block verify would have accepted
(table ``ceiling``), summarises it per workload with bootstrap CIs
(``ceiling_summary``), and checks it against a truth when one exists
(``ceiling_validation``).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from dspark_obs.engine_options import DATA_ROOT_HELP, ENGINE, JOBS, PRELOAD, RAY_ADDRESS, RAY_WORKERS, WARM, data_root, engine_for
from dspark_obs.console import FORMAT_HELP, check_choice, check_format, fail, in_range, print_table
from rich import box
from rich.table import Table

from dspark_obs.console import console as err  # noqa: E402
METHOD_CHOICES = ("default", "sglang")




def estimate(
    ctx: typer.Context,
    data: str = typer.Option(..., help=DATA_ROOT_HELP),
    run: Optional[str] = typer.Option(None, help="Run to estimate (a compact run; cap-accept and static runs "
                                                 "validate against themselves). Default: the store's only compact run."),
    companion: Optional[str] = typer.Option(None, help="Cap-accept run of the same prompts and seeds to validate "
                                                       "against. Default: the run stored with companion_of = RUN."),
    method: str = typer.Option("default", help="default (bounds that hold for any drafter + an expectation "
                                               "learnt from the run's verified drafts) | sglang (SGLang's own "
                                               "interval rule, mid = (lo + hi) / 2)."),
    sglang_jsonl: Optional[Path] = typer.Option(None, "--sglang-jsonl", help="SGLang's block-accept estimator "
                                                "JSONL (SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH): its draft "
                                                "logprobs make a_k = min(1, p/q) exact for the steps it covers."),
    bootstrap: int = typer.Option(1000, callback=in_range(0), help="Request-level bootstrap resamples for the summary's 95% CIs; 0 = no CI."),
    seed: int = typer.Option(0, help="Seed of the bootstrap (same seed, same intervals)."),
    temperature: Optional[float] = typer.Option(None, min=0.0, help="Sampling temperature of requests whose run "
                                                "recorded none (0 = greedy), e.g. a run ingested from /generate "
                                                "bodies. Default: inferred from the committed tokens' top-1."),
    fit_out: Optional[Path] = typer.Option(None, help="Write the fit behind the sampled requests' estimate (acceptance "
                                           "model, drafter map, binned prior) as JSON, for `collect --ceiling-fit "
                                           "FILE` (the sidecar's live ceiling) and `--fit-in`."),
    fit_in: Optional[Path] = typer.Option(None, help="Use this fit (from --fit-out on an earlier run of the same "
                                          "deployment) instead of fitting on the run: the numbers the sidecar's "
                                          "live ceiling used."),
    format: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    engine: str = ENGINE,
    ray_address: Optional[str] = RAY_ADDRESS,
    ray_workers: Optional[int] = RAY_WORKERS,
    jobs: Optional[int] = JOBS,
) -> None:
    """Estimate the hidden ceiling: what a full-block verify would have accepted, per request-step.

    In compact mode a step that accepts its whole window (window = verify_len - 1 < gamma) is
    **censored**: the drafts it trimmed were never checked.  The estimator compares them with the
    tokens the request committed later (the `tokens` table, collected by the driver with
    logprobs and top-5), as SGLang's own block-accept estimator does:

    * **greedy** requests: exact wherever the output continues past the trimmed drafts; an
      interval only where the output ends first (at EOS nothing more is accepted);
    * **temperature** requests: `lo`/`hi` bound the expected acceptance for any drafter, and `mid`
      is the expectation, learnt from the drafts this run did verify.  Give `--sglang-jsonl` for
      exact acceptance probabilities (tight intervals).

    **Sampling** per request: the temperature the run recorded (driver, request log), else
    `--temperature`, else inferred — a request that commits the target's top-1 everywhere, on an
    output long enough that a sampled request would do so with probability under 1e-3, is greedy;
    one token off the top-1 makes it sampled.  The counts are printed; `ceiling.sampling_source`
    says which per step.

    Writes `ceiling` (lo/mid/hi in drafts, 0..gamma, and SGLang's category per step),
    `ceiling_summary` (per workload and `*`: accept lengths and utilisation = accepted / ceiling,
    with request-bootstrap CIs) and, with a truth — a cap-accept companion, the run's own
    cap-accept/static steps, or the emulator's — `ceiling_validation` (bias, MAE, coverage by
    category, workload and 8 equal-count bins of mid).  Re-running replaces the run's results.

    Examples:

    `dspark-obs estimate --data demo-data`

    `dspark-obs estimate --data D --run compact-run --companion cap-run --method sglang`

    `dspark-obs estimate --data s3://bucket/fleet --run night-1 --engine ray --ray-address ray://head:10001`

    `dspark-obs sql --data D "select category, count(*), avg(mid), avg(hi - lo) from ceiling group by 1"`

    `dspark-obs estimate --data D --run yesterday --fit-out fit.json`, then
    `dspark-obs collect --url URL --out D --metrics-port 9464 --ceiling-fit fit.json`: a live ceiling for
    sampled requests; `dspark-obs estimate --data D --run today --fit-in fit.json` gives the same sums.
    \f
    Long: typer declares the options in the signature, one a line (the help above is this docstring up to the
    form feed); the body only checks them and calls the library.
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import sql as sqlmod
    from dspark_obs.estimators import ceiling as ceil
    from dspark_obs.estimators.ceiling.jsonl import logprobs_from_sglang_jsonl

    check_format(format)
    check_choice("--method", method, METHOD_CHOICES)
    data = data_root(data)
    ray = engine_for(engine, ray_address, ray_workers, jobs, preload=PRELOAD["estimate"], ctx=ctx,
                     warm=WARM["estimate"])
    con = sqlmod.connect(data)
    run = run or _only_compact_run(con)
    known = {r[0] for r in con.sql("SELECT DISTINCT run_id FROM step_reqs").fetchall()}
    if run not in known:
        fail(f"--run {run!r} has no request-steps in {data}; runs with steps: {', '.join(sorted(known)) or 'none'}")
    if companion is not None and companion not in known:
        fail(f"--companion {companion!r} has no request-steps in {data}; runs with steps: {', '.join(sorted(known))}")
    _layout_note(data, run)
    logprobs = None
    if sglang_jsonl is not None:
        logprobs = logprobs_from_sglang_jsonl(_read_jsonl(sglang_jsonl), gamma=_gamma(con, run))
        err.print(f"{sglang_jsonl}: draft logprobs for {logprobs.num_rows} censored steps")
    fit = None
    if fit_in is not None:
        # at call time: the CLI imports every command module to declare its options
        from dspark_obs.estimators.ceiling.fit import CeilingFit

        try:
            fit = CeilingFit.load(fit_in)
        except ValueError as exc:
            fail(f"--fit-in {exc}")
    try:
        with step_progress(f"estimating {run}") as progress:
            result = ceil.estimate_run(con, run, companion=companion, method=method, sglang_logprobs=logprobs,
                                       n_bootstrap=bootstrap, seed=seed, progress=progress,
                                       temperature=temperature, engine=ray, fit=fit)
    except (LookupError, ValueError) as exc:
        fail(str(exc))
    if fit_out is not None:
        try:
            result.fit.save(fit_out)
        except OSError as exc:
            fail(f"--fit-out {fit_out}: {exc}")
        err.print(f"wrote the ceiling fit to {fit_out} (for `collect --ceiling-fit {fit_out}`)")
    _print_result(result, format, data=data, run=run, method=method)


def _layout_note(data, run: str) -> None:
    """A note when the run's request files overlap (a collector's): ``compact`` rewrites them once."""
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import compaction
    from dspark_obs.store import Store, is_url

    if is_url(data):
        return
    spread = compaction.fragmented_tables(Store(data), run)
    if spread:
        err.print(f"note: run {run}: {compaction.fragmented_text(spread)}; `dspark-obs compact --data {data} "
                  f"--run {run}` rewrites them once")


@contextmanager
def step_progress(description: str):
    """A transient bar on stderr, advanced by ``progress(done_steps, total_steps)`` after each chunk."""
    # at call time: the CLI imports every command module to declare its options
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} "
                  "request-steps"), TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task(description, total=0)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _print_result(result, fmt: str, *, data, run: str, method: str) -> None:
    """What ``estimate`` prints once the run is estimated: sampling, warnings, the tables, the bins' check."""
    err.print(_sampling_line(result.sampling_counts))
    if result.misaligned_requests:
        err.print(f"[yellow]warning:[/yellow] {len(result.misaligned_requests)} requests' tokens do not line up "
                  f"with their steps (e.g. {result.misaligned_requests[0]}); their trimmed drafts were not compared")
    if result.truth_source == "companion" and result.steps_with_truth == 0:
        err.print(f"[yellow]warning:[/yellow] companion {result.companion} shares no step (same request, anchor "
                  "and drafts) with this run: replay the same prompts and sampling seeds on the same server seed")
    print_table(_summary_table(result), fmt)  # folded to fit the terminal
    if result.validation is not None:
        print_table(_validation_table(result), fmt)
        bins = [r for r in result.validation.to_pylist() if r["group_kind"] == "bin" and r.get("mean_truth") is not None]
        if bins:
            held = sum(r["mean_lo"] - 1e-9 <= r["mean_truth"] <= r["mean_hi"] + 1e-9 for r in bins)
            worst = max(abs(r["mean_mid"] - r["mean_truth"]) for r in bins)
            err.print(f"{len(bins)} equal-count bins of mid: the mean truth lies in the bin's mean \\[lo, hi] in {held} "
                      f"of {len(bins)}; largest |mean mid - mean truth| {worst:.3f} drafts (how sampled steps are "
                      "judged against realisations; MAE and coverage are over greedy steps)")
    err.print(f"wrote {result.num_rows} rows to ceiling, {result.summary.num_rows} to ceiling_summary"
              f"{'' if result.validation is None else f', {result.validation.num_rows} to ceiling_validation'}"
              f" (run {run}, method {method}). Next: dspark-obs sql --data {data} "
              "\"select * from ceiling_validation where group_kind = 'bin'\"")


def _only_compact_run(con) -> str:
    rows = con.sql("SELECT DISTINCT s.run_id, r.mode FROM step_reqs s LEFT JOIN runs r USING (run_id) "
                   "ORDER BY 1").fetchall()
    compact = [r for r, mode in rows if mode == "compact"]
    if len(compact) == 1:
        return compact[0]
    listing = ", ".join(f"{r} ({mode or 'mode unknown'})" for r, mode in rows) or "none"
    fail(f"--run is needed: the store has {len(compact)} compact runs; runs: {listing}")


def _gamma(con, run: str) -> int:
    rows = con.sql("SELECT max(len(draft_tokens)) FROM step_reqs WHERE run_id = $run", params={"run": run}).fetchall()
    return int(rows[0][0] or 0)


def _read_jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        fail(f"--sglang-jsonl {path}: cannot read it ({exc.strerror}); pass the file SGLang wrote to "
              "SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH")
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            fail(f"--sglang-jsonl {path} line {i} is not JSON ({exc}); is it the block-accept estimator's file?")
    return records


def _sampling_line(counts: dict) -> str:
    """Requests per sampling and how it is known, with the flag that fixes the unknown ones."""
    parts = [f"{n} {kind} ({source})" for (kind, source), n in counts.items() if source != "unknown"]
    unknown = sum(n for (_, source), n in counts.items() if source == "unknown")
    line = "sampling: " + (", ".join(parts) or "none known")
    if unknown:
        line += (f"; [yellow]{unknown} unknown[/yellow] (estimated with the sampled rule): pass --temperature T, "
                 "ingest a request log (--request-log), or collect with top_logprobs_num >= 1")
    return line


def _fmt(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ci(row: dict, name: str) -> str:
    return f"{row[name]:.3f} ({row[name + '_ci95_low']:.2f}-{row[name + '_ci95_high']:.2f})"


def _summary_table(result) -> Table:
    table = Table(title=f"Ceiling of {result.run_id} ({result.method}): accept lengths (drafts + 1), 95% CI",
                  box=box.SIMPLE_HEAD)
    for col in ("workload", "steps", "cens.", "acc_len", "ceiling mid", "lo..hi", "utilisation"):
        table.add_column(col, justify="left" if col == "workload" else "right", no_wrap=True)
    for row in result.summary.to_pylist():
        table.add_row(row["workload"], str(row["steps"]), _fmt(row["censored_share"], 2), _ci(row, "mean_acc_len"),
                      _ci(row, "ceiling_len_mid"), f"{row['ceiling_len_lo']:.2f}..{row['ceiling_len_hi']:.2f}",
                      _ci(row, "utilisation"))
    return table


def _validation_table(result) -> Table:
    source = result.truth_source + (f" {result.companion}" if result.companion else "")
    table = Table(title=f"Censored steps vs truth ({source}), in drafts", box=box.SIMPLE_HEAD)
    for col in ("group", "n", "mid", "truth", "bias", "MAE", "coverage", "emu cov."):
        table.add_column(col, justify="left" if col == "group" else "right", no_wrap=True)
    for row in result.validation.to_pylist():
        if row["group_kind"] not in ("overall", "sampling", "category"):
            continue
        name = "all" if row["group_kind"] == "overall" else row["group"].removeprefix("censored_")
        table.add_row(name, str(row["n"]), _fmt(row["mean_mid"]), _fmt(row.get("mean_truth")), _fmt(row.get("bias")),
                      _fmt(row.get("mae")), _fmt(row.get("coverage")), _fmt(row.get("emu_coverage")))
    return table


def register(app: typer.Typer) -> None:
    app.command()(estimate)
