"""``dspark-obs costmodel``: fit SGLang's additive step-time table from a run's steps."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import FORMAT_HELP, check_choice, check_format, console as err, fail, print_table
from rich.console import Console
from rich.table import Table

TIMERS = ("step_gpu_ms", "step_cpu_ms", "target_verify_gpu_ms")




def _probes(text: Optional[str], flag: str) -> Optional[list[int]]:
    if not text:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{flag} expects comma-separated integers like 1,8,16,32, got {text!r}")
    if not values or values != sorted(set(values)) or values[0] < 1:
        fail(f"{flag} must be strictly increasing positive integers, got {text!r}")
    return values


def costmodel(
    data: Path = typer.Option(..., help="Data root of the store."),
    run: list[str] = typer.Option(..., "--run", help="Run whose decode steps to fit; repeat to pool runs "
                                                     "(e.g. a static and a compact run on the same server)."),
    out: Optional[Path] = typer.Option(None, help="Write the fitted table here as SGLang additive JSON "
                                                  "(--speculative-dspark-sps-table-path)."),
    timer: str = typer.Option("step_gpu_ms", help="Step time to fit: step_gpu_ms | step_cpu_ms "
                                                  "(host time, what SGLang's profiler uses) | target_verify_gpu_ms."),
    bs_probes: Optional[str] = typer.Option(None, help="Batch-size probe grid, e.g. 1,8,16,32,64,128,256 "
                                                       "(default: the default table's, up to the data)."),
    m_probes: Optional[str] = typer.Option(None, help="Verify-token probe grid, e.g. 1,64,128,256,512,1024,2048."),
    write: bool = typer.Option(True, help="Store costmodel_fit and costmodel_error for each run."),
    format: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Fit T(bs, K) = bias + alpha(bs) + theta(M) to logged step times, the way SGLang's profiler does.

    Steps are binned into (bs, M) cells (median time), M being the tokens the target ran
    (compact: the graph tier; static and cap-accept: bs*(gamma+1)); alpha and theta are
    piecewise linear on the probe grids, so the result is an SGLang additive table.
    Reports MAPE per batch-size bucket for the fit, the fit plus a context-length term
    (sum of prefix_len), and the server's own predicted_step_ms.

    Example: `dspark-obs costmodel --data D --run static-run --run compact-run --out table.json`
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import costtable, sql
    from dspark_obs.estimators import costmodel as cm
    from dspark_obs.store import Store, validate_run_id

    check_format(format)
    check_choice("--timer", timer, TIMERS)
    if not data.is_dir():
        fail(f"--data {data} is not a directory; collect a run first (dspark-obs demo or dspark-obs collect)")
    for r in run:
        try:
            validate_run_id(r)
        except ValueError as exc:
            fail(str(exc))
    if out is not None and out.exists() and out.is_dir():
        fail(f"--out {out} is a directory; give a file path like {out / 'dspark_sps.json'}")
    grids = _probes(bs_probes, "--bs-probes"), _probes(m_probes, "--m-probes")
    try:
        con = sql.connect(data)
        report = cm.fit_runs(con, run, timer=timer, bs_probes=grids[0], m_probes=grids[1])
    except ValueError as exc:
        fail(str(exc))
    if write:
        cm.write_results(Store(data), report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(costtable.to_json(report.fit.table) + "\n", encoding="utf-8")
    _print(report, out, format)


def _print(report, out: Optional[Path], fmt: str = "table") -> None:
    # at call time: the CLI imports every command module to declare its options
    from rich.markup import escape

    console = Console() if fmt == "table" else err  # csv/json: stdout holds only the tables
    t = report.fit.table
    fit = Table(title=f"Fitted additive table ({report.timer}, {report.fit.n_steps} steps in "
                      f"{report.fit.n_cells} cells)", header_style="bold")
    for col in ("term", "probe", "value ms", "± ms", "covered"):
        fit.add_column(col, justify="right" if col != "term" else "left")
    fit.add_row("bias", "", f"{t.bias_seconds * 1e3:.4f}", f"{report.fit.bias_stderr * 1e3:.4f}", "")
    for name, probes, values, se, cov in (
            ("alpha", t.bs_probes, t.alpha_seconds, report.fit.alpha_stderr, report.fit.bs_covered),
            ("theta", t.m_probes, t.theta_seconds, report.fit.theta_stderr, report.fit.m_covered)):
        for p, v, s, c in zip(probes, values, se, cov):
            fit.add_row(name, str(p), f"{v * 1e3:.4f}", f"{s * 1e3:.4f}", "yes" if c else "no")
    print_table(fit, fmt)
    err_table = Table(title="Predicted vs measured step time: MAPE % (mean predicted - measured, ms)",
                header_style="bold")
    models = ("fitted", "fitted+context", "server")
    for col in ("run", "bs", "steps", *models):
        err_table.add_column(col, justify="left" if col in ("run", "bs") else "right")
    for run, rows in report.errors.items():
        by_bucket: dict[str, dict[str, dict]] = {}
        for r in rows:
            by_bucket.setdefault(r["bs_bucket"], {})[r["model"]] = r
        for bucket, cells in by_bucket.items():
            n = max(c["n"] for c in cells.values())
            err_table.add_row(escape(run), "all" if bucket == "*" else bucket, str(n), *(
                "-" if m not in cells or cells[m]["mape"] is None
                else f"{cells[m]['mape'] * 100:.2f} ({cells[m]['bias_ms']:+.2f})" for m in models))
    print_table(err_table, fmt)
    fc = report.fit_context
    if fc is not None:
        verdict = "lowers the error" if report.context_helps else "does not lower the error"
        console.print(f"context term: {fc.context_seconds_per_token * 1e9:.3f} ± "
                      f"{(fc.context_stderr or 0) * 1e9:.3f} ns per prefix token; {verdict} "
                      f"(MAPE {report.overall_mape('fitted') * 100:.2f}% -> "
                      f"{report.overall_mape('fitted+context') * 100:.2f}%)")
    elif report.context_note:
        # at call time: the CLI imports every command module to declare its options
        from rich.markup import escape

        console.print(escape(report.context_note))
    if out is not None:
        console.print(escape(f"wrote {out} (load it with --speculative-dspark-sps-table-path {out})"))


def register(app: typer.Typer) -> None:
    app.command("costmodel")(costmodel)
