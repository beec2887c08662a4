"""Make one report: select runs, run missing estimator stages, judge every figure, write the files.

:func:`build_report` is what ``dspark-obs report`` calls.  It writes into the
output directory ``report.html``, ``summary.json``, ``summary.md``,
``figures/*.png`` (and ``sts-refit-<run>.json`` when a refit is recommended),
appends the figures to the store's ``reports`` table, and returns a
:class:`ReportResult`.  Unusable input raises
:class:`~dspark_obs.report.inputs.InputError` and a bad thresholds file
:class:`~dspark_obs.report.thresholds.ThresholdsError` (both exit code 2).
"""

from __future__ import annotations

import datetime as _dt
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pandas as pd

from dspark_obs import __version__
from dspark_obs import sql as sqlmod
from dspark_obs.estimators import report_history
from dspark_obs.report import summary as summary_mod
from dspark_obs.report.calibration import calibration_section
from dspark_obs.report.ceiling import ceiling_section
from dspark_obs.report.collection import collection_section
from dspark_obs.report.costmodel import costmodel_section
from dspark_obs.report.gates import Outcome, judge
from dspark_obs.report.inputs import (
    InputError,
    RunInfo,
    Selection,
    check_readable,
    connect,
    ensure_stages,
    read_runs,
    select_runs,
)
from dspark_obs.report.model import Figure
from dspark_obs.report.plots import HISTORY_METRICS, build_charts, history_frame, newest_sweep
from dspark_obs.report.png import export_pngs
from dspark_obs.report.render_html import render_html
from dspark_obs.report.render_md import render_markdown
from dspark_obs.report.sts import sts_section
from dspark_obs.report.thresholds import Thresholds, load_thresholds
from dspark_obs.report.trimming import health_section
from dspark_obs.store import Store, is_url, open_store

__all__ = ["ReportOptions", "ReportResult", "build_report", "figures_stage", "HTML_NAME", "JSON_NAME", "MARKDOWN_NAME", "PNG_DIR"]

HTML_NAME, JSON_NAME, MARKDOWN_NAME, PNG_DIR = "report.html", "summary.json", "summary.md", "figures"


@dataclass
class ReportOptions:
    """What to report on and where to write it (the command line's options)."""

    data: Path
    out: Path
    runs: list[str] | None = None
    since: str | None = None
    baseline: list[str] | None = None
    baseline_since: str | None = None
    thresholds: Path | None = None
    now: _dt.datetime | None = None  # the reference time of --since (default: the wall clock)
    png: bool = True
    history: bool = True
    recompute: bool = False
    n_bootstrap: int | None = None  # overrides [report].n_bootstrap
    engine: object = None           # a RayEngine: the estimator stages run on Ray (None: in this process)


@dataclass
class ReportResult:
    status: str
    exit_code: int
    out: Path
    summary: dict
    outcome: Outcome
    files: dict[str, str] = field(default_factory=dict)

    def stderr_line(self) -> str:
        """The one line ``dspark-obs report`` prints on stderr."""
        c = self.summary["counts"]
        if self.status == "fail":
            return f"report FAIL ({c['fail']} figures failed): {self.summary['failing_line']}"
        return (f"report PASS: {c['figures']} figures, {c['warn']} warnings, 0 failures "
                f"-> {self.out / HTML_NAME}")


def _baselines(runs: list[RunInfo], base: list[RunInfo], explicit: bool, notes: list[str]) -> dict[str, list[RunInfo]]:
    """Each run's baseline: the baseline runs of its mode (all of them when none matches, or when named)."""
    out = {}
    for run in runs:
        same = [b for b in base if b.mode == run.mode]
        chosen = base if explicit or not same else same
        if base and not same:
            notes.append(f"{run.run_id} ({run.mode}): no baseline run of the same mode; compared with "
                         f"{', '.join(b.run_id for b in chosen)} ({', '.join(sorted({str(b.mode) for b in chosen}))})")
        out[run.run_id] = chosen
    return out


def _report_id(now: _dt.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)


