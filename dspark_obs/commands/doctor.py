"""``dspark-obs doctor``: is the store sound, and is DSpark doing its job?  Ranked findings with the fix.

Three things to check, any together:

* ``--data``: the store.  The problems a store can have — a part file cut
  short, a run whose collector died before closing it, a hidden ``.tmp`` a
  ``kill -9`` left — do not show in query results; they show as numbers that
  are quietly short.  The doctor sweeps unreadable files into quarantine (the
  same sweep every reader does), lists them, and lists unclosed runs,
  leftover temporary files, interrupted compactions, and closed runs left in
  many files of overlapping rids (``dspark-obs compact`` rewrites them).
* ``--data --run R``: the run's trimming health (:mod:`dspark_obs.health`):
  trimming active, trim ratio and regret, acceptance with the right
  denominator, expected vs actual acceptance, cost-table fit, padding.
* ``--url``: a live server — its mode, recorded components, cost table, STS
  and metrics, and the same health figures over the records it holds now.

Exit code: 0 when no finding is at or above ``--fail-on`` (default warn),
1 when one is, 2 when the check itself could not run (bad input, server
unreachable).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import in_range

_LABEL = {"fail": "FAIL", "warn": "WARN", "info": "info", "ok": "ok"}


def register(app: typer.Typer) -> None:
    app.command()(doctor)


def doctor(
    data: Optional[Path] = typer.Option(None, help="Data root of the store: check it (and with --run, that run's trimming health)."),
    run: Optional[str] = typer.Option(None, help="With --data: judge this run's trimming health (is DSpark doing its job?)."),
    url: Optional[str] = typer.Option(None, help="Base URL of a live SGLang DSpark server, e.g. http://127.0.0.1:30000: check its mode, records, cost table, STS and metrics, and the health of the records it holds."),
    fail_on: str = typer.Option("warn", help="Exit 1 when a finding is at least this severe: warn | fail."),
    json_out: bool = typer.Option(False, "--json", help="Print the findings as one JSON object (for machines)."),
    thresholds: Optional[Path] = typer.Option(None, help="Thresholds TOML (the report's); its limits for the health figures. Default: the built-in ones."),
    show_ok: bool = typer.Option(False, help="Also list the checks that passed."),
    mark_crashed_after: Optional[float] = typer.Option(None, callback=in_range(0), help="Close unclosed runs whose newest file is older than this many minutes as crashed (at that file's time); their collectors are gone. Default: only list them."),
) -> None:
    """Check a store, a run's trimming health, or a live server: a ranked list of findings with the fix.

    Exit code 0 when no finding is at or above --fail-on, 1 when one is, 2 when the check could not run.

    Examples: `dspark-obs doctor --data data`, `dspark-obs doctor --data data --run demo-compact-s0`,
    `dspark-obs doctor --url http://127.0.0.1:30000 --fail-on fail --json`
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import health
    from dspark_obs.console import fail

    if fail_on not in ("warn", "fail"):
        fail(f"--fail-on {fail_on!r} is not one of warn, fail; e.g. --fail-on fail to pass on warnings")
    if data is None and url is None:
        fail("give --data DIR (a store, with --run R for a run's health) or --url URL (a live server)")
    if run is not None and data is None:
        fail("--run needs --data DIR: the store the run is in")
    limits = _limits(thresholds)
    findings: list[health.Finding] = []
    checked: list[str] = []
    if data is not None:
        if not data.is_dir():
            fail(f"--data {data} is not a directory; give the data root a collector wrote (--out)")
        findings += _store_findings(data, mark_crashed_after)
        checked.append(str(data))
        if run is not None:
            findings += _run_findings(data, run, limits)
            checked.append(f"run {run}")
    if url is not None:
        findings += _live_findings(url.rstrip("/"), limits)
        checked.append(url)
    findings = health.rank(findings)
    code = health.exit_code(findings, fail_on)
    _print(findings, checked, code, json_out=json_out, show_ok=show_ok, fail_on=fail_on)
    raise typer.Exit(code)


def _limits(path: Optional[Path]):
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import health
    from dspark_obs.console import fail
    from dspark_obs.report.thresholds import ThresholdsError, load_thresholds

    try:
        return health.Limits.from_thresholds(load_thresholds(path))
    except (ThresholdsError, OSError) as exc:
        fail(f"--thresholds {path}: {exc}")


def _store_findings(data: Path, mark_crashed_after: Optional[float]) -> list:
    """Quarantined files, unclosed runs, leftover .tmp files and interrupted compactions, each a ``warn``
    finding; fragmented runs, ``info``."""
    # at call time: the CLI imports every command module to declare its options
    from collectors.sglang import runlife
    from dspark_obs import quarantine
    from dspark_obs.health import Finding
    from dspark_obs.store import Store

    out = []
    moved = quarantine.sweep(data)
    for row in quarantine.listing(data).to_pylist():
        new = " (moved now)" if any(m["path"] == row["path"] for m in moved) else ""
        out.append(Finding("warn", "quarantined", f"quarantined{new}: {row['table_name']} run {row['run_id']} "
                           f"{row['file_name']} ({row['size_bytes']} bytes): {row['error']} -> {row['path']}",
                           fix="repair the file and move it back under its table, or delete it"))
    store = Store(data)
    now = _dt.datetime.now(_dt.timezone.utc)
    for row in store.read("runs").to_pylist():
        if row.get("ended_at") is None and mark_crashed_after is not None:
            last = runlife.last_commit(store, row["run_id"]) or row["started_at"]
            if now - last >= _dt.timedelta(minutes=mark_crashed_after):
                typer.echo(f"closed run {row['run_id']}: {runlife.mark_crashed(store, row['run_id'], row)}")
                continue
        if row.get("ended_at") is None:
            out.append(Finding("warn", "unclosed_run", f"unclosed run: {row['run_id']} started {row['started_at']} "
                               "has no ended_at",
                               fix=f"if its collector is gone, `dspark-obs collect --run-id {row['run_id']} "
                                   "--resume ...` marks it crashed (at its last committed file) and continues it"))
    out += _layout_findings(store, [r for r in store.read("runs").to_pylist() if r.get("ended_at") is not None])
    for tmp in sorted(Path(data).glob("*/run_id=*/.*.tmp")):
        out.append(Finding("warn", "leftover_tmp", f"leftover temporary file (a write interrupted by a crash; "
                           f"readers ignore it): {tmp}", fix="delete it"))
    if not [f for f in out if f.severity != "info"]:
        out.append(Finding("ok", "store", f"{data}: no unreadable files, no unclosed runs, no leftover "
                           "temporary files"))
    return out


