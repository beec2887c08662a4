"""The replay's thin layer: a run's step log from the views, the what-ifs, the result tables.

:func:`load_step_log` reads a run into a :class:`~.schedule.StepLog` (with the
full-block acceptance per request-step); :func:`replay_run` replays it for
conformance and prices each what-if; :func:`write_results` writes
``replay_conformance`` and ``replay_whatif``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs import costtable as ct
from dspark_obs import sql as sqlmod
from dspark_obs.acceptance import known_block_accept
from dspark_obs.estimators.calibration.recalibration import apply_survival_map
from dspark_obs.estimators.costmodel import TIMERS, fitted_table_of
from dspark_obs.estimators.pairing import companion_of, paired_steps
from dspark_obs.estimators.replay.pricing import block_acceptance, logged_outcome, price_schedule
from dspark_obs.estimators.replay.schedule import (
    DEFAULT_LAG_STEPS,
    StepLog,
    confidence_from_survival,
    conformance,
    lag_sources,
    recalibrate,
    replay_schedule,
)
from dspark_obs.scheduler import ScheduleConfig, survival_from_confidence

_STEPS_SQL = """
SELECT dp_rank, segment, forward_ct, bs, mode, coalesce(budget, -1) AS budget,
       coalesce(lag_steps, $default_lag) AS lag_steps, num_verify_tokens, {timer} AS measured_ms
FROM steps WHERE run_id = $run AND bs > 0
"""
# No ORDER BY: a step's request order is the batch order the scheduler broke ties by, restored by
# _in_step_order from batch_index; rows without it (older files, never clustered) keep the insertion
# order DuckDB preserves (files sort by time, rows keep record order).
_REQS_SQL = """
SELECT dp_rank, segment, forward_ct, batch_index, rid, req_pool_index, verify_len, acc_len, correct_drafts,
       cap_trim, confidence, emu_block_accept
