"""Trimming health: is DSpark doing its job?  The figures and the verdicts, in one place.

The failure DSpark users hit most is silent: started without a cost table
(``--speculative-dspark-sps-table-path``), SGLang's planner runs a flat
uninitialised table and verifies the whole block every step.  Others:
SGLang's ``spec_accept_rate`` divides by the full block even when the window
was trimmed; a cost table that no longer predicts step time; CUDA-graph tiers
that pad the packed tokens.  This module is the one home of those figures and
of what they mean:

* the figures are SQL (``sql/health_figures.sql``, ``sql/health_by_position.sql``)
  over the store's views, or over Arrow tables of records in memory
  (:func:`memory_connection`: a live server's ``/server_info``, one poll's
  batch in the sidecar), so ``doctor``, the sidecar's counters, the
  dashboard's Overview and the report's gates agree by construction;
* :func:`diagnose` turns a run's figures and its server's state into ranked
  :class:`Finding` s (what is wrong, the evidence, the fix), with the limits of
  ``report/thresholds.toml`` (one file for the report's gates and the doctor).

A request-step is *trimmed* when ``verify_len < gamma + 1``; it is
*budget-trimmed* when, besides, its first trimmed draft still had survival
>= :data:`TRIM_SURVIVAL_FLOOR` (the flat no-table budget, computed from
survivals two steps old, also cuts drafts that were all but certain to fail:
those do not show that the planner trims).  Trimming is *active* when the
budget-trimmed share reaches its limit (5% by default: without a table,
the flat budget still trims about 1% of request-steps, where the lagged
survivals it is computed from were lower than the current ones) and the
server, when its arguments are known, loaded a cost table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

import duckdb
import pandas as pd
import pyarrow as pa

from dspark_obs import schema
from dspark_obs import sql as sqlmod

__all__ = ["TRIM_SURVIVAL_FLOOR", "SEVERITIES", "ServerState", "Finding", "Limits", "figures", "by_position",
           "memory_connection", "memory_figures", "memory_by_position", "diagnose", "server_findings", "rank",
           "exit_code", "run_row", "expected_accept_error", "is_missing", "COST_TABLE_FLAG"]

TRIM_SURVIVAL_FLOOR = 0.01  # the literal in sql/health_figures.sql
SEVERITIES = ("fail", "warn", "info", "ok")  # most severe first
COST_TABLE_FLAG = "--speculative-dspark-sps-table-path"
STS_FLAG = "--speculative-dspark-confidence-sts-path"
PROFILE_HINT = ("profile one with SGLang's benchmark/dspark_sps_profiler.py, or fit one from a run: "
                "`dspark-obs costmodel --data D --run R --out table.json`")
_REQUIRED_COMPONENTS = ("core", "reqs")


@dataclass(frozen=True)
class ServerState:
    """What the server says about itself (``/server_info`` args, or a run's stored ``server_info``)."""

    mode: str = ""
    gamma: Optional[int] = None
    algorithm: Optional[str] = None
    sps_table_path: Optional[str] = None
    emulator_sps_table: Optional[str] = None  # the emulator's own word: file | builtin | none
    sts_path: Optional[str] = None
    components: Optional[frozenset[str]] = None  # SGLANG_DSPARK_DEBUG_DUMP, when known
    enable_metrics: Optional[bool] = None
    has_records: Optional[bool] = None

    @classmethod
    def from_args(cls, args: Mapping[str, Any], *, mode: str = "", gamma: Optional[int] = None,
                  has_records: Optional[bool] = None) -> "ServerState":
        env = args.get("env") if isinstance(args.get("env"), Mapping) else {}
        dump = env.get("SGLANG_DSPARK_DEBUG_DUMP")
        comps = None
        if isinstance(dump, str):
            toks = {t.strip() for t in dump.split(",") if t.strip()}
            comps = frozenset({"all"} if "all" in toks else toks)
        block = args.get("speculative_dspark_block_size")
        return cls(mode=mode or str(env.get("SGLANG_RAGGED_VERIFY_MODE") or ""),
                   gamma=gamma if gamma is not None else block if isinstance(block, int) else None,
                   algorithm=args.get("speculative_algorithm"), sps_table_path=args.get(
                       "speculative_dspark_sps_table_path") or None,
                   emulator_sps_table=args.get("emulator_sps_table"),
                   sts_path=args.get("speculative_dspark_confidence_sts_path") or None, components=comps,
                   enable_metrics=args.get("enable_metrics") if isinstance(args.get("enable_metrics"), bool)
                   else None, has_records=has_records)

    @property
    def cost_table_loaded(self) -> bool:
        """SGLang plans with a table only when the flag names one; the emulator may use its built-in."""
        return bool(self.sps_table_path) or self.emulator_sps_table in ("file", "builtin")


@dataclass
class Finding:
    """One verdict: ``severity`` (fail | warn | info | ok), what is wrong, the evidence, the fix."""

    severity: str
    code: str
    what: str
    evidence: str = ""
    fix: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Limits:
    """The doctor's limits; :meth:`from_thresholds` takes them from a parsed thresholds file (the report's)."""

    min_budget_trimmed_share: float = 0.05
    max_trim_regret: float = 0.5
    max_expected_accept_error: float = 0.10
    max_costtable_mape: float = 0.20
    max_costtable_mape_drift: float = 0.05
    max_padding_share: float = 0.30
    max_observation_share: float = 0.05
    min_request_steps: int = 50
    min_fit_steps: int = 30

    @classmethod
    def from_thresholds(cls, th) -> "Limits":
        """The limits of a parsed thresholds file (``report.thresholds.load_thresholds()``: its defaults)."""

        def lim(metric: str, key: str, default: float) -> float:
            rule, _ = th.rule(metric, workload="*")
            value = getattr(rule, key)
            return default if value is None or rule.gate == "off" else value

        base = cls()
        trim_rule, _ = th.rule("budget_trimmed_share", workload="*")
        return cls(min_budget_trimmed_share=lim("budget_trimmed_share", "min", base.min_budget_trimmed_share),
                   max_trim_regret=lim("trim_regret", "max", base.max_trim_regret),
                   max_expected_accept_error=lim("expected_accept_error", "max", base.max_expected_accept_error),
                   max_costtable_mape=lim("server_table_mape", "max", base.max_costtable_mape),
                   max_costtable_mape_drift=lim("costtable_mape_drift", "max", base.max_costtable_mape_drift),
                   max_padding_share=lim("padding_share", "max", base.max_padding_share),
                   max_observation_share=lim("observation_share", "max", base.max_observation_share),
                   min_request_steps=max(1, int(trim_rule.min_n or base.min_request_steps)))


# -- figures ---------------------------------------------------------------------

def _params(**kw: Any) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, (list, tuple, set)) else v) for k, v in kw.items()}


