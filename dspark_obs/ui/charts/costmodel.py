"""Charts of the step-time cost model (the write-up's Fig. 6) and the helpers that shape their frames.

Inputs: the ``ui_costmodel_cells`` frame (steps binned by batch size and
target tokens M, median time), the ``ui_costmodel_fit`` frame (the fitted
additive table, ms) and the ``ui_costmodel_error`` frame.  The helpers turn a
fit frame into SGLang's additive table and price the cells with it; they run
no query.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from dspark_obs import costtable as ct
from dspark_obs.estimators.figures import costmodel_curves
from dspark_obs.ui.charts.base import as_frame, new_figure, no_data, require_columns, tidy_legend
from dspark_obs.ui.palette import model_color

__all__ = ["table_from_fit", "predict_cells", "curve_frame", "costmodel_raw_vs_fitted", "predicted_vs_measured",
           "residuals_by_batch", "error_by_batch"]

_SCALE = "Viridis"


def table_from_fit(fit, *, model: str = "fitted") -> ct.SpsAdditiveCostTable | None:
    """SGLang's additive table from rows of ``ui_costmodel_fit`` (term, probe, value_ms) for one model.

    Returns None when the rows lack a bias, an alpha or a theta term.
    """
    df = as_frame(fit)
    if df.empty:
        return None
    require_columns(df, ["model", "term", "probe", "value_ms"], "table_from_fit")
    df = df[df["model"] == model]
    bias = df[df["term"] == "bias"]["value_ms"]
    alpha = df[df["term"] == "alpha"].sort_values("probe")
    theta = df[df["term"] == "theta"].sort_values("probe")
    if bias.empty or alpha.empty or theta.empty:
        return None
    return ct.SpsAdditiveCostTable(
        bias_seconds=float(bias.iloc[0]) / 1e3,
        bs_probes=[int(p) for p in alpha["probe"]], alpha_seconds=[float(v) / 1e3 for v in alpha["value_ms"]],
        m_probes=[int(p) for p in theta["probe"]], theta_seconds=[float(v) / 1e3 for v in theta["value_ms"]])


def predict_cells(cells, table: ct.SpsAdditiveCostTable | None) -> pd.DataFrame:
    """The cells with ``fitted_ms`` = the table at (bs, M), NaN without a table."""
    df = as_frame(cells).copy()
    require_columns(df, ["bs", "m"], "predict_cells")
    if table is None or df.empty:
        df["fitted_ms"] = np.nan
        return df
    bs = df["bs"].to_numpy(dtype=float)
    m = df["m"].to_numpy(dtype=float)
    df["fitted_ms"] = np.asarray(table.step_seconds(num_reqs=bs, budget=m - bs), dtype=float) * 1e3
    return df


def curve_frame(table: ct.SpsAdditiveCostTable | None, bs_values, *, gamma: int = 6, points: int = 24) -> pd.DataFrame:
    """``T(bs, M)`` in ms for each batch size over M in [bs, bs * (gamma + 1)] (empty without a table)."""
    if table is None or not len(bs_values):
        return pd.DataFrame({"bs": [], "m": [], "step_ms": []})

    return costmodel_curves(table, sorted({int(b) for b in bs_values if b >= 1}), gamma=gamma,
                            points=points).to_pandas()


def _bs_colors(values: np.ndarray, lo: float, hi: float) -> list[str]:
    span = np.log(hi) - np.log(lo) if hi > lo else 1.0
    pos = np.clip((np.log(np.maximum(values, 1)) - np.log(lo)) / span, 0, 1)
    return sample_colorscale(_SCALE, pos.tolist())


def costmodel_raw_vs_fitted(cells, curves=None) -> go.Figure:
    """Measured step time per (bs, M) cell against the fitted additive model's curves.

    ``cells`` columns: bs, m, steps, measured_ms.  ``curves`` columns: bs, m,
    step_ms (see :func:`curve_frame`); None or empty draws the cells only.
    """
    df = as_frame(cells)
    cv = as_frame(curves)
    require_columns(df, ["bs", "m", "steps", "measured_ms"], "costmodel_raw_vs_fitted")
    require_columns(cv, ["bs", "m", "step_ms"], "costmodel_raw_vs_fitted")
    fig = new_figure(
        "Step time: measured cells vs the fitted additive model", "target tokens M per step (tokens)",
        "step time (ms)",
        "Dots: median measured step time of the steps with that batch size (colour) and M; lines: the fitted "
        "T(bs, M) = bias + alpha(bs) + theta(M) for a few batch sizes. Dots off their line are where the table "
        "misprices a shape.", height=460)
    if df.empty:
        return no_data(fig)
    bs_all = np.concatenate([df["bs"].to_numpy(dtype=float), cv["bs"].to_numpy(dtype=float) if not cv.empty else []])
    lo, hi = float(max(bs_all.min(), 1)), float(max(bs_all.max(), 1))
    steps = df["steps"].to_numpy(dtype=float)
    fig.add_scatter(
        x=df["m"], y=df["measured_ms"], mode="markers", name="measured (cell median)",
        marker=dict(size=5 + 12 * np.sqrt(steps / max(steps.max(), 1.0)), color=np.log2(df["bs"].clip(lower=1)),
                    colorscale=_SCALE, cmin=np.log2(lo), cmax=np.log2(hi), opacity=0.8,
                    line=dict(color="white", width=0.5),
                    colorbar=dict(title=dict(text="batch size"), tickvals=np.log2([b for b in (1, 2, 4, 8, 16, 32, 64,
                                  128, 256, 512) if lo <= b <= hi] or [lo]).tolist(),
                                  ticktext=[str(b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if lo <= b <= hi]
                                  or [str(int(lo))], len=0.8)),
        customdata=df[["bs", "steps"]].to_numpy(),
        hovertemplate="bs %{customdata[0]}, M %{x}: %{y:.3f} ms (%{customdata[1]} steps)<extra></extra>")
    if not cv.empty:
        colors = dict(zip(sorted(set(cv["bs"])), _bs_colors(np.array(sorted(set(cv["bs"])), dtype=float), lo, hi)))
        for b, sub in cv.groupby("bs", sort=True):
            fig.add_scatter(x=sub["m"], y=sub["step_ms"], mode="lines", name=f"fitted, bs={int(b)}",
                            line=dict(color=colors[b], width=2),
                            hovertemplate=f"fitted bs={int(b)}, M %{{x:.0f}}: %{{y:.3f}} ms<extra></extra>")
    return tidy_legend(fig)


def _model_series(df: pd.DataFrame) -> list[tuple[str, str]]:
    """``(column, model)`` of the predictions a cells frame holds: the fitted table's, the server's."""
    return [(c, m) for c, m in (("fitted_ms", "fitted"), ("server_ms", "server"))
            if c in df.columns and df[c].notna().any()]


def _cell_marker(model: str, steps: np.ndarray) -> dict:
    """A cell's marker: the model's colour, sized by the cell's steps."""
    return dict(color=model_color(model), size=5 + 10 * np.sqrt(steps / max(steps.max(), 1.0)), opacity=0.75)