FROM step_reqs WHERE run_id = $run
"""


@dataclass
class ReplayReport:
    run: str
    table_note: str
    time_model: str
    conformance: dict
    whatif: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def load_step_log(con, run: str, *, timer: str = "step_gpu_ms", use_emulator_truth: bool = True,
                  use_companion: bool = True, default_lag: int = DEFAULT_LAG_STEPS) -> StepLog:
    """Read one run's decode steps and request rows into a :class:`StepLog`.

    ``use_emulator_truth=False`` ignores ``emu_block_accept`` (to see what a real server's
    data would give); ``use_companion=False`` ignores a cap-accept companion run.
    """
    mode, gamma, steps, reqs = _read_run(con, run, timer, default_lag)
    conf_col = reqs.column("confidence")
    if conf_col.null_count:
        raise ValueError(f"run {run!r}: {conf_col.null_count} request-steps lack confidences; "
                         "collect with the 'reqs' component for every step")
    # The list column is reordered as a matrix: Arrow's take of a list column costs 3x numpy's.
    steps, reqs, row_ptr, order = _rows_by_step(run, steps, reqs.drop_columns(["confidence"]))
    gamma = gamma or len(conf_col[0 if order is None else int(order[0])].as_py())
    conf = np.asarray(pc.list_flatten(conf_col).to_numpy(zero_copy_only=False), dtype=np.float32)
    conf = conf.reshape(-1, gamma) if order is None else conf.reshape(-1, gamma)[order]
    verify_len = reqs.column("verify_len").to_numpy().astype(np.int64)
    correct = reqs.column("correct_drafts").to_numpy().astype(np.int64)
    dp = steps.column("dp_rank").to_numpy().astype(np.int64)
    seg = steps.column("segment").to_numpy().astype(np.int64)
    fct = steps.column("forward_ct").to_numpy().astype(np.int64)
    lag = steps.column("lag_steps").to_numpy().astype(np.int64)
    truth = np.full(reqs.num_rows, np.nan)
    if use_emulator_truth:
        truth = reqs.column("emu_block_accept").to_numpy(zero_copy_only=False).astype(np.float64)
    companion = _companion_truth(con, run, reqs) if use_companion else None
    if companion is not None:
        truth = np.where(np.isnan(truth), companion, truth)
    cap_trim = reqs.column("cap_trim").to_numpy()
    # The ceiling fills in only the steps their own record, the truth or the mode leaves unknown: only those are read.
    unknown = np.isnan(known_block_accept(mode, verify_len - 1, correct, cap_trim, gamma=gamma, truth=truth))
    ceiling = _ceiling(con, run, reqs, gamma, np.flatnonzero(unknown)) if unknown.any() else None
    lo, mid, hi, source = block_acceptance(
        mode=mode, gamma=gamma, window=verify_len - 1, correct_drafts=correct, cap_trim=cap_trim,
        survival=survival_from_confidence(conf), truth=truth, ceiling=ceiling)
    measured = steps.column("measured_ms").to_numpy(zero_copy_only=False).astype(np.float64) / 1e3
    return StepLog(
        gamma=gamma, mode=mode, dp_rank=dp, segment=seg, forward_ct=fct,
        budget=steps.column("budget").to_numpy().astype(np.int64), lag_steps=lag,
        unknown_history=_after_gaps(con, run, dp, seg, fct, lag),
        num_verify_tokens=steps.column("num_verify_tokens").to_numpy().astype(np.int64),
        measured_s=measured, row_ptr=row_ptr, rid=_request_codes(reqs),
        confidence=conf, verify_len=verify_len,
        acc_len=reqs.column("acc_len").to_numpy().astype(np.int64),
        block_lo=lo, block_mid=mid, block_hi=hi, block_source=source)


def _read_run(con, run: str, timer: str, default_lag: int) -> tuple[str, int | None, pa.Table, pa.Table]:
    """``(mode, gamma or None, steps, request rows)`` of a run, refused with the fix when it cannot be replayed."""
    sqlmod.refresh(con)
    info = con.sql("SELECT mode, gamma FROM runs WHERE run_id = $run", params={"run": run}).fetchall()
    steps = con.sql(_STEPS_SQL.format(timer=_timer(timer)),
                    params={"run": run, "default_lag": default_lag}).to_arrow_table()
    if steps.num_rows == 0:
        raise ValueError(f"run {run!r} has no decode steps; list runs with `dspark-obs sql --data D run_overview`")
    reqs = con.sql(_REQS_SQL, params={"run": run}).to_arrow_table()
    modes = set(steps.column("mode").to_pylist()) - {""}
    mode = (info[0][0] if info and info[0][0] else None) or (modes.pop() if len(modes) == 1 else "")
    if mode == "static":
        raise ValueError(f"run {run!r} is static: static steps carry no confidences and no budget, so there "
                         "is nothing to replay; replay a compact or cap-accept run")
    if reqs.num_rows == 0 or reqs.column("confidence").null_count == reqs.num_rows:
        raise ValueError(f"run {run!r} has no request confidences; collect with the 'reqs' component "
                         "(SGLANG_DSPARK_DEBUG_DUMP=...,reqs)")
    return mode, (int(info[0][1]) if info and info[0][1] else None), steps, reqs


def _rows_by_step(run: str, steps: pa.Table, reqs: pa.Table) -> tuple[pa.Table, pa.Table, np.ndarray, np.ndarray | None]:
    """Steps and request rows in step order (rows keep their batch order), the rows of each step (CSR)
    and the rows' order as read (None: read in that order)."""
    steps, step_code, _ = _in_step_order(_step_code(steps), None, steps)
    row_code = _step_code(reqs)
    rank = np.searchsorted(step_code, row_code)   # a row's step as its index among the steps: a small key
    found = rank < step_code.size
    found[found] = step_code[rank[found]] == row_code[found]
    if not found.all():
        raise ValueError(f"run {run!r}: some step_reqs rows have no steps row; the store is inconsistent "
                         "(re-collect the run)")
    reqs, row_code, order = _in_step_order(rank, _batch_positions(reqs), reqs)
    row_code = step_code[row_code]
    ptr = np.searchsorted(row_code, step_code, side="left")
    ptr_end = np.searchsorted(row_code, step_code, side="right")
    keep = ptr_end > ptr  # steps without request rows cannot be replayed
    if not keep.all():
        steps = steps.filter(pa.array(keep))
        ptr, ptr_end = ptr[keep], ptr_end[keep]
    return steps, reqs, np.concatenate([ptr, ptr_end[-1:]]).astype(np.int64), order