def _layout_findings(store, closed_runs: list[dict]) -> list:
    """Per closed run: an interrupted compaction (``warn``), request tables left in many overlapping files
    (``info``: every estimator chunk then opens them all)."""
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import compaction
    from dspark_obs.health import Finding

    out = []
    for row in closed_runs:
        run_id = row["run_id"]
        fix = f"`dspark-obs compact --data {store.root} --run {run_id}`"
        stopped = compaction.interrupted_tables(store, run_id)
        if stopped:
            out.append(Finding("warn", "compaction_interrupted", f"run {run_id}: a compaction of "
                               f"{', '.join(stopped)} was interrupted (its old files are still read)",
                               fix=f"{fix} finishes it"))
        spread = compaction.fragmented_tables(store, run_id)
        if spread:
            out.append(Finding("info", "fragmented_run", f"run {run_id}: {compaction.fragmented_text(spread)}",
                               fix=f"{fix} (once; reads then open a file or two per chunk)"))
    return out


def _run_findings(data: Path, run: str, limits) -> list:
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import health
    from dspark_obs import sql as sqlmod
    from dspark_obs.console import fail

    con = sqlmod.connect(data)
    rows = con.execute("SELECT server_info, mode, gamma FROM runs WHERE run_id = $r", {"r": run}).fetchall()
    known = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM step_reqs ORDER BY 1").fetchall()]
    if not rows and run not in known:
        fail(f"--run {run!r} is not in {data}; runs with request-steps: {', '.join(known) or 'none'}")
    info, mode, gamma = rows[0] if rows else (None, "", None)
    try:
        args = json.loads(info) if info else {}
    except ValueError:
        args = {}
    state = health.ServerState.from_args(args if isinstance(args, dict) else {}, mode=mode or "", gamma=gamma)
    frame = health.figures(con, runs=[run])
    return health.diagnose(health.run_row(frame, run), state=state,
                           positions=health.by_position(con, runs=[run]), limits=limits)


def _live_findings(url: str, limits) -> list:
    """The server's state and the health of the records its deque holds now."""
    # at call time: the CLI imports every command module to declare its options
    import httpx
    import pyarrow as pa

    from collectors.sglang.decode import PayloadError, decode_server_info, records_to_tables, server_args
    from dspark_obs import health
    from dspark_obs.console import fail

    try:
        resp = httpx.get(f"{url}/server_info", timeout=30.0)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        fail(f"cannot read {url}/server_info: {exc}. Is the server up (GET /health) and is --url right?")
    try:
        info, args = decode_server_info(resp.content), server_args(resp.content)
    except PayloadError as exc:
        fail(f"{url}/server_info is not an SGLang server_info body: {exc}")
    first = next((r for r in info.ranks if r.gamma or r.mode), None)
    comps = frozenset(first.components) if first is not None and first.components else None
    state = health.ServerState.from_args(args, mode=first.mode if first else "",
                                         gamma=first.gamma if first else None, has_records=info.has_dspark)
    if comps is not None:
        state = dataclasses.replace(state, components=comps)
    if not info.has_dspark:
        return health.server_findings(state)
    parts = [records_to_tables(r.records, dp_rank=r.dp_rank, segment=0) for r in info.ranks if r.records]
    if not parts:
        return health.diagnose(None, state=state, limits=limits)
    con = health.memory_connection(pa.concat_tables([p[0] for p in parts]), pa.concat_tables([p[1] for p in parts]),
                                   run_id="live", gamma=state.gamma)
    return health.diagnose(health.run_row(health.memory_figures(con), "live"), state=state,
                           positions=health.memory_by_position(con), limits=limits)


def _print(findings: list, checked: list[str], code: int, *, json_out: bool, show_ok: bool, fail_on: str) -> None:
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.console import console

    if json_out:
        typer.echo(json.dumps({"checked": checked, "fail_on": fail_on, "exit_code": code,
                               "findings": [f.to_dict() for f in findings]}, default=_plain))
        return
    shown = [f for f in findings if show_ok or f.severity != "ok"]
    for f in shown:
        typer.echo(f"{_LABEL[f.severity]:<5} {f.what}")
        if f.evidence:
            typer.echo(f"      evidence: {f.evidence}")
        if f.fix:
            typer.echo(f"      fix: {f.fix}")
    counts = {s: sum(f.severity == s for f in findings) for s in ("fail", "warn", "info", "ok")}
    console.print(f"{'; '.join(checked)}: {counts['fail']} fail, {counts['warn']} warn, {counts['info']} info, "
                  f"{counts['ok']} ok" + ("" if show_ok or not counts["ok"] else " (--show-ok lists them)"),
                  soft_wrap=True)


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)
