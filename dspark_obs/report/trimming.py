"""Report section: trimming health — the figures of :mod:`dspark_obs.health` as gated report figures.

Per run, the pooled row of ``health_figures`` (and, for the trim figures,
each workload's): trimming active (the budget-trimmed share, compact runs
only: static and cap-accept verify whole blocks by design), trim ratio,
trim regret, tokens lost to trimming (with the ceiling's [lo, hi]), the
acceptance-denominator gap, expected vs actual acceptance, padding, the
cost table's drift and the observation's own cost to the server.  The limits
are ``[metrics.NAME]`` in thresholds.toml, which ``dspark-obs doctor`` reads too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark_obs import health
from dspark_obs.report.inputs import RunInfo
from dspark_obs.report.model import Figure

__all__ = ["HealthSection", "health_section"]

_PER_WORKLOAD = (("budget_trimmed_share", "request_steps"), ("trim_ratio", "request_steps"),
                 ("trim_regret", "trimmed_steps"))


@dataclass
class HealthSection:
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _value(row: dict, name: str):
    v = row.get(name)
    return None if health.is_missing(v) else float(v)


def _run_figures(run: RunInfo, rows: list[dict]) -> list[Figure]:
    out = []
    for row in rows:
        wl = row["workload"]
        for metric, n_col in _PER_WORKLOAD:
            if metric == "budget_trimmed_share" and run.mode != "compact":
                continue
            out.append(Figure(metric, run.run_id, _value(row, metric), workload=wl, n=int(row[n_col] or 0),
                              detail={"window_sizes": int(row["window_sizes"] or 0)} if metric != "trim_regret"
                              else {"censored_steps": int(row["censored_steps"] or 0)}))
    pooled = next(r for r in rows if r["workload"] == "*")
    n = int(pooled["request_steps"] or 0)
    if _value(pooled, "tokens_lost") is not None:
        out.append(Figure("tokens_lost", run.run_id, _value(pooled, "tokens_lost"), workload="*",
                          ci_low=_value(pooled, "tokens_lost_lo"), ci_high=_value(pooled, "tokens_lost_hi"),
                          ci_method="ceiling [lo, hi]", n=int(pooled["ceiling_steps"] or 0)))
    out.append(Figure("accept_rate_gap", run.run_id, _value(pooled, "accept_rate_gap"), workload="*", n=n,
                      detail={"acceptance": _value(pooled, "acceptance"),
                              "spec_accept_rate": _value(pooled, "spec_accept_rate")}))
    err = health.expected_accept_error(pooled)
    out.append(Figure("expected_accept_error", run.run_id, None if err is None else abs(err), workload="*",
                      n=int(pooled["survival_steps"] or 0), detail={"signed": err}))
    out.append(Figure("padding_share", run.run_id, _value(pooled, "padding_share"),
                      n=int(pooled["decode_steps"] or 0) if not health.is_missing(pooled["decode_steps"]) else 0))
    out.append(Figure("costtable_mape_drift", run.run_id, _value(pooled, "costtable_mape_drift"),
                      n=int(pooled["fit_steps"] or 0) if not health.is_missing(pooled["fit_steps"]) else 0,
                      detail={"mape": _value(pooled, "costtable_mape")}))
    requests = pooled.get("observation_requests")
    out.append(Figure("observation_share", run.run_id, _value(pooled, "observation_share"),
                      n=0 if health.is_missing(requests) else int(requests),
                      detail={"poll_ms": _value(pooled, "poll_ms"),
                              "poll_step_ratio": _value(pooled, "poll_step_ratio")}))
    return out


def health_section(con, runs: list[RunInfo]) -> HealthSection:
    """The health figures of ``runs`` (pooled over DP ranks; per workload for the trim figures)."""
    out = HealthSection()
    if not runs:
        return out
    frame = health.figures(con, runs=[r.run_id for r in runs])
    frame = frame[frame["dp_rank"] == "*"]
    for run in runs:
        rows = frame[frame["run_id"] == run.run_id].to_dict("records")
        if not rows:
            out.notes.append(f"{run.run_id}: no request-steps, no trimming-health figures")
            continue
        out.figures += _run_figures(run, rows)
    return out
