"""``dspark-obs calibrate``: how well the confidence head's survival predicts acceptance.

Scores a run per position with each kind of labels, stores the tables
``calibration`` and ``calibration_bins``, prints ECE per position x labels, and
optionally fits SGLang STS temperatures (``--fit-sts``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from dspark_obs.engine_options import DATA_ROOT_HELP, ENGINE, JOBS, PRELOAD, RAY_ADDRESS, RAY_WORKERS, data_root, engine_for
from dspark_obs.commands.estimate import step_progress
from dspark_obs.console import FORMAT_HELP, check_choice, check_format, fail, in_range, print_table
from rich.table import Table

LABEL_CHOICES = ("observed", "reconstructed", "companion", "all")
_STS_PREFERENCE = ("companion", "reconstructed", "observed")  # most trustworthy full-block truth first
from dspark_obs.console import console as err  # noqa: E402




def calibrate(
    ctx: typer.Context,
    data: str = typer.Option(..., help=DATA_ROOT_HELP),
    run: str = typer.Option(..., help="Run whose confidences to score: a compact or cap-accept run."),
    labels: str = typer.Option("all", help="Where the truth comes from: observed | reconstructed | companion | all "
                                           "(all = every kind the store supports for this run)."),
    companion: Optional[str] = typer.Option(None, help="Cap-accept companion run for --labels companion "
                                                       "(default: the run stored with companion_of = RUN)."),
    bootstrap: int = typer.Option(1000, callback=in_range(0), help="Request-level bootstrap resamples for the ECE's 95% CI (ECE ± 1.96 bootstrap SE, as the report draws it); 0 = no CI."),
    seed: int = typer.Option(0, help="Seed of the bootstrap (same seed, same interval)."),
    fit_sts: Optional[Path] = typer.Option(None, "--fit-sts", help="Also fit STS temperatures and write SGLang's "
                                           "JSON here (serve it with --speculative-dspark-confidence-sts-path)."),
    current_sts: Optional[Path] = typer.Option(None, "--current-sts", help="The STS JSON the server ran with: "
                                               "recorded confidences are after it, so the fit needs it to recover "
                                               "raw logits. Default: no STS was applied."),
    recalibrate: bool = typer.Option(False, "--recalibrate", help="Also fit STS, Platt, isotonic and beta maps of "
                                     "the survival on half of the requests (seeded by --seed) and report each "
                                     "one's ECE and Brier on the other half; writes table recalibration."),
    recalibrate_out: Optional[Path] = typer.Option(None, "--recalibrate-out", help="With --recalibrate: write "
                                                   "the best bias-capable map here as JSON (NOT loadable by "
                                                   "SGLang 0.5.23; use it with dspark-obs replay --recalibration)."),
    format: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    engine: str = ENGINE,
    ray_address: Optional[str] = RAY_ADDRESS,
    ray_workers: Optional[int] = RAY_WORKERS,
    jobs: Optional[int] = JOBS,
) -> None:
    """Measure calibration of the confidence head: does survival S_k predict that drafts 1..k all survive?

    The event at position k (1..gamma) is "the first k drafts survive a full-block verify";
    the prediction is the step's survival S_k = c_1...c_k.  Labels:

    * **observed** — what the run's records decide.  Exact for cap-accept and static runs.  In a
      compact run a step that accepted its whole window hides its tail, so those positions are
      left out, and what remains is biased: deep positions are labelled mostly on steps the
      scheduler trusted, and the head looks more over-confident than it is.
    * **companion** — the paired step of a cap-accept companion run (same prompts and seeds): exact.
    * **reconstructed** — the block-accept estimator's ceiling (run `dspark-obs estimate` first).

    Metrics per workload x position x binning (width15 = SGLang's 15 equal-width bins, width20 =
    DeepSpec's, mass15 = equal-mass): ECE with a request-level bootstrap CI, debiased ECE, MCE,
    Brier, log loss, AUROC; reliability bins in `calibration_bins`.  Re-running replaces the
    rows of the same run and labels.

    `--recalibrate` asks what a better head map would buy, honestly: per position, STS
    (SGLang's), Platt (logit affine), isotonic and beta calibration are fitted on one half of
    the requests (a seeded hash of the rid) and scored on the other half, with request-bootstrap
    CIs — a temperature cannot remove a bias, the other three can.  Rows go to `recalibration`;
    `--recalibrate-out` writes the best bias-capable map (by held-out ECE) for `replay`.

    `--fit-sts` fits Sequential Temperature Scaling exactly as SGLang's `dspark_sts_fit.py`
    (41-point log grid on [0.1, 10], 15-bin survival ECE, position by position) plus a
    continuous refinement, on the best labels computed (companion, reconstructed, observed).

    Examples:

    `dspark-obs calibrate --data demo-data --run demo-compact-s0`

    `dspark-obs calibrate --data D --run cap-run --fit-sts sts.json --current-sts served-sts.json`

    `dspark-obs sql --data D "select position, labels, ece, debiased_ece from calibration where binning = 'width15' and workload = '*'"`
    \f
    Long: typer declares the options in the signature, one a line (the help above is this docstring up to the
    form feed); the body only checks them and calls the library.
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import sql as sqlmod
    from dspark_obs.estimators import calibration as cal

    check_format(format)
    check_choice("--labels", labels, LABEL_CHOICES)
    data = data_root(data)
    current = _read_sts(current_sts) if current_sts is not None else None
    if recalibrate_out is not None and not recalibrate:
        fail("--recalibrate-out only matters with --recalibrate; add --recalibrate")
    if fit_sts is not None and fit_sts.is_dir():
        fail(f"--fit-sts {fit_sts} is a directory; give a file name such as sts.json")

    ray = engine_for(engine, ray_address, ray_workers, jobs, preload=PRELOAD["calibrate"], ctx=ctx)
    con = sqlmod.connect(data)
    kinds = cal.LABEL_KINDS if labels == "all" else (labels,)
    if labels == "all":
        try:  # a cap-accept or static run's observed labels are the full-block truth: the only kind
            mode, _ = cal.events.run_info(con, run)
        except ValueError as exc:
            fail(str(exc))
        if mode in ("cap-accept", "static"):
            kinds = ("observed",)
    results = {}
    try:
        with step_progress(f"calibrating {run} ({', '.join(kinds)} labels)") as progress:
            computed = cal.calibrate_kinds(con, run, kinds, companion=companion, n_bootstrap=bootstrap, seed=seed,
                                           progress=progress, engine=ray)
    except ValueError as exc:
        fail(str(exc))
    for kind, result in computed.items():
        if isinstance(result, cal.CalibrationDataError):
            if labels == "all" and kind != "observed":
                err.print(f"[yellow]skipped {kind} labels:[/yellow] {result}")
                continue
            fail(str(result))
        results[kind] = result
        for note in result.notes:
            err.print(f"{kind}: {note}")
        mode = result.summary.column("mode")[0].as_py() if result.summary.num_rows else None
        if labels == "all" and mode in ("cap-accept", "static"):
            err.print(f"{run} is a {mode} run: its observed labels are the full-block truth")
    print_table(_ece_table(run, results), format)

    if fit_sts is not None:
        _fit_and_write(con, run, labels, results, companion, current, current_sts, fit_sts, fmt=format)
    if recalibrate:
        _recalibrate(con, run, labels, results, companion, current, seed, bootstrap, recalibrate_out, fmt=format)


def _recalibrate(con, run, labels, results, companion, current, seed, bootstrap, out: Optional[Path], *,
                 fmt: str = "table") -> None:
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.estimators.calibration import recalibration as rc

    kind = next((k for k in _STS_PREFERENCE if k in results), None) if labels == "all" else labels
    if kind is None:
        fail("no labels to recalibrate on")
    try:
        result = rc.recalibrate_run(con, run, labels=kind, companion=companion, seed=seed,
                                    n_bootstrap=min(bootstrap, 200), current_temperatures=current)
    except ValueError as exc:
        fail(f"--recalibrate: {exc}")
    print_table(_recalibration_table(result), fmt)
    best = result.best_bias_capable()
    brier = {m: [r["brier"] for r in result.rows if r["method"] == m and r["workload"] == "*" and r["brier"] is not None]
             for m in rc.METHODS}
    err.print("held-out mean ECE: " + ", ".join(f"{m} {result.mean_ece(m):.4f}" for m in rc.METHODS)
              + "; mean Brier: " + ", ".join(f"{m} {sum(v) / len(v):.4f}" for m, v in brier.items() if v)
              + f"; best bias-capable: {best}. Rows in table recalibration ({kind} labels, seed {seed}).")
    if out is not None:
        try:
            out.write_text(rc.survival_map_json(result, best), encoding="utf-8")
        except OSError as exc:
            fail(f"--recalibrate-out {out}: cannot write it ({exc.strerror})")
        err.print(f"wrote {out} ({best}; not loadable by SGLang 0.5.23): dspark-obs replay --data D --run {run} "
                  f"--recalibration {out}")


def _recalibration_table(result) -> Table:
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.estimators.calibration import recalibration as rc

    table = Table(title=f"Held-out ECE of survival S_k after each map ({result.labels} labels, all workloads; "
                        "fitted on the other half of the requests), lower is better", header_style="bold")
    table.add_column("k", justify="right")
    for m in rc.METHODS:
        table.add_column(f"{m}\nECE [95% CI]", justify="right")
    by = {(r["position"], r["method"]): r for r in result.rows if r["workload"] == "*"}
    for k in range(1, result.gamma + 1):
        cells = []
        for m in rc.METHODS:
            r = by.get((k, m))
            if r is None or r["ece"] is None:
                cells.append("-")
                continue
            ci = f" [{r['ece_ci_lo']:.3f}, {r['ece_ci_hi']:.3f}]" if r["ece_ci_lo"] is not None else ""
            cells.append(f"{r['ece']:.4f}{ci}")
        table.add_row(str(k), *cells)
    return table


def _read_sts(path: Path) -> list[float]:
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.sts_format import StsCalibration

    try:
        return StsCalibration.from_json(path.read_bytes()).temperatures
    except OSError as exc:
        fail(f"--current-sts {path}: cannot read it ({exc.strerror}); pass the STS JSON the server was started with")
    except ValueError as exc:
        fail(f"--current-sts {path}: {exc}")


def _server_sts_path(con, run: str) -> Optional[str]:
    rows = con.sql("SELECT server_info FROM runs WHERE run_id = $run", params={"run": run}).fetchall()
    try:
        info = json.loads(rows[0][0]) if rows and rows[0][0] else {}
    except ValueError:
        return None
    return info.get("speculative_dspark_confidence_sts_path") if isinstance(info, dict) else None


def _fit_and_write(con, run, labels, results, companion, current, current_sts, out: Path, *,
                   fmt: str = "table") -> None:
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.estimators.calibration import sts

    kind = next((k for k in _STS_PREFERENCE if k in results), None) if labels == "all" else labels
    if kind is None:
        fail("no labels to fit STS on")
    mode = next(iter(results.values())).summary.column("mode")[0].as_py() if results else None
    if kind == "observed" and mode == "compact":
        err.print("[yellow]warning:[/yellow] fitting STS on a compact run's observed labels: censored tails are "
                  "missing, which biases the temperatures; prefer a cap-accept run or --labels companion")
    server_sts = _server_sts_path(con, run)
    if current is None and server_sts:
        fail(f"run {run!r} was served with --speculative-dspark-confidence-sts-path {server_sts}: its confidences "
              f"are after those temperatures; pass that file as --current-sts")
    try:
        fit = sts.fit_sts_run(con, run, labels=kind, companion=companion, current_temperatures=current,
                              dataset=f"dspark-obs:{run}:labels={kind}")
        out.write_text(fit.to_sglang().to_json(), encoding="utf-8")
    except (ValueError, OSError) as exc:
        fail(f"--fit-sts: {exc}")
    print_table(_sts_table(fit, current_sts), fmt)
    err.print(f"wrote {out} ({fit.num_samples} request-steps, {kind} labels); serve it with "
              f"--speculative-dspark-confidence-sts-path {out}")


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def _ece_table(run: str, results: dict) -> Table:
    table = Table(title=f"ECE of survival S_k, run {run}: 15 equal-width bins, all workloads, lower is better "
                        "(pred->rate: mean S_k -> share of steps whose first k drafts survive)", header_style="bold")
    table.add_column("k", justify="right")
    rows: dict[int, list[str]] = {}
    for kind, result in results.items():
        table.add_column(f"{kind}\nECE [95% CI]", justify="right")
        table.add_column("pred->rate", justify="right")
        table.add_column("n", justify="right")
        for r in result.summary.to_pylist():
            if r["workload"] != "*" or r["binning"] != "width15":
                continue
            ci = f" [{r['ece_ci_lo']:.3f}, {r['ece_ci_hi']:.3f}]" if r["ece_ci_lo"] is not None else ""
            rate = (f"{r['mean_predicted']:.2f}->{r['observed_rate']:.2f}" if r["n"] else "-")
            rows.setdefault(r["position"], []).extend([f"{_fmt(r['ece'])}{ci}", rate, str(r["n"])])
    for k in sorted(rows):
        table.add_row(str(k), *rows[k])
    return table


def _sts_table(fit, current_sts: Optional[Path]) -> Table:
    table = Table(title=f"STS fit ({fit.labels} labels): temperatures replace the server's current ones",
                  header_style="bold")
    for name in ("k", "T (grid)", "T", "ECE raw (T=1)", f"ECE as served{' (--current-sts)' if current_sts else ''}",
                 "ECE after"):
        table.add_column(name, justify="right")
    for k in range(len(fit.temperatures)):
        table.add_row(str(k + 1), f"{fit.grid_temperatures[k]:.4f}", f"{fit.temperatures[k]:.4f}",
                      _fmt(fit.ece_before[k]), _fmt(fit.ece_reported[k] if fit.ece_reported else None),
                      _fmt(fit.ece_after[k]))
    return table


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
