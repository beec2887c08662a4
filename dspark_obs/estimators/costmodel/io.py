"""The cost model's thin layer: a run's steps from the views, the fit, the result tables.

:func:`fit_runs` reads the steps of one or more runs, fits the table with and
without the context term and scores it (with the server's own table) per batch
bucket; :func:`write_results` writes ``costmodel_fit`` and ``costmodel_error``;
:func:`fitted_table_of` reads a stored fit back as SGLang's table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs import costtable as ct
from dspark_obs import sql as sqlmod
from dspark_obs.estimators.costmodel.additive import (
    TIMERS,
    AdditiveFit,
    bin_cells,
    bs_buckets,
    context_slope,
    error_summary,
    fit_additive,
    probe_grid,
    target_tokens,
)

_STEPS_SQL = """
SELECT s.run_id, s.dp_rank, s.segment, s.forward_ct, s.mode, s.bs, s.num_verify_tokens,
       s.{timer} AS measured_ms, s.predicted_step_ms,
       q.context_tokens,
       coalesce(r.gamma, q.block) AS gamma
FROM steps AS s
LEFT JOIN (
    SELECT run_id, dp_rank, segment, forward_ct, CAST(sum(prefix_len) AS DOUBLE) AS context_tokens,
           max(len(draft_tokens)) AS block
    FROM step_reqs WHERE list_contains($runs, run_id)
    GROUP BY run_id, dp_rank, segment, forward_ct
) AS q USING (run_id, dp_rank, segment, forward_ct)
LEFT JOIN runs AS r ON r.run_id = s.run_id
WHERE list_contains($runs, s.run_id) AND s.bs > 0
ORDER BY s.run_id, s.dp_rank, s.segment, s.forward_ct
"""


def load_steps(con, runs: Sequence[str], *, timer: str = "step_gpu_ms") -> pa.Table:
    """Decode steps of ``runs`` with ``m`` (target tokens), ``measured_s`` and ``context_tokens``.

    Columns: run_id, dp_rank, segment, forward_ct, mode, bs, num_verify_tokens, m,
    measured_s (null where the timer is absent), predicted_s (the server's
    predicted_step_ms / 1e3), context_tokens (sum of prefix_len; null without reqs), gamma.
    """
    _check_timer(timer)
    sqlmod.refresh(con)
    raw = con.sql(_STEPS_SQL.format(timer=timer), params={"runs": list(runs)}).to_arrow_table()
    if raw.num_rows == 0:
        return raw
    gamma = raw.column("gamma").to_numpy(zero_copy_only=False)
    if np.any(~np.isfinite(gamma.astype(np.float64))):
        raise ValueError("gamma is unknown for some steps (no runs row and no step_reqs); "
                         "re-collect the run so its runs row is written")
    m = target_tokens(raw.column("mode").to_numpy(zero_copy_only=False), raw.column("bs").to_numpy(),
                      raw.column("num_verify_tokens").to_numpy(), gamma.astype(np.int64))
    out = raw.append_column("m", pa.array(m))
    measured = pc.divide(out.column("measured_ms").cast(pa.float64()), 1e3)
    predicted = pc.divide(out.column("predicted_step_ms").cast(pa.float64()), 1e3)
    out = out.drop_columns(["measured_ms", "predicted_step_ms"])
    return out.append_column("measured_s", measured).append_column("predicted_s", predicted)


def _check_timer(timer: str) -> None:
    if timer not in TIMERS:
        raise ValueError(f"timer {timer!r} is not one of {', '.join(TIMERS)} (--timer)")


@dataclass
class CostModelReport:
    """Everything ``fit_runs`` found: the fits, their errors, and the result-table rows."""

    runs: list[str]
    timer: str
    fit: AdditiveFit
    fit_context: Optional[AdditiveFit]
    errors: dict[str, list[dict]] = field(default_factory=dict)  # run -> rows (with model)
    context_note: str = ""

    @property
    def context_helps(self) -> Optional[bool]:
        """True when the context coefficient is > 3 standard errors above 0 and lowers the pooled MAPE.

        None when no context term could be fitted (see ``context_note``).
        """
        if self.fit_context is None:
            return None
        plain, with_ctx = self.overall_mape("fitted"), self.overall_mape("fitted+context")
        z = self.fit_context.context_seconds_per_token / max(self.fit_context.context_stderr or 0.0, 1e-300)
        return bool(z > 3.0 and with_ctx is not None and plain is not None and with_ctx < plain)

    def overall_mape(self, model: str) -> Optional[float]:
        """Step-weighted MAPE of ``model`` over every run of the pool."""
        rows = [r for rs in self.errors.values() for r in rs if r["model"] == model and r["bs_bucket"] == "*"]
        n = sum(r["n"] for r in rows)
        return sum(r["mape"] * r["n"] for r in rows if r["n"]) / n if n else None

    def fit_rows(self) -> list[dict]:
        rows = []
        pooled = ",".join(self.runs)
        for name, f in (("fitted", self.fit), ("fitted+context", self.fit_context)):
            if f is None:
                continue
            t = f.table
            rows.append({"model": name, "term": "bias", "probe": None, "value_seconds": t.bias_seconds,
                         "stderr_seconds": f.bias_stderr, "covered": True})
            for p, v, s, c in zip(t.bs_probes, t.alpha_seconds, f.alpha_stderr, f.bs_covered):
                rows.append({"model": name, "term": "alpha", "probe": p, "value_seconds": v,
                             "stderr_seconds": s, "covered": c})
            for p, v, s, c in zip(t.m_probes, t.theta_seconds, f.theta_stderr, f.m_covered):
                rows.append({"model": name, "term": "theta", "probe": p, "value_seconds": v,
                             "stderr_seconds": s, "covered": c})
            if f.context_seconds_per_token is not None:
                rows.append({"model": name, "term": "context", "probe": None,
                             "value_seconds": f.context_seconds_per_token,
                             "stderr_seconds": f.context_stderr, "covered": True})
        for r in rows:
            r.update(timer=self.timer, pooled_runs=pooled)
        return rows


def fit_runs(con, runs: Sequence[str], *, timer: str = "step_gpu_ms",
             bs_probes: Optional[Sequence[int]] = None, m_probes: Optional[Sequence[int]] = None,
             base_table: Optional[ct.SpsAdditiveCostTable] = None, m_bin_width: int = 1) -> CostModelReport:
    """Pool the decode steps of ``runs``, fit with and without the context term, and score.

    Probe grids default to ``base_table``'s (else SGLang-shaped default table's) probes up
    to the first probe at or above the largest observed value.
    """
    runs = list(dict.fromkeys(runs))
    if not runs:
        raise ValueError("no run given: pass --run RUN (repeat it to pool runs)")
    steps = load_steps(con, runs, timer=timer)
    known = set(steps.column("run_id").to_pylist()) if steps.num_rows else set()
    missing = [r for r in runs if r not in known]
    if missing:
        raise ValueError(f"no decode steps for run(s) {missing}; list runs with "
                         "`dspark-obs sql --data D run_overview`")
    measured = steps.column("measured_s").to_numpy(zero_copy_only=False).astype(np.float64)
    ok = np.isfinite(measured)
    if not ok.any():
        raise ValueError(f"no step has {timer}; pick another --timer ({', '.join(TIMERS)}) or collect with "
                         "its SGLANG_DSPARK_DEBUG_DUMP component")
    bs = steps.column("bs").to_numpy().astype(np.int64)
    m = steps.column("m").to_numpy().astype(np.float64)
    ctx = steps.column("context_tokens").to_numpy(zero_copy_only=False).astype(np.float64)
    base = base_table or ct.default_additive_table()
    bs_grid = list(bs_probes) if bs_probes else probe_grid(base.bs_probes, bs[ok].max())
    m_grid = list(m_probes) if m_probes else probe_grid(base.m_probes, m[ok].max())
    cells = bin_cells(bs[ok], m[ok], measured[ok], ctx[ok], m_bin_width=m_bin_width)
    fit = fit_additive(cells, bs_probes=bs_grid, m_probes=m_grid)
    fit_ctx, note = None, ""
    try:
        slope = context_slope(cells.cell_of_step, measured[ok], ctx[ok])
    except ValueError as exc:
        note = f"no context term: {exc}"
    else:
        net = bin_cells(bs[ok], m[ok], measured[ok] - slope[0] * ctx[ok], ctx[ok], m_bin_width=m_bin_width)
        fit_ctx = fit_additive(net, bs_probes=bs_grid, m_probes=m_grid, context=slope)
    report = CostModelReport(runs=runs, timer=timer, fit=fit, fit_context=fit_ctx, context_note=note)
    run_ids = np.asarray(steps.column("run_id").to_pylist(), dtype=object)
    server = steps.column("predicted_s").to_numpy(zero_copy_only=False).astype(np.float64)
    predictions = {"fitted": fit.predict_seconds(bs, m)}
    if fit_ctx is not None:
        predictions["fitted+context"] = fit_ctx.predict_seconds(bs, m, ctx)
    predictions["server"] = server
    buckets = bs_buckets(bs, fit.table.bs_probes)
    for run in runs:
        sel = run_ids == run
        rows = []
        for model, pred in predictions.items():
            for row in error_summary(measured[sel], pred[sel], buckets[sel]):
                rows.append({"model": model, **row, "timer": timer})
        report.errors[run] = rows
    return report


def write_results(store, report: CostModelReport) -> None:
    """Replace ``costmodel_fit`` and ``costmodel_error`` of every run in the report."""
    fit_rows = report.fit_rows()
    for run in report.runs:
        for table, rows in (("costmodel_fit", fit_rows), ("costmodel_error", report.errors[run])):
            store.drop_run(table, run)
            store.write(table, run, rows)


def fitted_table_of(con, run: str, *, model: str = "fitted") -> Optional[ct.SpsAdditiveCostTable]:
    """The additive table stored in ``costmodel_fit`` for ``run``, if one was written."""
    sqlmod.refresh(con)
    rows = con.sql(
        "SELECT term, probe, value_seconds FROM costmodel_fit WHERE run_id = $run AND model = $model "
        "ORDER BY term, probe", params={"run": run, "model": model}).fetchall()
    if not rows:
        return None
    bias = [v for t, _, v in rows if t == "bias"]
    alpha = [(p, v) for t, p, v in rows if t == "alpha"]
    theta = [(p, v) for t, p, v in rows if t == "theta"]
    if not bias or not alpha or not theta:
        return None
    return ct.SpsAdditiveCostTable(bias_seconds=bias[0], bs_probes=[p for p, _ in alpha],
                                   alpha_seconds=[v for _, v in alpha], m_probes=[p for p, _ in theta],
                                   theta_seconds=[v for _, v in theta])
