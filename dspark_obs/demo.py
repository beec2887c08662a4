"""``dspark-obs demo``: the whole data path on the embedded emulator.

Starts an emulator in compact mode, drives mixed traffic at it while
collecting, then replays the same requests (same prompts, same per-request
``sampling_seed``) against a cap-accept emulator on the same seed with
``dspark-obs companion``'s library function — the companion run that exposes
the full-block acceptance, with its ``companion_pairing`` tables — and prints
what to look at next.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from collectors.sglang.companion_run import CompanionOptions, format_summary, run_companion
from collectors.sglang.driver import DriveSpec, PlannedRequest
from collectors.sglang.session import CollectOptions, collect
from dspark_obs import pipeline
from dspark_obs import sql as sqlmod
from dspark_obs.console import print_table
from dspark_obs.emulator.realmodel.prompts import prompt_for
from dspark_obs.emulator.subprocess_server import SubprocessServer
from dspark_obs.report import InputError, ThresholdsError, figures_stage
from dspark_obs.store import Store

WORKLOADS = ["gsm8k", "arena-hard", "poetry"]


def run_demo(out: Path, *, quick: bool = False, seed: int = 0, serve_dashboard: bool = False,
             console: Console | None = None, model: str | None = None, fmt: str = "table",
             sweep: bool = False) -> dict[str, str]:
    """Collect a compact run and its cap-accept companion into ``out``; return their run ids.

    With ``sweep`` it also runs a concurrency sweep of the four methods
    (:mod:`dspark_obs.sweep`; the quick form with ``quick``) before the report,
    which then draws Fig. 1 and Fig. 3.

    With ``model`` (``smollm2-135m``) the server runs the real model on real prompts, fewer and
    shorter requests (a 2-core CPU decodes tens of tokens per second).
    """
    console = console or Console(stderr=True)
    store = Store(out)
    n_requests, concurrency = (90, 24) if quick else (300, 48)
    max_new_tokens, planned, server_opts = 320, None, {}
    if model is not None:
        n_requests, concurrency = (24, 12) if quick else (90, 16)
        max_new_tokens, server_opts = (48 if quick else 96), {"model": model}
        planned = _model_requests(n_requests, max_new_tokens=max_new_tokens, seed=seed)
    spec = DriveSpec(WORKLOADS, n_requests, concurrency=concurrency, temperature=0.7,
                     max_new_tokens=max_new_tokens, seed=seed)
    suffix = f"s{seed}" if model is None else f"{model}-s{seed}"
    runs = {"compact": f"demo-compact-{suffix}", "cap-accept": f"demo-cap-accept-{suffix}"}
    for mode, run_id in runs.items():
        _collect_run(store, mode, run_id, of=runs["compact"], spec=spec, planned=planned, seed=seed,
                     server_opts=server_opts, console=console)
    _print_windows(store, console, fmt)
    analyse(store, runs["compact"], runs["cap-accept"], console=console, fmt=fmt)
    if sweep:
        runs["sweep"] = demo_sweep(out, quick=quick, seed=seed, console=console)
    write_report(out, runs["compact"], png=not quick, console=console)
    console.print(
        f"\nData in [bold]{out}[/bold]. Next:\n"
        f"  dspark-obs sql --data {out} window_by_workload\n"
        f"  dspark-obs sql --data {out} acceptance_by_position\n"
        f"  dspark-obs sql --data {out} \"select workload, avg(verify_len) from step_reqs "
        f"join requests using (run_id, rid) group by 1\"\n"
        f"  dspark-obs calibrate --data {out} --run {runs['compact']} --labels all --fit-sts sts.json\n"
        f"  dspark-obs replay --data {out} --run {runs['compact']} --sts sts.json\n"
        f"  dspark-obs queries   # every canned query\n"
        f"Open the dashboard: [bold]dspark-obs dashboard --data {out}[/bold]"
        f"{'   (or: make dashboard)' if Path(out) == Path('demo-data') else ''}", soft_wrap=True)
    if serve_dashboard:
        from dspark_obs.ui.serve import serve_dashboard as _serve  # at call time: only demo --serve uses it

        console.print("serving the dashboard on http://127.0.0.1:8501 (Ctrl-C to stop)")
        _serve(out, "127.0.0.1", 8501, console=console)
    return runs


def _collect_run(store: Store, mode: str, run_id: str, *, of: str, spec: DriveSpec, planned, seed: int,
                 server_opts: dict, console: Console) -> None:
    """One of the demo's runs on its own emulator: the compact run driven, or its companion replayed."""
    n_requests, concurrency, model = spec.requests, spec.concurrency, server_opts.get("model")
    store.drop_run_everywhere(run_id)  # a re-run of the demo replaces its own runs
    with SubprocessServer(mode=mode, seed=seed, lockstep_concurrency=concurrency, lockstep_wait_s=1.0,
                          startup_timeout=60.0 if model is None else 600.0, **server_opts) as server:
        console.print(f"[bold]{mode}[/bold]: emulator on {server.url}, collecting run {run_id} "
                      f"({n_requests} requests, concurrency {concurrency})")
        if mode == "compact":
            summary = collect(store, CollectOptions(
                url=server.url, run_id=run_id, poll_interval=0.25, flush_interval=2.0, drive=spec,
                labels={"demo": "1", **server_opts}, planned=planned))
        else:  # the companion: the compact run's requests replayed (dspark-obs companion)
            report = run_companion(store, CompanionOptions(
                of=of, url=server.url, run_id=run_id, poll_interval=0.25, flush_interval=2.0,
                labels={"demo": "1"}))
            summary = report.collect
    console.print(f"  {summary.steps} steps, {summary.step_reqs} request-steps, "
                  f"{summary.requests} requests, {summary.gaps} gaps")
    if mode == "cap-accept":
        console.print(f"  {format_summary(report.summary)}")