def _iso(t: _dt.datetime) -> str:
    return t.astimezone(_dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _run_stages(store: Store, sel: Selection, th: Thresholds, recompute: bool, engine=None) -> list[str]:
    notes = []
    for run in [*sel.runs, *sel.baseline]:
        try:
            notes += ensure_stages(store, run, companion=sel.companions.get(run.run_id), n_bootstrap=th.n_bootstrap,
                                   seed=th.seed, force=recompute and run in sel.runs, engine=engine)
        except PermissionError as exc:
            raise InputError(f"cannot write estimator results into {store.root} ({exc}); the report needs a "
                             "writable store, or run estimate/calibrate/costmodel where it is writable") from None
    return notes


def build_report(opts: ReportOptions) -> ReportResult:
    """Make the report described by ``opts`` (see the module docstring).

    Long: the report's phases in order (inputs, missing stages, sections, gates, charts, rendering, history),
    each one call; split, the dozen values they share would be passed along by hand.
    """
    th = load_thresholds(opts.thresholds)
    if opts.n_bootstrap is not None:
        th = th.with_overrides(n_bootstrap=opts.n_bootstrap)
    remote = is_url(str(opts.data))  # s3://...: results and history are written back to the object store
    root = str(opts.data) if remote else Path(opts.data)
    if not remote and not root.exists():
        raise InputError(f"--data {root} does not exist; collect a run first (dspark-obs collect or dspark-obs demo)")
    if not remote and not root.is_dir():
        raise InputError(f"--data {root} is a file; pass the data root directory of the store")
    now = (opts.now or _dt.datetime.now(_dt.timezone.utc)).astimezone(_dt.timezone.utc)
    try:
        store = open_store(root)
        con = connect(root)
    except (OSError, duckdb.Error) as exc:
        if not remote:
            raise
        raise InputError(f"--data {root}: cannot reach the object store ({str(exc).splitlines()[0][:200]}); check "
                         "the bucket and the URL's endpoint_override, region and credentials") from None
    sel = select_runs(read_runs(con, root), runs=opts.runs, since=opts.since, baseline=opts.baseline,
                      baseline_since=opts.baseline_since, now=now)
    involved = [r.run_id for r in [*sel.runs, *sel.baseline]]
    check_readable(root, involved + [sel.companions[r] for r in involved if r in sel.companions])
    notes = list(sel.notes) + _run_stages(store, sel, th, opts.recompute, opts.engine)
    baselines = _baselines(sel.runs, sel.baseline, bool(opts.baseline), notes)
    con = connect(root)
    try:
        cal = calibration_section(con, sel.runs, baselines, th)
        ceil = ceiling_section(con, sel.runs, baselines)
        cost = costmodel_section(con, sel.runs, baselines)
        coll = collection_section(con, sel.runs, baselines)
        sts = sts_section(con, sel.runs, cal.labels)
        trim = health_section(con, sel.runs)
        previous = sqlmod.query(con, "report_history_overview", {"metrics": list(HISTORY_METRICS)}).to_pandas()
        sweep = newest_sweep(sqlmod.query(con, "sweep_points").to_pandas())
    except duckdb.Error as exc:
        check_readable(root, involved)
        raise InputError(f"cannot read the store at {root}: {str(exc).splitlines()[0]}") from None
    figures: list[Figure] = cal.figures + ceil.figures + cost.figures + coll.figures + sts.figures + trim.figures
    for section in (cal, ceil, cost, coll, sts, trim):
        notes += section.notes
    outcome = judge(figures, th)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    sts_rows = _sts_rows(sts, figures, out)
    started = {r.run_id: r.started_at for r in sel.runs}
    limits = {}
    rule, _ = th.rule("utilisation", workload="*")
    limits["utilisation"] = (rule.max if rule.max is not None else rule.min,
                             "max" if rule.max is not None else "min" if rule.min is not None else None)
    charts = build_charts(runs=[r.run_id for r in sel.runs],
                          baselines={k: [b.run_id for b in v] for k, v in baselines.items()},
                          figures=figures, calibration=cal, ceiling=ceil, costmodel=cost, sts=sts,
                          history=history_frame(previous, figures, started), limits=limits, sweep=sweep)
    pngs: dict[str, str] = {}
    if opts.png:
        written, png_notes = export_pngs(charts, out / PNG_DIR)
        pngs = {name: str(Path(path).relative_to(out)) for name, path in written.items()}
        notes += png_notes
    generated = now if opts.now else _dt.datetime.now(_dt.timezone.utc)
    report_id = _report_id(generated)
    if opts.history:
        _append_history(store, report_id, generated, outcome.status, figures, started, notes)
    summary = _summary(report_id, generated, root, sel, baselines, th, figures, outcome, sts_rows, coll, charts,
                       pngs, cal.labels, notes, png_dir=PNG_DIR if opts.png else None)
    files = {"json": str(out / JSON_NAME), "markdown": str(out / MARKDOWN_NAME), "html": str(out / HTML_NAME)}
    (out / JSON_NAME).write_text(summary_mod.dumps(summary), encoding="utf-8")
    (out / MARKDOWN_NAME).write_text(render_markdown(summary), encoding="utf-8")
    (out / HTML_NAME).write_text(render_html(summary, charts, pngs), encoding="utf-8")
    return ReportResult(outcome.status, outcome.exit_code, out, summary, outcome, files)


def _sts_rows(sts, figures: list[Figure], out: Path) -> list[dict]:
    rows = []
    for fig in figures:
        if fig.metric != "sts_predicted_gain":
            continue
        recommended = fig.threshold is not None and fig.threshold.verdict in ("warn", "fail")
        name = None
        if recommended:
            name = f"sts-refit-{fig.run_id}.json"
            (out / name).write_text(sts.fits[fig.run_id].to_sglang().to_json() + "\n", encoding="utf-8")
        rows.append({"run_id": fig.run_id, "recommended": recommended, "predicted_gain": fig.value,
                     "interval": {"low": fig.ci_low, "high": fig.ci_high},
                     "temperatures": [float(t) for t in sts.fits[fig.run_id].temperatures], "file": name})
    return rows


def _summary(report_id, generated, root, sel: Selection, baselines, th: Thresholds, figures, outcome, sts_rows, coll,
             charts, pngs, labels, notes, *, png_dir) -> dict:
    counts = {"figures": len(figures), **{v: 0 for v in ("pass", "warn", "fail", "info", "insufficient")}}
    for f in figures:
        counts[f.verdict] += 1
    runs = []
    for r in sel.runs:
        runs.append({**r.to_json(), "companion": sel.companions.get(r.run_id), "labels": labels.get(r.run_id),
                     "baseline_runs": [b.run_id for b in baselines.get(r.run_id, [])]})
    losses = coll.losses.to_dict("records") if not coll.losses.empty else []
    return {
        "schema": summary_mod.SCHEMA_ID, "schema_version": summary_mod.SCHEMA_VERSION,
        "report_id": report_id, "generated_at": _iso(generated),
        "tool": {"name": "dspark-obs", "version": __version__}, "data": str(root) if isinstance(root, str) else str(root.resolve()),
        "status": outcome.status, "exit_code": outcome.exit_code, "failing": outcome.failing_metrics,
        "failing_line": outcome.failing_line(), "counts": counts, "window": sel.window, "runs": runs,
        "baseline": ({"window": sel.baseline_window, "runs": [b.to_json() for b in sel.baseline]}
                     if sel.baseline_window else None),
        "thresholds": {"source": th.source, "labels": th.labels, "binning": th.binning,
                       "n_bootstrap": th.n_bootstrap, "seed": th.seed, "fdr": th.fdr},
        "figures": [f.to_json() for f in figures], "sts": sts_rows,
        "collection": [{"run_id": x["run_id"], "kind": x["kind"], "reason": x["reason"], "count": int(x["count"]),
                        "missing_forward_cts": None if pd.isna(x["missing_forward_cts"])
                        else int(x["missing_forward_cts"])} for x in losses],
        "charts": [{"name": c.name, "section": c.section, "run_id": c.run_id, "title": c.title, "caption": c.caption,
                    "png": pngs.get(c.name)} for c in charts],
        "artifacts": {"html": HTML_NAME, "markdown": MARKDOWN_NAME, "json": JSON_NAME, "png_dir": png_dir},
        "notes": list(dict.fromkeys(notes)),
    }


def _append_history(store: Store, report_id: str, generated: _dt.datetime, status: str, figures: list[Figure],
                    started: dict, notes: list[str]) -> None:
    by_run: dict[str, list[dict]] = {}
    for f in figures:
        t, d = f.threshold, f.drift
        by_run.setdefault(f.run_id, []).append({
            "report_id": report_id, "generated_at": generated, "report_status": status,
            "run_started_at": started.get(f.run_id), "section": f.section, "metric": f.metric,
            "workload": f.workload, "position": f.position, "labels": f.detail.get("labels"),
            "value": f.value, "ci_low": f.ci_low, "ci_high": f.ci_high, "n": f.n,
            "limit_kind": t.kind if t else None, "limit_value": t.limit if t else None,
            "threshold_verdict": t.verdict if t else None,
            "baseline_runs": ",".join(d.baseline_runs) if d and d.baseline_runs else None,
            "baseline_value": d.baseline_value if d else None, "delta": d.delta if d else None,
            "p_value": d.p_value if d else None, "q_value": d.q_value if d else None,
            "drift_test": d.test if d else None, "drift_verdict": d.verdict if d else None,
            "verdict": f.verdict, "summary_schema_version": summary_mod.SCHEMA_VERSION})
    for run, rows in by_run.items():
        try:
            report_history.append(store, run, rows)
        except OSError as exc:
            notes.append(f"history not appended for {run}: {exc}")


def figures_stage(store: Store, plan) -> ReportResult:
    """The pipeline's ``figures`` stage (:mod:`dspark_obs.pipeline`): the report of ``plan.run`` into
    ``<store>/report``, with ``plan.report``'s :class:`ReportOptions` fields."""
    root = store.location
    options = {"data": root if is_url(root) else Path(root), "out": Path(str(root)) / "report", "runs": [plan.run],
               "n_bootstrap": plan.n_bootstrap, **plan.report}
    return build_report(ReportOptions(**options))