def _in_step_order(code: np.ndarray, position: np.ndarray | None, t: pa.Table) -> tuple[pa.Table, np.ndarray, np.ndarray | None]:
    """``t`` sorted by ``code`` and, within a code, by ``position`` (stable: rows without one keep the
    order read, which files written before it was kept hold in batch order), its codes in that order, and
    the order (None when the rows were read in it: they are not copied).

    One stable argsort of a packed key where ``code`` is small enough (a row's step rank), else a lexsort:
    the same order either way."""
    out_of_order = code[1:] < code[:-1]
    if position is not None:
        out_of_order |= (code[1:] == code[:-1]) & (position[1:] < position[:-1])
    if not out_of_order.any():
        return t, code, None
    if position is None:
        order = np.argsort(code, kind="stable")
    else:
        position = position - position.min()
        span = int(position.max()) + 1
        fits = code.min() >= 0 and int(code.max()) < (1 << 62) // span
        order = np.argsort(code * span + position, kind="stable") if fits else np.lexsort((position, code))
    return t.take(order), code[order], order


def _batch_positions(t: pa.Table) -> np.ndarray | None:
    """``batch_index`` (nulls as 0, so such rows tie and keep their order), or None when no row has one."""
    if "batch_index" not in t.column_names or t.column("batch_index").null_count == t.num_rows:
        return None
    return pc.fill_null(t.column("batch_index"), 0).to_numpy().astype(np.int64)


def _request_codes(reqs: pa.Table) -> np.ndarray:
    """An integer per request: its rid, or (a server that sends no rid) its pool slot."""
    rid = reqs.column("rid")
    if rid.null_count:   # only then: the element-wise choice copies every rid
        rid = pc.if_else(pc.is_null(rid),
                         pc.binary_join_element_wise("#pool", pc.cast(reqs.column("req_pool_index"), pa.string()), ""),
                         rid)
    return np.asarray(pc.dictionary_encode(rid).combine_chunks().indices.to_numpy(), dtype=np.int64)


def _timer(timer: str) -> str:
    if timer not in TIMERS:
        raise ValueError(f"timer {timer!r} is not one of {', '.join(TIMERS)} (--timer)")
    return timer


def _step_code(t: pa.Table) -> np.ndarray:
    """One sortable int64 per (dp_rank, segment, forward_ct)."""
    dp, seg, fct = (t.column(c).to_numpy().astype(np.int64) for c in ("dp_rank", "segment", "forward_ct"))
    return (dp << 52) | (seg << 40) | fct


def _after_gaps(con, run: str, dp: np.ndarray, seg: np.ndarray, fct: np.ndarray,
                lag: np.ndarray) -> np.ndarray:
    """Steps within ``lag`` records after a collection gap on their rank and segment."""
    unknown = np.zeros(fct.size, dtype=bool)
    gaps = con.sql("SELECT dp_rank, segment, last_missing_forward_ct FROM gaps "
                   "WHERE run_id = $run AND last_missing_forward_ct >= 0", params={"run": run}).fetchall()
    for g_dp, g_seg, g_last in gaps:
        group = np.flatnonzero((dp == g_dp) & (seg == g_seg))
        after = group[fct[group] > g_last]
        if after.size:
            unknown[after[: max(int(lag[after[0]]), 0)]] = True
    return unknown


def _companion_truth(con, run: str, reqs: pa.Table) -> Optional[np.ndarray]:
    companion = companion_of(con, run)
    if companion is None:
        return None
    paired = paired_steps(con, run, companion)
    lookup = {(r["rid"], r["forward_ct"], r["dp_rank"]): r["true_block_accept"]
              for r in paired.to_pylist() if r["same_drafts"]}
    keys = zip(reqs.column("rid").to_pylist(), reqs.column("forward_ct").to_pylist(),
               reqs.column("dp_rank").to_pylist())
    return np.array([lookup.get(k, np.nan) for k in keys], dtype=np.float64)