def demo_sweep(out: Path, *, quick: bool, seed: int, console: Console) -> str:
    """The demo's concurrency sweep (``dspark-obs sweep``, its quick form with ``quick``); the sweep id."""
    from dspark_obs import sweep  # at call time: only demo --sweep uses it

    sweep_id = f"demo-sweep-s{seed}"
    opts = sweep.SweepOptions.quick(sweep_id, seed=seed) if quick else sweep.SweepOptions(sweep_id, seed=seed)
    console.print(f"[bold]sweep[/bold] {sweep_id}: {', '.join(opts.methods)} at concurrency "
                  f"{', '.join(map(str, opts.concurrency))} on {', '.join(opts.workloads)}")
    sweep.run_sweep_with_progress(Store(out), opts, console=console)
    return sweep_id


def _model_requests(n: int, *, max_new_tokens: int, seed: int) -> list:
    """The demo's traffic for a real model: real prompts per workload, rids as the driver names them."""


    rng = np.random.default_rng([seed, 11])
    return [PlannedRequest(i, f"{WORKLOADS[i % 3]}-{i:06d}", WORKLOADS[i % 3], prompt_for(WORKLOADS[i % 3], i // 3),
                           0.7, max_new_tokens, int(rng.integers(0, 2**31 - 1))) for i in range(n)]


def analyse(store: Store, compact: str, companion: str, *, console: Console, fmt: str = "table") -> None:
    """Run the estimator stages (:mod:`dspark_obs.pipeline`) on a compact run and its companion; print what
    they found."""
    console.print("estimating the hidden ceiling, calibration, the cost model and schedule replay ...")
    pipeline.run_plans(store, pipeline.demo_plans(compact, companion, n_bootstrap=200))
    con = sqlmod.connect(store.root)
    rows = con.execute("""
        SELECT s.workload, s.mean_acc_len, s.ceiling_len_mid, s.ceiling_len_lo, s.ceiling_len_hi,
               s.utilisation, s.utilisation_ci95_low, s.utilisation_ci95_high,
               (SELECT avg(ece) FROM calibration c WHERE c.run_id = s.run_id AND c.workload = s.workload
                  AND c.labels = 'observed' AND c.binning = 'width15') AS ece_observed,
               (SELECT avg(ece) FROM calibration c WHERE c.run_id = s.run_id AND c.workload = s.workload
                  AND c.labels = 'companion' AND c.binning = 'width15') AS ece_companion
        FROM ceiling_summary s WHERE s.run_id = $run ORDER BY s.workload = '*', s.workload""",
                       {"run": compact}).fetchall()
    table = Table(title=f"{compact}: accepted vs the hidden ceiling (accept lengths, drafts + 1), "
                        "and calibration (ECE, mean over positions)")
    for col in ("workload", "accept len", "ceiling mid [lo, hi]", "utilisation [95% CI]",
                "ECE observed", "ECE companion"):
        table.add_column(col)
    for w, acc, mid, lo, hi, util, ulo, uhi, e_obs, e_comp in rows:
        table.add_row(w, f"{acc:.2f}", f"{mid:.2f} [{lo:.2f}, {hi:.2f}]", f"{util:.3f} [{ulo:.3f}, {uhi:.3f}]",
                      "-" if e_obs is None else f"{e_obs:.3f}", "-" if e_comp is None else f"{e_comp:.3f}")
    print_table(table, fmt, out=console)
    conf = con.execute("SELECT share FROM replay_conformance WHERE run_id = $run", {"run": compact}).fetchall()
    cost = con.execute("SELECT mape FROM costmodel_error WHERE model = 'fitted' AND bs_bucket = '*' "
                       "AND run_id = $run", {"run": compact}).fetchall()
    console.print(f"schedule replay reproduces {conf[0][0]:.1%} of logged windows; "
                  f"fitted cost model MAPE {cost[0][0]:.1%}" if conf and cost else "")


def _print_windows(store: Store, console: Console, fmt: str = "table") -> None:
    con = sqlmod.connect(store.root)
    result = sqlmod.query(con, "window_by_workload").to_pylist()
    table = Table(title="Verify windows per workload (window = verify_len - 1)")
    for col in ("run_id", "workload", "steps", "mean_window", "full_window_share", "share_le3", "mean_acc_len"):
        table.add_column(col)
    for row in result:
        table.add_row(*(f"{row.get(c):.3f}" if isinstance(row.get(c), float) else str(row.get(c))
                        for c in ("run_id", "workload", "steps", "mean_window", "full_window_share",
                                  "share_le3", "mean_acc_len")))
    print_table(table, fmt, out=console)


def write_report(out: Path, run_id: str, *, png: bool, console: Console) -> Path | None:
    """Write the nightly report of ``run_id`` (its companion goes with it) to ``<out>/report``; print where.

    The pipeline's ``figures`` stage; an input or thresholds error is printed, not raised (the demo's data
    is in the store either way).
    """

    target = Path(out) / "report"
    plan = pipeline.Plan(run_id, stages=("figures",), n_bootstrap=200, report={"png": png})
    try:
        result = pipeline.run_plans(Store(out), [plan], figures=figures_stage).reports[run_id]
    except (InputError, ThresholdsError) as exc:
        console.print(f"[yellow]report not written:[/yellow] {exc}")
        return None
    pngs = any((target / "figures").glob("*.png"))
    console.print(f"report: [bold]{target / 'report.html'}[/bold] (also summary.md, summary.json"
                  f"{', figures/*.png' if pngs else ''}) — {result.stderr_line()}", soft_wrap=True)
    if png and not pngs:
        console.print("no PNG figures: their export needs Chromium (make chromium, or apt-get install -y "
                      "chromium); the HTML report has every chart", soft_wrap=True)
    return target
