"""``dspark-obs report``: the nightly report — gates, drift against a baseline, and a record over time.

Exit codes: 0 every gate passed, 1 a threshold or drift gate failed, 2 the
input was unusable (no data in the window, unreadable store, bad thresholds
file); each with one line on stderr.  What the report holds is documented in
:mod:`dspark_obs.report`.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Optional

import typer

from dspark_obs.engine_options import DATA_ROOT_HELP, ENGINE, JOBS, PRELOAD, RAY_ADDRESS, RAY_WORKERS, WARM, engine_for
from dspark_obs.console import fail, in_range


def _parse_now(value: Optional[str]) -> Optional[dt.datetime]:
    if value is None:
        return None
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        fail(f"--now {value!r} is not an ISO 8601 time; e.g. 2026-11-30T06:00:00Z")
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def report(
    ctx: typer.Context,
    data: str = typer.Option(..., help=DATA_ROOT_HELP),
    out: Path = typer.Option(..., help="Directory to write report.html, summary.json, summary.md and figures/ to "
                                       "(created if missing; the report's own files are replaced)."),
    run: Optional[list[str]] = typer.Option(None, help="Run to report on; repeatable. Default: the runs started "
                                                       "within --since (cap-accept companions go with their run)."),
    since: Optional[str] = typer.Option(None, help="Report on the runs started within this long before now, e.g. "
                                                   "24h, 36h, 7d (units s, m, h, d, w). Default 24h; not with --run."),
    baseline: Optional[list[str]] = typer.Option(None, help="Baseline run to test drift against; repeatable "
                                                            "(several are pooled)."),
    baseline_since: Optional[str] = typer.Option(None, "--baseline-since", help="Baseline: the runs started within "
                                                 "this long before the reported runs, e.g. 7d (same mode preferred)."),
    thresholds: Optional[Path] = typer.Option(None, help="TOML of limits merged over the defaults "
                                                         "(see examples/thresholds.toml)."),
    png: bool = typer.Option(True, "--png/--no-png", help="Also export every chart as PNG (kaleido + Chromium)."),
    history: bool = typer.Option(True, "--history/--no-history", help="Append the figures to the store's "
                                                                      "`reports` table."),
    recompute: bool = typer.Option(False, help="Re-run estimate, calibrate and costmodel for the reported runs "
                                               "even when their tables exist."),
    bootstrap: Optional[int] = typer.Option(None, callback=in_range(0), help="Bootstrap resamples behind CIs and drift tests "
                                                       "(default: [report].n_bootstrap, 1000)."),
    now: Optional[str] = typer.Option(None, help="Reference time for --since, ISO 8601 (default: now); for "
                                                 "reproducible reports."),
    engine: str = ENGINE,
    ray_address: Optional[str] = RAY_ADDRESS,
    ray_workers: Optional[int] = RAY_WORKERS,
    jobs: Optional[int] = JOBS,
) -> None:
    """Judge a night's runs: calibration, ceiling, estimator, cost model, collection, STS refit; gate on them.

    For each reported run the report computes, with 95% intervals:

    * **calibration** of survival S_k per draft position x workload: ECE, debiased ECE, Brier,
      AUROC and the full-block acceptance, on the best labels available (companion >
      reconstructed > observed), with reliability diagrams;
    * **ceiling**: accept length, full-block ceiling and utilisation per workload;
    * **estimator coverage** of the block-accept interval when a truth exists (a cap-accept companion);
    * **cost-model error** (fitted table and the server's own prediction);
    * **collection**: records lost to gaps, dead letters;
    * an **STS refit** with its throughput gain from schedule replay, recommended when the gain
      clears its limit (the fitted STS JSON is written beside the report).

    Each figure gets a threshold verdict and, against the baseline, a drift verdict from a test
    suited to it (request-bootstrap difference for ECE/Brier, a z-test on request-clustered DeLong
    SEs for AUROC, two-proportion z-tests for acceptance and coverage, z-tests on the CIs for
    utilisation, Welch for cost-model error), with a Benjamini-Hochberg false-discovery-rate
    adjustment over all tests.  Missing estimator tables are computed first (estimate, calibrate,
    costmodel), so a store that was only collected works.

    Writes `report.html` (self-contained, opens offline), `summary.json` (schema
    `dspark_obs/report/summary.schema.json`), `summary.md`, `figures/*.png`, and appends the
    figures to the `reports` table (`dspark-obs sql --data D report_history`).

    Exit codes: **0** all gates passed, **1** a threshold or drift gate failed, **2** unusable input.

    Examples:

    `dspark-obs report --data data --since 24h --baseline-since 7d --out reports/$(date +%F)`

    `dspark-obs report --data demo-data --run demo-compact-s0 --out report --thresholds thresholds.toml`

    `dspark-obs report --data s3://bucket/fleet --since 24h --out reports/$(date +%F) --engine ray
    --ray-address ray://head:10001` (the estimator stages as Ray tasks; the store's results written back)
    \f
    Long: typer declares the options in the signature, one a line (the help above is this docstring up to the
    form feed); the body only checks them and calls the library.
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.report import InputError, ReportOptions, ThresholdsError, build_report
    from dspark_obs.report.inputs import parse_duration

    if run and since:
        fail("--run and --since both choose the runs to report on; give one")
    if baseline and baseline_since:
        fail("--baseline and --baseline-since both choose the baseline; give one")
    if bootstrap is not None and bootstrap < 50:
        fail(f"--bootstrap must be >= 50 (the intervals need resamples), got {bootstrap}")
    for flag, value in (("--since", since), ("--baseline-since", baseline_since)):
        if value is not None:
            try:
                parse_duration(value)
            except ValueError as exc:
                fail(f"{flag}: {exc}")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file; give a directory")
    ray = engine_for(engine, ray_address, ray_workers, jobs, preload=PRELOAD["report"], ctx=ctx,
                     warm=WARM["report"])
    opts = ReportOptions(data=data, out=out, runs=run or None, since=since, baseline=baseline or None,
                         baseline_since=baseline_since, thresholds=thresholds, now=_parse_now(now), png=png,
                         history=history, recompute=recompute, n_bootstrap=bootstrap, engine=ray)
    try:
        result = build_report(opts)
    except (InputError, ThresholdsError) as exc:
        fail(str(exc))
    for kind in ("html", "markdown", "json"):
        typer.echo(f"{kind:9s} {result.files[kind]}")
    print(result.stderr_line(), file=sys.stderr)
    raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
