"""Chart builders: a frame in, a Plotly figure out; no query, no Streamlit.

The dashboard and the nightly report draw every figure through these
functions, so a figure looks the same wherever it appears.  Each figure has a
title, axis titles with units, and a one-line caption in
``fig.layout.meta["caption"]`` (read it with :func:`caption_of`).  Colours come
from :mod:`dspark_obs.ui.palette`.
"""

from dspark_obs.ui.charts.base import as_frame, caption_of, name_clock
from dspark_obs.ui.charts.calibration import (calibration_metrics, recalibration_held_out, reliability_diagram,
                                             sts_before_after)
from dspark_obs.ui.charts.ceiling import (
    accept_vs_ceiling, acceptance_by_position, estimate_categories, validation_bias, validation_coverage,
    validation_scatter,
)
from dspark_obs.ui.charts.costmodel import (
    costmodel_raw_vs_fitted, curve_frame, error_by_batch, predict_cells, predicted_vs_measured, residuals_by_batch,
    table_from_fit,
)
from dspark_obs.ui.charts.health import expected_vs_actual
from dspark_obs.ui.charts.requests import confidence_heatmap, request_timeline, token_logprobs
from dspark_obs.ui.charts.compare import compare_deltas
from dspark_obs.ui.charts.sweep import sweep_throughput, trim_gap_by_batch, trim_gap_frame
from dspark_obs.ui.charts.throughput import latency_percentiles, per_user_by_workload, throughput_curves
from dspark_obs.ui.charts.windows import (
    budget_timeline, utilisation_by_window, utilisation_by_workload, verify_len_distribution, window_by_workload,
    window_summary,
)

__all__ = [
    "expected_vs_actual",
    "recalibration_held_out",
    "as_frame", "caption_of", "name_clock",
    "accept_vs_ceiling", "acceptance_by_position", "estimate_categories", "validation_scatter",
    "validation_coverage", "validation_bias",
    "window_summary", "window_by_workload", "verify_len_distribution", "utilisation_by_window",
    "utilisation_by_workload", "budget_timeline",
    "reliability_diagram", "calibration_metrics", "sts_before_after",
    "table_from_fit", "predict_cells", "curve_frame", "costmodel_raw_vs_fitted", "predicted_vs_measured",
    "residuals_by_batch", "error_by_batch",
    "throughput_curves", "per_user_by_workload", "latency_percentiles",
    "sweep_throughput", "trim_gap_frame", "trim_gap_by_batch", "compare_deltas",
    "request_timeline", "confidence_heatmap", "token_logprobs",
]