def figures(con: duckdb.DuckDBPyConnection, *, runs: Optional[Sequence[str]] = None,
            workloads: Optional[Sequence[str]] = None, dp_ranks: Optional[Sequence[int]] = None,
            t0: Any = None, t1: Any = None) -> pd.DataFrame:
    """``health_figures`` rows (see that query's header for every column)."""
    return sqlmod.query(con, "health_figures", _params(runs=runs, workloads=workloads, dp_ranks=dp_ranks,
                                                        t0=t0, t1=t1), timeout_s=None).to_pandas()


def by_position(con: duckdb.DuckDBPyConnection, *, runs: Optional[Sequence[str]] = None,
                dp_ranks: Optional[Sequence[int]] = None) -> pd.DataFrame:
    """``health_by_position`` rows: survival-predicted vs observed acceptance per draft position."""
    return sqlmod.query(con, "health_by_position", _params(runs=runs, dp_ranks=dp_ranks),
                        timeout_s=None).to_pandas()


def memory_connection(steps: pa.Table, step_reqs: pa.Table, *, run_id: str, gamma: Optional[int],
                      con: Optional[duckdb.DuckDBPyConnection] = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection whose ``steps``/``step_reqs``/``runs`` (and empty ``requests``/``ceiling``) are these.

    The same queries then run over records that never reached a store: a live
    server's deque, or one poll's batch in the sidecar.  Given ``con`` (one this
    function made), the tables are swapped in place, which is much cheaper.
    """
    fresh = con is None
    con = sqlmod.open_database() if fresh else con
    tables = {
        "steps": _with_run(steps, run_id), "step_reqs": _with_run(step_reqs, run_id),
        "runs": pa.table({"run_id": [run_id], "gamma": pa.array([gamma], pa.int32()),
                          "observation_requests": pa.nulls(1, pa.int64()),
                          "observation_server_s": pa.nulls(1, pa.float64()), "collect_s": pa.nulls(1, pa.float64())}),
        "requests": _with_run(schema.schema_for("requests").empty_table(), run_id),
        "ceiling": _with_run(schema.schema_for("ceiling").empty_table(), run_id),
    }
    for name, table in tables.items():
        if fresh or name in ("steps", "step_reqs", "runs"):
            con.register(f"_{name}_arrow", table)
        if fresh:
            con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "_{name}_arrow"')
    return con


def _with_run(table: pa.Table, run_id: str) -> pa.Table:
    if "run_id" in table.column_names:
        return table
    return table.append_column("run_id", pa.array([run_id] * table.num_rows, pa.string()))


def _memory_query(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any]) -> pd.DataFrame:
    text = sqlmod.canned_queries()[name][1]
    return con.execute(text, params).fetch_df()


def memory_figures(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """:func:`figures` over a :func:`memory_connection` (no store views, no filters)."""
    return _memory_query(con, "health_figures", {"runs": None, "workloads": None, "dp_ranks": None,
                                                  "t0": None, "t1": None})


def memory_by_position(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    return _memory_query(con, "health_by_position", {"runs": None, "dp_ranks": None})


def run_row(frame: pd.DataFrame, run_id: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The pooled row (every DP rank, every workload) of one run, as a dict; None when absent."""
    sel = frame[(frame["dp_rank"] == "*") & (frame["workload"] == "*")]
    if run_id is not None:
        sel = sel[sel["run_id"] == run_id]
    if sel.empty:
        return None
    return {k: (None if is_missing(v) else v) for k, v in sel.iloc[0].to_dict().items()}


def is_missing(v: Any) -> bool:
    """None, NA or NaN (a figure with no data)."""
    try:
        return v is None or v is pd.NA or (isinstance(v, float) and v != v)
    except TypeError:
        return False


def expected_accept_error(row: Mapping[str, Any]) -> Optional[float]:
    """``(expected - observed) / observed`` accepted drafts over the request-steps that carry survival."""
    exp, act = row.get("expected_accepted"), row.get("survival_accepted")
    if exp is None or not act:
        return None
    return (float(exp) - float(act)) / float(act)


# -- verdicts ---------------------------------------------------------------------

def server_findings(state: ServerState) -> list[Finding]:
    """What the server's own arguments say: mode, records, cost table, STS, metrics."""
    out: list[Finding] = []
    if state.algorithm is not None and str(state.algorithm).upper() != "DSPARK":
        out.append(Finding("fail", "not_dspark", f"the server runs speculative algorithm {state.algorithm!r}, "
                           "not DSpark", f"speculative_algorithm = {state.algorithm!r}",
                           "start it with --speculative-algorithm DSPARK"))
        return out
    if state.mode == "static":
        out.append(Finding("warn", "static_mode", "verify mode is static: every step verifies the whole block "
                           "and the confidence head is not even built", "SGLANG_RAGGED_VERIFY_MODE = static",
                           "SGLANG_RAGGED_VERIFY_MODE=compact (production) or cap-accept (to see the ceiling)"))
    if state.components is not None and "all" not in state.components:
        missing = [c for c in _REQUIRED_COMPONENTS if c not in state.components]
        if missing:
            out.append(Finding("fail", "records_components", "the debug dump lacks components the health figures "
                               f"need: {', '.join(missing)}",
                               f"SGLANG_DSPARK_DEBUG_DUMP = {','.join(sorted(state.components)) or '(empty)'}",
                               "SGLANG_DSPARK_DEBUG_DUMP=core,step_cpu_time,step_gpu_time,draft_gpu_time,"
                               "target_verify_gpu_time,reqs (or all)"))
    if state.has_records is False:
        out.append(Finding("fail", "no_records", "the server exposes no dspark_info_record: nothing to judge",
                           "no internal_states[i].dspark_info_record in /server_info",
                           "set SGLANG_DSPARK_DEBUG_DUMP=all in the server's environment"))
    if state.mode in ("compact", "cap-accept") and not state.cost_table_loaded:
        out.append(Finding("fail", "no_cost_table", "no cost table loaded: SGLang's planner runs its flat "
                           "uninitialised table and verifies the whole block every step (trimming inactive)",
                           f"{COST_TABLE_FLAG.lstrip('-').replace('-', '_')} = None"
                           + (f", emulator_sps_table = {state.emulator_sps_table}" if state.emulator_sps_table
                              else ""),
                           f"start the server with {COST_TABLE_FLAG} TABLE.json; {PROFILE_HINT}"))
    if state.mode in ("compact", "cap-accept") and not state.sts_path:
        out.append(Finding("info", "no_sts", "no STS calibration loaded: the planner trusts the raw confidence "
                           "head", f"{STS_FLAG.lstrip('-').replace('-', '_')} = None",
                           f"fit one (`dspark-obs calibrate --data D --run R --fit-sts sts.json`) and start the "
                           f"server with {STS_FLAG} sts.json"))
    if state.enable_metrics is False:
        out.append(Finding("info", "metrics_off", "SGLang's own Prometheus metrics are off",
                           "enable_metrics = False", "start the server with --enable-metrics"))
    return out


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _trimming(row: Mapping[str, Any], state: Optional[ServerState], lim: Limits) -> list[Finding]:
    n = int(row.get("request_steps") or 0)
    if n < lim.min_request_steps:
        return [Finding("info", "few_steps", f"only {n} request-steps: too few to judge trimming",
                        f"{n} < {lim.min_request_steps} request-steps", "send more traffic, then run doctor again")]
    gamma = row.get("gamma")
    share = float(row.get("budget_trimmed_share") or 0.0)
    evidence = (f"{int(row.get('budget_trimmed_steps') or 0)} of {n} request-steps budget-trimmed ({_pct(share)}; "
                f"limit {_pct(lim.min_budget_trimmed_share)}), {int(row.get('window_sizes') or 0)} window size(s) "
                f"seen, trim ratio {float(row.get('trim_ratio') or 1):.3f}"
                + (f", verify_len < {int(gamma) + 1} in {_pct(row.get('trimmed_share'))}" if gamma else ""))
    figs = {k: row.get(k) for k in ("budget_trimmed_share", "trimmed_share", "window_sizes", "trim_ratio")}
    if state is not None and state.mode == "static":
        return []
    no_table = state is not None and not state.cost_table_loaded
    if share < lim.min_budget_trimmed_share or no_table:
        fix = (f"start the server with {COST_TABLE_FLAG} TABLE.json; {PROFILE_HINT}" if no_table or state is None
               else "the cost table says a full verify is always cheapest: re-profile it on this hardware "
                    f"({PROFILE_HINT})")
        what = "trimming inactive" + (": no cost table loaded" if no_table else "")
        return [Finding("fail", "trimming_inactive", what, evidence, fix, figs)]
    return [Finding("ok", "trimming_active", "trimming active", evidence, "", figs)]


def _regret(row: Mapping[str, Any], lim: Limits) -> list[Finding]:
    regret = row.get("trim_regret")
    if regret is None or int(row.get("trimmed_steps") or 0) < lim.min_request_steps:
        return []
    lost = row.get("tokens_lost")
    evidence = (f"{int(row['censored_steps'])} of {int(row['trimmed_steps'])} trimmed request-steps accepted "
                f"their whole window (trim regret {_pct(regret)}, limit {_pct(lim.max_trim_regret)})")
    if lost is not None:
        evidence += (f"; tokens lost to trimming {lost:.0f} [{row.get('tokens_lost_lo') or 0:.0f}, "
                     f"{row.get('tokens_lost_hi') or 0:.0f}] over {int(row['ceiling_steps'])} request-steps")
    figs = {k: row.get(k) for k in ("trim_regret", "tokens_lost", "tokens_lost_lo", "tokens_lost_hi")}
    out = []
    if regret > lim.max_trim_regret:
        out.append(Finding("warn", "trim_regret", "trimming cuts windows that would have been accepted",
                           evidence, "check the confidence head's calibration (`dspark-obs calibrate`) and the "
                           "cost table; `dspark-obs replay` predicts the gain of a change", figs))
    else:
        out.append(Finding("ok", "trim_regret", "trim regret within its limit", evidence, "", figs))
    if lost is None:
        out.append(Finding("info", "tokens_lost_unknown", "tokens lost to trimming not estimated yet",
                           "no ceiling rows for the run", "`dspark-obs estimate --data D --run R`"))
    return out


def _acceptance(row: Mapping[str, Any], positions: Optional[pd.DataFrame], lim: Limits) -> list[Finding]:
    out = []
    acc, sg = row.get("acceptance"), row.get("spec_accept_rate")
    if acc is not None and sg is not None:
        out.append(Finding("info", "accept_rate_denominator", "SGLang's spec_accept_rate divides by the full block",
                           f"accepted / drafts verified = {acc:.3f}; spec_accept_rate (accepted / gamma per step) = "
                           f"{sg:.3f}; gap {acc - sg:+.3f}", "judge acceptance by dspark_obs:accepted_drafts_total / "
                           "dspark_obs:verified_drafts_total", {"acceptance": acc, "spec_accept_rate": sg}))
    err = expected_accept_error(row)
    if err is not None and int(row.get("survival_steps") or 0) >= lim.min_request_steps:
        per = ""
        if positions is not None and not positions.empty:
            per = "; by position " + ", ".join(f"k{int(p.position)} {p.expected:.2f}/{p.actual:.2f}"
                                               for p in positions.itertuples())
        ev = (f"survival predicts {float(row['expected_accepted']):.0f} accepted drafts, "
              f"{int(row['survival_accepted'])} were accepted ({err:+.1%}, limit ±{lim.max_expected_accept_error:.0%})"
              f"{per} (expected/actual)")
        if abs(err) > lim.max_expected_accept_error:
            out.append(Finding("warn", "expected_vs_actual", "the confidence head mispredicts acceptance", ev,
                               f"fit STS temperatures (`dspark-obs calibrate --data D --run R --fit-sts sts.json`) "
                               f"and start the server with {STS_FLAG} sts.json", {"expected_accept_error": err}))
        else:
            out.append(Finding("ok", "expected_vs_actual", "survival predicts acceptance", ev, "",
                               {"expected_accept_error": err}))
    return out


def _steps(row: Mapping[str, Any], lim: Limits) -> list[Finding]:
    out = []
    mape, fit = row.get("costtable_mape"), int(row.get("fit_steps") or 0)
    if mape is not None and fit >= lim.min_fit_steps:
        drift = row.get("costtable_mape_drift")
        ev = (f"predicted_step_ms vs step_gpu_ms over {fit} steps: MAPE {_pct(mape)} (limit "
              f"{_pct(lim.max_costtable_mape)}); drift {_pct(drift)} second half vs first")
        figs = {"costtable_mape": mape, "costtable_mape_drift": drift}
        if mape > lim.max_costtable_mape:
            out.append(Finding("warn", "costtable_fit", "the cost table does not predict step time", ev,
                               PROFILE_HINT, figs))
        elif drift is not None and drift > lim.max_costtable_mape_drift:
            out.append(Finding("warn", "costtable_drift", "the cost table's error grows over the run", ev,
                               PROFILE_HINT, figs))
        else:
            out.append(Finding("ok", "costtable_fit", "the cost table predicts step time", ev, "", figs))
    pad = row.get("padding_share")
    if pad is not None:
        ev = (f"{int(row['padded_tokens'])} of {int(row['graph_tokens'])} verify tokens are graph-tier padding "
              f"({_pct(pad)}, limit {_pct(lim.max_padding_share)})")
        if row.get("dp_tier_tokens") is not None:
            ev += f"; {int(row['dp_tier_tokens'])} tokens from DP ranks rounding up to the largest rank's tier"
        sev = "warn" if pad > lim.max_padding_share else "ok"
        out.append(Finding(sev, "padding", "CUDA-graph tier padding" + (" is large" if sev == "warn" else ""), ev,
                           "--speculative-dspark-align-verify-tokens-to-graph-tier (compact) lets the budget fill "
                           "the tier" if sev == "warn" else "", {"padding_share": pad}))
    return out


def _observation(row: Mapping[str, Any], lim: Limits) -> list[Finding]:
    """The collector's own cost to the server: its share of wall time answering polls and clears.

    Timed from outside (each request's round trip), so it bounds the step-loop
    time the polls took from above: a busy server's queueing is in it too.
    """
    share = row.get("observation_share")
    if share is None:
        return []
    ev = (f"the server spent {float(row['observation_server_s']):.2f} s of the collector's "
          f"{float(row['collect_s']):.1f} s answering its {int(row['observation_requests'])} polls and clears "
          f"({_pct(share)}, limit {_pct(lim.max_observation_share)})")
    if row.get("poll_ms") is not None and row.get("step_cpu_ms") is not None:
        ev += (f"; one takes {float(row['poll_ms']):.1f} ms, {float(row['poll_step_ratio']):.2f} x the mean "
               f"step ({float(row['step_cpu_ms']):.1f} ms)")
    figs = {k: row.get(k) for k in ("observation_share", "poll_ms", "poll_step_ratio")}
    if share > lim.max_observation_share:
        # info, not warn: the figure bounds the cost from above and cannot convict the collector alone
        return [Finding("info", "observation_overhead", "observing the server may slow its step loop: its "
                        "polls take more than the limit's share of wall time (an upper bound: measure the "
                        "slowdown with bench/collect.py before acting)", ev,
                        "poll less often or clear sooner (`collect --poll-interval` longer, `--clear-at` lower: every "
                        "poll re-encodes the records held since the last clear, about clear_at / 2 per poll "
                        "interval) or record fewer components (SGLANG_DSPARK_DEBUG_DUMP=core,reqs is what the "
                        "health figures need)", figs)]
    return [Finding("ok", "observation_overhead", "observation overhead within its limit", ev, "", figs)]


def diagnose(row: Optional[Mapping[str, Any]], *, state: Optional[ServerState] = None,
             positions: Optional[pd.DataFrame] = None, limits: Optional[Limits] = None) -> list[Finding]:
    """Ranked findings for one run (its pooled :func:`figures` row) and, when known, its server's state."""
    lim = limits or Limits()
    out = server_findings(state) if state is not None else []
    if row is None:
        out.append(Finding("info", "no_steps", "no request-steps recorded yet", "0 request-steps",
                           "send traffic (or `dspark-obs collect --workload gsm8k ...`), then run doctor again"))
        return rank(out)
    trim = _trimming(row, state, lim)
    regret = _regret(row, lim)
    if any(f.code == "trimming_inactive" for f in trim):  # one finding for one cause
        out = [f for f in out if f.code != "no_cost_table"]
        regret = [f for f in regret if f.code != "tokens_lost_unknown"]
    steps = _steps(row, lim)
    if state is not None and not state.cost_table_loaded:  # the flat placeholder predicts nothing
        steps = [f for f in steps if not f.code.startswith("costtable")]
    out += trim + regret + _acceptance(row, positions, lim) + steps + _observation(row, lim)
    return rank(out)


def rank(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first (fail, warn, info, ok); the order found within a severity."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def exit_code(findings: Iterable[Finding], fail_on: str = "warn") -> int:
    """1 when any finding is at or above ``fail_on`` (warn | fail), else 0."""
    if fail_on not in ("warn", "fail"):
        raise ValueError(f"fail_on must be warn or fail, got {fail_on!r}")
    worst = SEVERITIES.index(fail_on)
    return int(any(SEVERITIES.index(f.severity) <= worst for f in findings))
