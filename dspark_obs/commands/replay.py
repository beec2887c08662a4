"""``dspark-obs replay``: re-run the DSpark scheduler on a run's logged confidences."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import FORMAT_HELP, check_choice, check_format, console as err, fail, print_table
from rich.console import Console
from rich.table import Table

TIMERS = ("step_gpu_ms", "step_cpu_ms", "target_verify_gpu_ms")




def _load_table(path: Optional[Path], flag: str):
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import costtable

    if path is None:
        return None
    try:
        return costtable.load(path)
    except OSError as exc:
        fail(f"{flag} {path}: cannot read it ({exc.strerror or exc})")
    except ValueError as exc:
        fail(f"{flag} {path}: {exc}; expected SGLang's 1-D {{sample_batch_tokens, sample_steps_per_sec, "
              "max_batch_tokens}} or additive {bias_seconds, bs_probes, alpha_seconds, m_probes, "
              "theta_seconds} JSON (`dspark-obs costmodel --out` writes one)")


def _load_sts(path: Optional[Path], flag: str) -> Optional[list[float]]:
    # at call time: the CLI imports every command module to declare its options
    import msgspec

    if path is None:
        return None
    try:
        data = msgspec.json.decode(path.read_bytes())
    except OSError as exc:
        fail(f"{flag} {path}: cannot read it ({exc.strerror or exc})")
    except msgspec.DecodeError as exc:
        fail(f"{flag} {path}: not JSON ({exc})")
    temps = data.get("temperatures") if isinstance(data, dict) else None
    if (not isinstance(temps, list) or not temps
            or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 for t in temps)):
        fail(f"{flag} {path}: expected an SGLang STS file {{\"temperatures\": [positive numbers, one per "
              f"draft position]}}, got {str(data)[:120]} (`dspark-obs calibrate` writes one)")
    return [float(t) for t in temps]


def _load_recalibration(path: Optional[Path]):
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.estimators.calibration.recalibration import load_survival_map

    if path is None:
        return None
    try:
        return load_survival_map(path.read_text(encoding="utf-8"))
    except OSError as exc:
        fail(f"--recalibration {path}: cannot read it ({exc.strerror or exc})")
    except ValueError as exc:
        fail(f"--recalibration {path}: {exc}")


def replay(
    data: Path = typer.Option(..., help="Data root of the store."),
    run: str = typer.Option(..., help="Compact or cap-accept run to replay."),
    sts: Optional[Path] = typer.Option(None, help="What-if: STS calibration JSON {temperatures: [...]}; "
                                                  "confidences become sigmoid(logit(c) * T_current / T_new)."),
    current_sts: Optional[Path] = typer.Option(None, help="STS file the server was started with "
                                                          "(--speculative-dspark-confidence-sts-path); default: none."),
    recalibration: Optional[Path] = typer.Option(None, help="What-if: a survival map from `dspark-obs calibrate "
                                                 "--recalibrate --recalibrate-out FILE` (Platt, isotonic or beta; "
                                                 "not loadable by SGLang 0.5.23)."),
    sps_table: Optional[Path] = typer.Option(None, help="Cost table the server planned with (default: the run's "
                                                        "table path, or the emulator's built-in table)."),
    whatif_table: Optional[Path] = typer.Option(None, help="What-if: plan with this cost table instead."),
    time_table: Optional[Path] = typer.Option(None, help="Price what-if steps with this table (default: the run's "
                                                         "`dspark-obs costmodel` fit, else the planning table)."),
    emulator_truth: bool = typer.Option(True, help="Use the emulator's emu_block_accept as full-block truth "
                                                   "(--no-emulator-truth: only what a real server would give)."),
    timer: str = typer.Option("step_gpu_ms", help="Measured step time for the logged row."),
    write: bool = typer.Option(True, help="Store replay_conformance and replay_whatif for the run."),
    format: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Replay the scheduler on logged confidences: conformance, and what-if throughput.

    Conformance: the share of decode steps whose replayed verify_len (and budget) equal the
    logged ones, using dspark_obs.scheduler on the recorded confidences, survivals two decode
    steps back, and the run's cost table.  What-if: the same steps re-planned with
    recalibrated confidences (--sts, or a bias-capable --recalibration map) or another table (--whatif-table), with committed tokens
    from the full-block acceptance (truth, else the ceiling table, else a survival-based
    interval) and step time from a cost table.

    Example: `dspark-obs replay --data D --run demo-compact-s0 --sts sts.json`
    \f
    Long: typer declares the options in the signature, one a line (the help above is this docstring up to the
    form feed); the body only checks them and calls the library.
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import sql
    from dspark_obs.estimators import replay as rp
    from dspark_obs.store import Store, validate_run_id

    check_format(format)
    check_choice("--timer", timer, TIMERS)
    if not data.is_dir():
        fail(f"--data {data} is not a directory; collect a run first (dspark-obs demo or dspark-obs collect)")
    try:
        validate_run_id(run)
    except ValueError as exc:
        fail(str(exc))
    tables = {flag: _load_table(path, flag) for flag, path in
              (("--sps-table", sps_table), ("--whatif-table", whatif_table), ("--time-table", time_table))}
    new_t, cur_t = _load_sts(sts, "--sts"), _load_sts(current_sts, "--current-sts")
    if cur_t is not None and new_t is None:
        fail("--current-sts only matters with --sts (the what-if temperatures); add --sts FILE")
    maps = _load_recalibration(recalibration)
    try:
        con = sql.connect(data)
        report = rp.replay_run(con, run, sps_table=tables["--sps-table"], sts_temperatures=new_t,
                               survival_maps=maps,
                               current_temperatures=cur_t, whatif_table=tables["--whatif-table"],
                               time_table=tables["--time-table"], use_emulator_truth=emulator_truth,
                               timer=timer)
    except ValueError as exc:
        fail(str(exc))
    if write:
        rp.write_results(Store(data), report)
    _print(report, format)


def _print(report, fmt: str = "table") -> None:
    # at call time: the CLI imports every command module to declare its options
    from rich.markup import escape

    console = Console() if fmt == "table" else err  # csv/json: stdout holds only the table
    c = report.conformance
    share = "-" if c["share"] is None else f"{c['share'] * 100:.2f}%"
    console.print(f"[bold]{escape(report.run)}[/bold]: {c['matching_steps']}/{c['steps']} steps replay to the logged "
                  f"verify_len ({share}); budgets match on {c['budget_matches']}"
                  + (f"; {c['unknown_history_steps']} steps after collection gaps not replayed"
                     if c["unknown_history_steps"] else "") + f" (planning table: {escape(c['table'])})")
    if c["share"] is not None and c["share"] < 1.0:
        console.print("[yellow]not every step conforms: was the server started with another cost table "
                      "(--sps-table FILE) or STS file?[/yellow]")
    t = Table(title=escape(f"What-if (steps priced by {report.time_model})"), header_style="bold")
    for col in ("scenario", "steps", "tokens/step", "acc_len", "step ms", "tokens/s", "acceptance"):
        t.add_column(col, justify="left" if col in ("scenario", "acceptance") else "right")
    for w in report.whatif:
        if w["steps"] == 0 or w["accepted_tokens_mean"] is None:
            t.add_row(escape(w["scenario"]), "0", "-", "-", "-", "-", escape(w["acceptance_source"]))
            continue
        src = w["acceptance_source"]
        if w.get("estimated_share"):
            src += f" ({w['estimated_share'] * 100:.0f}% est.)"
        t.add_row(escape(w["scenario"]), str(w["steps"]),
                  _interval(w["accepted_tokens_mean"], w["accepted_tokens_lo"], w["accepted_tokens_hi"], 2),
                  f"{w['acc_len_mean']:.3f}", f"{w['step_ms_mean']:.2f}",
                  _interval(w["tokens_per_s"], w["tokens_per_s_lo"], w["tokens_per_s_hi"], 0), escape(src))
    print_table(t, fmt)
    for note in report.notes:
        console.print(f"note: {escape(note)}")


def _interval(mid: float, lo: float, hi: float, digits: int) -> str:
    # at call time: the CLI imports every command module to declare its options
    from rich.markup import escape

    text = f"{mid:.{digits}f}"
    if f"{lo:.{digits}f}" != text or f"{hi:.{digits}f}" != text:
        text += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    return escape(text)


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)
