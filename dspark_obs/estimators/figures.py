"""Data behind the write-up's figures, as Arrow tables for the chart builders.

* Fig 1/3 — total throughput vs per-user tok/s, one point per run and concurrency:
  :func:`throughput_points` (canned ``figure_throughput``).
* Fig 4 — window per workload and verify-length distribution with utilisation:
  :func:`window_summary` and :func:`verify_len_distribution` (canned
  ``figure_windows``, ``figure_verify_len``).
* Fig 6 — cost model: raw binned cells against the fitted table
  (:func:`costmodel_cells`), per-step predicted vs measured (:func:`predicted_vs_measured`),
  and fitted curves ``T(bs, M)`` (:func:`costmodel_curves`).  These take the frame from
  :func:`dspark_obs.estimators.costmodel.load_steps` and a fitted table, and run no query.

The query-backed helpers only bind parameters to the canned SQL; the arithmetic that SQL
does not do well lives in the pure functions below.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa

from dspark_obs import costtable as ct
from dspark_obs import sql as sqlmod
from dspark_obs.estimators.costmodel import AdditiveFit, bin_cells

__all__ = [
    "throughput_points", "window_summary", "verify_len_distribution", "costmodel_cells",
    "predicted_vs_measured", "costmodel_curves",
]


def _canned(con, name: str, run_id: Optional[str]) -> pa.Table:
    return sqlmod.query(con, name, {"run_id": run_id})


def throughput_points(con, *, run_id: Optional[str] = None) -> pa.Table:
    """Fig 1/3: one row per run and concurrency (see ``figure_throughput.sql`` for columns)."""
    return _canned(con, "figure_throughput", run_id)


def window_summary(con, *, run_id: Optional[str] = None) -> pa.Table:
    """Fig 4: mean window, full-window share and utilisation per run and workload."""
    return _canned(con, "figure_windows", run_id)


def verify_len_distribution(con, *, run_id: Optional[str] = None) -> pa.Table:
    """Fig 4: request-steps per verify_len (1..gamma+1) per run and workload, with utilisation."""
    return _canned(con, "figure_verify_len", run_id)


def _predict_ms(fit: AdditiveFit | ct.SpsAdditiveCostTable, bs: np.ndarray, m: np.ndarray,
                context_tokens: Optional[np.ndarray]) -> np.ndarray:
    if isinstance(fit, AdditiveFit):
        ctx = None if fit.context_seconds_per_token is None else np.nan_to_num(context_tokens)
        return fit.predict_seconds(bs, m, ctx) * 1e3
    return np.asarray(fit.step_seconds(num_reqs=bs, budget=m - bs), dtype=np.float64) * 1e3


def _arrays(steps: pa.Table) -> tuple[np.ndarray, ...]:
    missing = {"bs", "m", "measured_s", "context_tokens"} - set(steps.column_names)
    if missing:
        raise ValueError(f"steps frame lacks columns {sorted(missing)}; build it with costmodel.load_steps")
    col = lambda n: steps.column(n).to_numpy(zero_copy_only=False).astype(np.float64)  # noqa: E731
    return col("bs"), col("m"), col("measured_s"), col("context_tokens")


def costmodel_cells(steps: pa.Table, fit: AdditiveFit | ct.SpsAdditiveCostTable) -> pa.Table:
    """Fig 6 (raw vs fitted): binned ``(bs, M)`` cells with their median and fitted time.

    Columns: bs, m, n, measured_ms (median of the cell), fitted_ms (the table at the
    cell; with the context term at the cell's mean context when ``fit`` has one).
    """
    bs, m, measured, ctx = _arrays(steps)
    ok = np.isfinite(measured)
    if not ok.any():
        return pa.table({"bs": pa.array([], pa.int64()), "m": pa.array([], pa.float64()),
                         "n": pa.array([], pa.int64()), "measured_ms": pa.array([], pa.float64()),
                         "fitted_ms": pa.array([], pa.float64())})
    cells = bin_cells(bs[ok].astype(np.int64), m[ok], measured[ok], ctx[ok])
    fitted = _predict_ms(fit, cells.bs, cells.m, cells.context_tokens)
    return pa.table({"bs": cells.bs, "m": cells.m, "n": cells.n, "measured_ms": cells.seconds * 1e3,
                     "fitted_ms": fitted})


def predicted_vs_measured(steps: pa.Table, fit: AdditiveFit | ct.SpsAdditiveCostTable) -> pa.Table:
    """Fig 6 (predicted vs measured): one row per step with a measured time.

    Columns: run_id, bs, m, measured_ms, fitted_ms, server_ms (the step's own
    ``predicted_step_ms``; null where the server logged none).
    """
    bs, m, measured, ctx = _arrays(steps)
    ok = np.isfinite(measured)
    fitted = _predict_ms(fit, bs, m, ctx)
    server = (steps.column("predicted_s").to_numpy(zero_copy_only=False).astype(np.float64) * 1e3
              if "predicted_s" in steps.column_names else np.full(bs.size, np.nan))
    run = steps.column("run_id").filter(pa.array(ok)) if "run_id" in steps.column_names else pa.nulls(int(ok.sum()), pa.string())
    return pa.table({
        "run_id": run,
        "bs": bs[ok].astype(np.int64), "m": m[ok].astype(np.int64),
        "measured_ms": measured[ok] * 1e3, "fitted_ms": fitted[ok],
        "server_ms": pa.array(server[ok], mask=~np.isfinite(server[ok])),
    })


def costmodel_curves(table: ct.SpsAdditiveCostTable, bs_values: Sequence[int], *,
                     gamma: int = 6, points: int = 32) -> pa.Table:
    """Fig 6 (fitted lines): ``T(bs, M)`` in ms for each ``bs`` over ``M in [bs, bs*(gamma+1)]``.

    >>> t = costmodel_curves(ct.default_additive_table(), [1], points=2)
    >>> t.column("m").to_pylist(), [round(v, 3) for v in t.column("step_ms").to_pylist()]
    ([1.0, 7.0], [8.0, 8.262])
    """
    rows_bs, rows_m, rows_t = [], [], []
    for b in bs_values:
        if b < 1:
            raise ValueError(f"batch sizes must be >= 1, got {b}")
        m = np.linspace(b, b * (gamma + 1), points)
        rows_bs.append(np.full(points, b))
        rows_m.append(m)
        rows_t.append(np.asarray(table.step_seconds(num_reqs=np.full(points, b), budget=m - b)) * 1e3)
    cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa: E731
    return pa.table({"bs": cat(rows_bs, np.int64), "m": cat(rows_m, np.float64),
                     "step_ms": cat(rows_t, np.float64)})