def _ceiling(con, run: str, reqs: pa.Table, gamma: int, rows: np.ndarray) -> Optional[tuple[np.ndarray, ...]]:
    """The ``ceiling`` result table's ``(lo, mid, hi)`` (drafts, 0..gamma) for ``run`` at ``rows`` of ``reqs``
    (NaN at the other rows).

    When several methods were stored, ``default`` wins over the others.  The
    join runs in DuckDB (a run of millions of steps as Python tuples would take
    gigabytes); steps without a ceiling row get NaN.
    """
    views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    if "ceiling" not in views:
        return None
    taken = pa.array(rows, pa.int64())
    keys = pa.table({"i": taken, **{c: reqs.column(c).take(taken) for c in ("rid", "forward_ct", "dp_rank", "segment")}})
    con.register("_replay_ceiling_keys", keys)
    try:
        if not con.sql("SELECT count(*) FROM ceiling WHERE run_id = $run", params={"run": run}).fetchall()[0][0]:
            return None
        got = _ceiling_rows(con, run, first_of_several=False)   # one row per step: the window is costly
        if got.num_rows != keys.num_rows:   # several methods (or rows) per step: 'default' first
            got = _ceiling_rows(con, run, first_of_several=True)
    except Exception:  # a ceiling table of another shape: fall back to the survival expectation
        return None
    finally:
        con.unregister("_replay_ceiling_keys")
    at = got.column("i").to_numpy()
    vals = []
    for c in ("lo", "mid", "hi"):
        val = np.full(reqs.num_rows, np.nan)
        val[at] = np.clip(got.column(c).to_numpy(zero_copy_only=False).astype(np.float64), 0.0, gamma)
        vals.append(val)
    return vals[0], vals[1], vals[2]


def _ceiling_rows(con, run: str, *, first_of_several: bool) -> pa.Table:
    """``(i, lo, mid, hi)`` for each row ``i`` of ``_replay_ceiling_keys`` (null where none), in no order:
    the caller places them by ``i`` (sorting millions of rows in the query cost more than the join)."""
    one = ("QUALIFY row_number() OVER (PARTITION BY rid, forward_ct, dp_rank, segment "
           "ORDER BY coalesce(method, '') = 'default' DESC) = 1") if first_of_several else ""
    return con.sql(f"""
        WITH c AS (
            SELECT rid, forward_ct, dp_rank, segment, lo, mid, hi FROM ceiling WHERE run_id = $run {one}
        )
        SELECT k.i, c.lo, c.mid, c.hi
        FROM _replay_ceiling_keys AS k
        LEFT JOIN c ON c.rid IS NOT DISTINCT FROM k.rid AND c.forward_ct = k.forward_ct
                   AND c.dp_rank = k.dp_rank AND c.segment IS NOT DISTINCT FROM k.segment""",
                   params={"run": run}).to_arrow_table()


def planning_table(con, run: str) -> tuple[ct.CostTable, str]:
    """The cost table the run's server planned with, and where that knowledge came from."""
    rows = con.sql("SELECT server_info, gamma FROM runs WHERE run_id = $run", params={"run": run}).fetchall()
    info = {}
    if rows and rows[0][0]:
        try:
            info = json.loads(rows[0][0])
        except ValueError:
            pass
    info = info if isinstance(info, dict) else {}
    path = info.get("speculative_dspark_sps_table_path")
    if path:
        try:
            return ct.load(path), f"server's --speculative-dspark-sps-table-path {path}"
        except (OSError, ValueError) as exc:
            raise ValueError(f"the run's cost table {path} cannot be read ({exc}); pass it with --sps-table FILE")
    if info.get("emulator") and info.get("emulator_sps_table") != "none":  # none: as SGLang without a table
        return ct.default_additive_table(), "emulator default additive table"
    if not info:
        return ct.default_additive_table(), "default additive table (the run has no server_info; --sps-table FILE)"
    gamma = int(rows[0][1] or 6)
    max_tokens = int(info.get("max_running_requests") or 256) * (gamma + 1)
    return ct.uninitialized_table(max_batch_tokens=max_tokens), "SGLang's uninitialised flat table (no table path)"


