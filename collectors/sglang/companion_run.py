"""Run a companion: replay a run on a cap-accept server and pair the two (``dspark-obs companion``).

:func:`run_companion` is the library function (the command and the demo call
it): :func:`prepare` checks the server (cap-accept, same block size), plans the
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
from typing import Any, Callable, Optional

import pyarrow as pa
import pyarrow.compute as pc

from collectors.sglang.companion import (
    CompanionError, ReplayPlan, ServerCheck, check_server, clear_records, collect_options, plan_replay,
    require_cap_accept,
)
from collectors.sglang.session import CollectOptions, CollectSummary, collect
from collectors.workloads import WorkloadResolver
from dspark_obs import sql as sqlmod
from dspark_obs.estimators import pairing


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
    table = con.sql("SELECT rid, pos, token_id FROM tokens WHERE run_id = $run",
                    params={"run": run}).to_arrow_table()
    return table.filter(pc.is_in(table.column("rid"), value_set=pa.array(sorted(rids), pa.string())))


def measure(store, plan: ReplayPlan, run_id: str) -> tuple[pa.Table, dict[str, Any]]:
    """Identity per request and the step pairing of ``run_id`` against ``plan.of_run``; writes both tables."""
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