def predicted_vs_measured(cells) -> go.Figure:
    """Predicted vs measured step time per cell, for the fitted table and the server's own prediction.

    Columns: measured_ms, steps, and fitted_ms and/or server_ms.
    """
    df = as_frame(cells)
    require_columns(df, ["measured_ms", "steps"], "predicted_vs_measured")
    fig = new_figure(
        "Predicted vs measured step time", "measured step time (ms, cell median)", "predicted step time (ms)",
        "Each point is one (batch size, M) cell; on the dashed diagonal the prediction is exact. 'server' is "
        "the predicted_step_ms SGLang logged with the table it planned with.")
    series = _model_series(df)
    if df.empty or not series:
        return no_data(fig)
    values = np.concatenate([df["measured_ms"].to_numpy(dtype=float)]
                            + [df[c].to_numpy(dtype=float) for c, _ in series])
    lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#9E9E9E", dash="dash"),
                    name="exact", hoverinfo="skip")
    steps = df["steps"].to_numpy(dtype=float)
    for column, model in series:
        fig.add_scatter(x=df["measured_ms"], y=df[column], mode="markers", name=model,
                        marker=_cell_marker(model, steps),
                        hovertemplate="measured %{x:.3f} ms, predicted %{y:.3f} ms<extra>" + model + "</extra>")
    return tidy_legend(fig)


def residuals_by_batch(cells) -> go.Figure:
    """Prediction error (predicted - measured, ms) per cell against batch size, per model.

    Columns: bs, measured_ms, steps, and fitted_ms and/or server_ms.
    """
    df = as_frame(cells)
    require_columns(df, ["bs", "measured_ms", "steps"], "residuals_by_batch")
    fig = new_figure(
        "Residuals by batch size", "batch size (requests)", "predicted - measured (ms)",
        "Per (batch size, M) cell; a trend with batch size means alpha(bs) is off, a spread at one batch size "
        "that theta(M) or a context term is missing.")
    series = _model_series(df)
    if df.empty or not series:
        return no_data(fig)
    steps = df["steps"].to_numpy(dtype=float)
    for column, model in series:
        fig.add_scatter(x=df["bs"], y=df[column] - df["measured_ms"], mode="markers", name=model,
                        marker=_cell_marker(model, steps),
                        hovertemplate="bs %{x}: %{y:+.3f} ms<extra>" + model + "</extra>")
    fig.add_hline(y=0, line=dict(color="#8A8A8A", width=1))
    return tidy_legend(fig)


def error_by_batch(errors) -> go.Figure:
    """MAPE per batch-size bucket and model, from ``costmodel_error`` (bias in the hover).

    Columns: run_id, model, bs_bucket, bs_lo, n, mape, bias_ms.
    """
    df = as_frame(errors)
    require_columns(df, ["run_id", "model", "bs_bucket", "n", "mape", "bias_ms"], "error_by_batch")
    fig = new_figure(
        "Step-time error by batch size", "batch-size bucket (requests)", "MAPE (% of measured step time)",
        "Mean absolute percentage error of each model per bucket of batch sizes ('all' = every step); the "
        "fitted table should beat the server's own prediction wherever the server planned with a stale table.")
    if df.empty:
        return no_data(fig)
    multi = df["run_id"].nunique() > 1
    for model, sub in df.groupby("model", sort=False):
        if "bs_lo" in sub.columns:
            sub = sub.assign(_k=sub["bs_lo"].fillna(-1)).sort_values(["run_id", "_k"])
        buckets = ["all" if b == "*" else str(b) for b in sub["bs_bucket"]]
        x = [sub["run_id"].tolist(), buckets] if multi else buckets
        fig.add_bar(x=x, y=sub["mape"], name=str(model), marker_color=model_color(model),
                    customdata=sub[["n", "bias_ms"]].to_numpy(),
                    hovertemplate="%{y:.2%} over %{customdata[0]} steps; bias %{customdata[1]:+.3f} ms"
                                  "<extra>" + str(model) + "</extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(tickformat=".1%", rangemode="tozero")
    return tidy_legend(fig)