def replay_run(con, run: str, *, sps_table: Optional[ct.CostTable] = None,
               sts_temperatures: Optional[Sequence[float]] = None,
               current_temperatures: Optional[Sequence[float]] = None,
               survival_maps: Optional[Sequence] = None,
               whatif_table: Optional[ct.CostTable] = None, time_table: Optional[ct.CostTable] = None,
               use_emulator_truth: bool = True, use_companion: bool = True,
               timer: str = "step_gpu_ms") -> ReplayReport:
    """Conformance of ``run`` and its what-if scenarios (see the module docstring).

    ``survival_maps`` (:func:`~dspark_obs.estimators.calibration.recalibration.load_survival_map`)
    re-plans with recalibrated survivals (scenario ``recalibration``).
    ``sps_table`` is the table the server planned with (default: :func:`planning_table`);
    ``whatif_table`` another one to plan with; ``time_table`` prices steps (default: the
    run's ``costmodel_fit``, else the planning table).
    """
    log = load_step_log(con, run, timer=timer, use_emulator_truth=use_emulator_truth,
                        use_companion=use_companion)
    if sps_table is None:
        sps_table, table_note = planning_table(con, run)
    else:
        table_note = "--sps-table"
    time_table, time_note = _time_table(con, run, time_table, sps_table, table_note)
    cfg = ScheduleConfig(gamma=log.gamma)
    sources = lag_sources(log)   # the history rows of every scenario below
    budgets, lens = replay_schedule(log, sps_table, cfg=cfg, sources=sources)
    report = ReplayReport(run=run, table_note=table_note, time_model=time_note,
                          conformance={**conformance(log, budgets, lens), "table": table_note})
    base = {"acceptance_source": log.acceptance_source, "estimated_share": log.estimated_share,
            "time_model": time_note}
    report.whatif.append({"scenario": "logged", **logged_outcome(log), "acceptance_source": "logged",
                          "estimated_share": 0.0, "time_model": f"measured {timer}"})
    report.whatif.append({"scenario": "replay", **price_schedule(log, lens, time_table), **base})
    conf_new = None
    if sts_temperatures is not None:
        current = current_temperatures if current_temperatures is not None else [1.0] * log.gamma
        conf_new = recalibrate(log.confidence, current, sts_temperatures)
        _, lens_sts = replay_schedule(log, sps_table, confidence=conf_new, cfg=cfg, sources=sources)
        report.whatif.append({"scenario": "sts", **price_schedule(log, lens_sts, time_table), **base})
    if survival_maps is not None:
        conf_map = confidence_from_survival(apply_survival_map(survival_from_confidence(log.confidence),
                                                               list(survival_maps)))
        _, lens_map = replay_schedule(log, sps_table, confidence=conf_map, cfg=cfg, sources=sources)
        report.whatif.append({"scenario": "recalibration", **price_schedule(log, lens_map, time_table), **base})
    if whatif_table is not None:
        _, lens_t = replay_schedule(log, whatif_table, cfg=cfg, sources=sources)
        report.whatif.append({"scenario": "table", **price_schedule(log, lens_t, time_table), **base})
        if conf_new is not None:
            _, lens_both = replay_schedule(log, whatif_table, confidence=conf_new, cfg=cfg, sources=sources)
            report.whatif.append({"scenario": "sts+table", **price_schedule(log, lens_both, time_table), **base})
    if log.acceptance_source == "survival":
        report.notes.append(
            f"{np.mean(log.block_source == 2):.0%} of request-steps are censored with no truth or ceiling row: "
            "their full-block acceptance is the survival-based expectation within [window, gamma] "
            "(run `dspark-obs estimate` for ceiling rows, or collect a cap-accept companion)")
    return report


def _time_table(con, run: str, given: Optional[ct.CostTable], sps_table: ct.CostTable,
                table_note: str) -> tuple[ct.CostTable, str]:
    """The table that prices steps and where it came from: given, else the run's cost-model fit, else the
    planning table, else SGLang's default additive table."""
    if given is not None:
        return given, "time_table argument"
    fitted = fitted_table_of(con, run)
    if fitted is not None:
        return fitted, "costmodel fit of the run"
    if ct.is_uninitialized(sps_table):
        return ct.default_additive_table(), "default additive table"
    return sps_table, f"planning table ({table_note})"


def write_results(store, report: ReplayReport) -> None:
    """Replace ``replay_conformance`` and ``replay_whatif`` of the report's run."""
    for table, rows in (("replay_conformance", [report.conformance]), ("replay_whatif", report.whatif)):
        store.drop_run(table, report.run)
        store.write(table, report.run, rows)
