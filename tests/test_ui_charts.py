"""Chart builders: a small hand-made frame in, a titled, captioned figure with the expected traces out."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dspark_obs import costtable
from dspark_obs.ui import charts
from dspark_obs.ui.charts.base import axis_titles
from dspark_obs.ui.palette import label_color, mode_color, model_color, workload_color


def _check(fig, title: str, x: str, y: str) -> None:
    """Title, an x and a y axis title containing ``x`` / ``y`` (units), and a one-line caption."""
    assert fig.layout.title.text.startswith(title), fig.layout.title.text
    titles = axis_titles(fig)
    assert any(k.startswith("xaxis") and x in v for k, v in titles.items()), titles
    assert any(k.startswith("yaxis") and y in v for k, v in titles.items()), titles
    caption = charts.caption_of(fig)
    assert caption and "\n" not in caption and caption.endswith(".")


def _data_traces(fig) -> list:
    """Traces that draw data (legend keys carry x = [None])."""
    return [t for t in fig.data if t.x is None or any(v is not None for v in np.ravel(np.asarray(t.x, dtype=object)))]


def _is_empty_notice(fig) -> bool:
    return any("No " in (a.text or "") for a in fig.layout.annotations)


# -- ceiling --------------------------------------------------------------------

WORKLOADS = pd.DataFrame({
    "run_id": ["c", "c", "c", "k", "k"], "mode": ["compact"] * 3 + ["cap-accept"] * 2,
    "workload": ["*", "gsm8k", "poetry", "gsm8k", "poetry"],
    "mean_acc_len": [4.0, 5.0, 3.0, 5.1, 3.1], "ceiling_len": [4.2, 5.2, None, 5.3, 3.3],
    "ceiling_len_lo": [4.1, 5.1, None, 5.3, 3.3], "ceiling_len_hi": [4.9, 5.6, None, 5.3, 3.3],
    "ceiling_source": ["estimate", "estimate", None, "exact", "exact"],
    "utilisation": [0.95, 0.96, None, 0.96, 0.94],
})


def test_accept_vs_ceiling_bars_per_run_and_ceiling_markers_with_interval():
    fig = charts.accept_vs_ceiling(WORKLOADS)
    _check(fig, "Accepted vs full-block ceiling per workload", "workload", "tokens")
    bars = [t for t in _data_traces(fig) if t.type == "bar"]
    assert [list(b.x) for b in bars] == [["gsm8k", "poetry"], ["gsm8k", "poetry"]]  # '*' dropped
    assert list(bars[0].marker.color) == [workload_color("gsm8k"), workload_color("poetry")]
    assert bars[0].marker.pattern.shape == "" and bars[1].marker.pattern.shape == "/"  # compact vs cap-accept
    ceiling = [t for t in _data_traces(fig) if t.type == "scatter"]
    assert list(ceiling[0].x) == ["gsm8k"]  # poetry has no estimate
    assert list(ceiling[0].error_y.array) == pytest.approx([0.4])
    assert list(ceiling[0].error_y.arrayminus) == pytest.approx([0.1])
    assert [t.name for t in fig.data if t.showlegend is not False][-1] == "full-block ceiling (exact)"
    assert "*" in list(_data_traces(charts.accept_vs_ceiling(WORKLOADS, include_all=True))[0].x)


def test_acceptance_by_position_draws_band_full_block_and_committed():
    df = pd.DataFrame({
        "run_id": "c", "mode": "compact", "workload": "gsm8k", "position": [1, 2], "committed_share": [0.8, 0.6],
        "full_block_share": [0.85, 0.7], "full_block_lo": [0.84, 0.65], "full_block_hi": [0.9, 0.8],
        "source": "estimate"})
    fig = charts.acceptance_by_position(df)
    _check(fig, "Acceptance by draft position", "draft position k", "(%)")
    data = _data_traces(fig)
    assert len(data) == 4  # band upper, band lower (filled), full block, committed
    assert data[1].fill == "tonexty" and list(data[2].y) == [0.85, 0.7] and list(data[3].y) == [0.8, 0.6]
    assert data[2].line.color == workload_color("gsm8k") and data[3].line.dash == "dot"
    assert fig.layout.legend.orientation == "v"


def test_estimate_categories_stack_shares_per_workload_in_a_fixed_order():
    df = pd.DataFrame({"run_id": "c", "workload": ["gsm8k", "gsm8k", "poetry"],
                       "category": ["censored_diverged", "exact_in_window", "exact_in_window"],
                       "request_steps": [1, 3, 2], "share": [0.25, 0.75, 1.0]})
    fig = charts.estimate_categories(df)
    _check(fig, "Estimate categories per workload", "workload", "share of request-steps")
    assert [t.name for t in fig.data] == ["exact_in_window", "censored_diverged"]
    assert list(fig.data[1].y) == [0.25, 0.0] and fig.layout.barmode == "stack"


VALIDATION = pd.DataFrame({
    "run_id": "c", "group_kind": ["overall", "bin", "bin", "category", "workload"],
    "group": ["*", "0", "1", "censored_eos", "gsm8k"], "bin": [None, 0, 1, None, None], "n": [10, 5, 5, 2, 8],
    "mean_lo": [1.0, 0.0, 2.0, 1.0, 1.0], "mean_mid": [1.5, 0.5, 2.5, 1.2, 1.5], "mean_hi": [3, 1.0, 6.0, 1.2, 3],
    "mean_truth": [1.5, 0.4, 2.6, 1.2, 1.4], "bias": [0.0, 0.1, -0.1, 0.0, 0.1], "mae": [0.1, 0.1, 0.1, 0.0, 0.1],
    "coverage": [1.0, 1.0, 0.8, 1.0, 1.0], "mean_emu_expected": [1.5, 0.5, 2.5, 1.2, 1.5],
    "emu_coverage": [1.0, 1.0, 1.0, 1.0, 1.0],
})


def test_validation_scatter_uses_bins_with_interval_bars_and_a_diagonal():
    fig = charts.validation_scatter(VALIDATION)
    _check(fig, "Estimated vs true full-block acceptance", "truth", "estimate")
    assert fig.data[0].name == "perfect estimate"
    assert list(fig.data[1].x) == [0.4, 2.6] and list(fig.data[1].y) == [0.5, 2.5]
    assert list(fig.data[1].error_y.array) == pytest.approx([0.5, 3.5])
    assert fig.data[2].name.endswith("emulator expectation")


def test_validation_coverage_and_bias():
    cov = charts.validation_coverage(VALIDATION)
    _check(cov, "Interval coverage by bin", "bin of the estimate", "truth inside")
    assert list(cov.data[0].y) == [1.0, 0.8] and list(cov.data[0].x) == ["0: 0.50", "1: 2.50"]
    bias = charts.validation_bias(VALIDATION)
    _check(bias, "Estimate bias by category and workload", "group", "drafts")
    assert list(bias.data[0].x[1]) == ["censored_eos", "gsm8k"] and list(bias.data[0].text) == ["n=2", "n=8"]
    assert list(bias.data[0].marker.color) == ["#FDAE6B", workload_color("gsm8k")]


# -- windows --------------------------------------------------------------------

DIST = pd.DataFrame({
    "run_id": "k", "mode": "cap-accept", "workload": ["gsm8k", "gsm8k", "poetry"], "gamma": 6,
    "window": [2, 6, 1], "request_steps": [1, 3, 2], "share": [0.25, 0.75, 1.0],
    "accepted_tokens": [2, 21, 2], "ceiling_tokens": [4.0, 21.0, 4.0], "ceiling_steps": [1, 3, 2],
    "utilisation": [0.5, 1.0, 0.5], "ceiling_source": "exact",
})


def test_window_summary_folds_the_distribution():
    s = charts.window_summary(DIST).set_index("workload")
    assert s.loc["gsm8k", "mean_window"] == pytest.approx((2 + 18) / 4)
    assert s.loc["gsm8k", "full_window_share"] == pytest.approx(0.75)
    assert s.loc["gsm8k", "share_le3"] == pytest.approx(0.25)
    assert s.loc["gsm8k", "utilisation"] == pytest.approx(23 / 25)
    assert s.loc["poetry", "mean_window"] == 1 and s.loc["poetry", "full_window_share"] == 0
    assert charts.window_summary(DIST.iloc[0:0]).empty


def test_window_charts():
    s = charts.window_summary(DIST)
    fig = charts.window_by_workload(s)
    _check(fig, "Mean verify window per workload", "workload", "drafts")
    assert list(fig.data[0].y) == pytest.approx([5.0, 1.0]) and list(fig.data[0].text) == ["full 75%", "full 0%"]
    assert any(t.name == "SGLang write-up" and list(t.y) == [5.24, 2.91] for t in fig.data)
    dist = charts.verify_len_distribution(DIST)
    _check(dist, "Per-step verify-window distribution", "window", "share of request-steps")
    assert [t.name for t in dist.data] == ["gsm8k", "poetry"] and list(dist.data[0].x) == [2, 6]
    util = charts.utilisation_by_workload(s)
    _check(util, "Utilisation against the ceiling per workload", "workload", "utilisation")
    assert list(util.data[0].y) == pytest.approx([0.92, 0.5])
    assert util.layout.shapes[0].y0 == 0.88 and util.layout.shapes[0].y1 == 0.97
    byw = charts.utilisation_by_window(DIST)
    _check(byw, "Utilisation against the ceiling by window", "window", "utilisation")
    assert list(byw.data[0].x) == [2, 6] and byw.data[0].line.dash == "dash"  # cap-accept


def test_budget_timeline_has_a_budget_and_a_batch_panel_per_run():
    df = pd.DataFrame({"run_id": ["a", "a", "b"], "mode": ["compact", "compact", "static"],
                       "forward_ct": [0, 10, 0], "mean_budget": [20.0, 30.0, 10.0], "mean_bs": [4.0, 6.0, 2.0]})
    fig = charts.budget_timeline(df)
    _check(fig, "Verify budget and batch size", "forward_ct", "budget")
    assert "batch size (requests)" in axis_titles(fig).values()
    assert [t.yaxis for t in fig.data] == ["y", "y2", "y", "y2"]
    assert fig.data[0].line.color == mode_color("compact") and fig.data[2].line.dash == "dot"


# -- calibration ----------------------------------------------------------------

BINS = pd.DataFrame({
    "position": [1, 1, 2, 1], "labels": ["observed", "observed", "observed", "companion"], "workload": "*",
    "bin": [0, 1, 0, 0], "bin_lo": [0.0, 0.5, 0.0, 0.0], "bin_hi": [0.5, 1.0, 0.5, 0.5],
    "mean_predicted": [0.3, 0.8, 0.2, 0.3], "observed_rate": [0.25, 0.7, 0.1, 0.3], "count": [10, 30, 5, 9],
})
METRICS = pd.DataFrame({
    "position": [1, 2, 1, 2], "labels": ["observed", "observed", "companion", "companion"], "workload": "*",
    "ece": [0.02, 0.05, 0.01, 0.02], "ece_ci_lo": [0.01, 0.04, 0.005, 0.01], "ece_ci_hi": [0.03, 0.07, 0.02, 0.03],
    "brier": [0.1, 0.12, 0.09, 0.1], "auroc": [0.9, 0.91, 0.92, 0.93],
})


def test_reliability_diagram_one_panel_per_position_with_counts():
    fig = charts.reliability_diagram(BINS)
    _check(fig, "Reliability of survival S_k", "predicted survival", "observed rate")
    names = [a.text for a in fig.layout.annotations]
    assert "k = 1" in names and "k = 2" in names
    obs = [t for t in fig.data if t.name == "observed" and t.yaxis == "y"]
    assert list(obs[0].x) == [0.3, 0.8] and obs[0].line.color == label_color("observed")
    counts = [t for t in fig.data if t.name == "observed" and t.yaxis == "y3"]
    assert list(counts[0].y) == [10, 30] and fig.layout.yaxis3.type == "log"
    by_workload = charts.reliability_diagram(BINS.assign(labels="companion", workload=["a", "a", "a", "b"]),
                                             color_by="workload")
    assert {t.name for t in by_workload.data if t.name in ("a", "b")} == {"a", "b"}
    with pytest.raises(ValueError, match="color_by must be 'labels' or 'workload'"):
        charts.reliability_diagram(BINS, color_by="mode")


def test_reliability_diagram_without_the_count_row_keeps_the_counts_in_its_markers():
    full, lean = charts.reliability_diagram(BINS), charts.reliability_diagram(BINS, count_row=False)
    axes = lambda fig: [n for n in fig.layout.to_plotly_json() if n.startswith(("xaxis", "yaxis"))]  # noqa: E731
    assert len(axes(lean)) == len(axes(full)) // 2  # one row of panels, not two
    assert {t.yaxis for t in lean.data} == {"y", "y2"} and "log" not in {lean.layout.yaxis.type}
    _check(lean, "Reliability of survival S_k", "predicted survival", "observed rate")
    obs = [t for t in lean.data if t.name == "observed" and t.yaxis == "y"]
    assert list(obs[0].customdata) == [10, 30]  # the hover still gives the steps per bin
    assert obs[0].marker.size[1] > obs[0].marker.size[0]  # and the marker grows with them
    assert "Marker area" in charts.caption_of(lean) and "Bottom row" in charts.caption_of(full)


def test_calibration_metrics_panels_with_ece_ci():
    fig = charts.calibration_metrics(METRICS)
    _check(fig, "Calibration by draft position", "draft position k", "ECE")
    ece_obs = [t for t in fig.data if t.name == "observed" and t.xaxis == "x"][0]
    assert list(ece_obs.error_y.array) == pytest.approx([0.01, 0.02])
    assert [a.text for a in fig.layout.annotations][:3] == ["ECE (lower is better)", "Brier (lower is better)",
                                                           "AUROC (higher is better)"]
    single = charts.calibration_metrics(METRICS, metrics=("ece",))
    assert single.layout.title.text.startswith("ECE of survival") and len(single.data) == 2
    with pytest.raises(ValueError, match="unknown metrics"):
        charts.calibration_metrics(METRICS, metrics=("accuracy",))


def test_sts_before_after_groups_bars_per_position():
    df = pd.DataFrame({"position": [1, 2], "ece_raw": [0.05, 0.08], "ece_served": [None, None],
                       "ece_after": [0.01, 0.012], "temperature": [1.2, 1.5]})
    fig = charts.sts_before_after(df)
    _check(fig, "STS: ECE per position", "draft position k", "ECE")
    assert [t.name for t in fig.data] == ["raw head (T = 1)", "after STS"]  # no served ECE: no bars
    assert list(fig.data[1].text) == ["T=1.20", "T=1.50"]


RECAL = pd.DataFrame({"position": [1, 2] * 3, "method": ["none"] * 2 + ["sts"] * 2 + ["beta"] * 2,
                      "ece": [0.15, 0.14, 0.11, 0.10, 0.02, 0.025], "ece_ci_lo": [0.13, 0.12, 0.09, 0.08, 0.01, 0.02],
                      "ece_ci_hi": [0.17, 0.16, 0.13, 0.12, 0.03, 0.03], "brier": [0.2, 0.21, 0.19, 0.2, 0.17, 0.18]})


def test_recalibration_held_out_groups_one_bar_series_per_method_in_order():
    fig = charts.recalibration_held_out(RECAL.iloc[::-1])
    _check(fig, "Recalibration, held out: ECE", "draft position k", "ECE")
    assert [t.name for t in fig.data] == ["none", "sts", "beta"]
    assert list(fig.data[2].y) == [0.02, 0.025] and fig.data[2].error_y.array is not None
    brier = charts.recalibration_held_out(RECAL, metric="brier")
    assert list(brier.data[0].y) == [0.2, 0.21]
    with pytest.raises(ValueError, match="metric must be"):
        charts.recalibration_held_out(RECAL, metric="auroc")


# -- cost model -----------------------------------------------------------------

FIT = pd.DataFrame({"model": "fitted", "term": ["bias", "alpha", "alpha", "theta", "theta"],
                    "probe": [None, 1, 8, 1, 64], "value_ms": [8.0, 0.0, 0.7, 0.0, 2.0]})
CELLS = pd.DataFrame({"bs": [1, 8], "m": [7, 64], "steps": [4, 10], "measured_ms": [8.1, 10.9],
                      "server_ms": [8.0, 10.0]})


def test_table_from_fit_and_predicted_cells_are_sglangs_interpolation():
    table = charts.table_from_fit(FIT)
    assert isinstance(table, costtable.SpsAdditiveCostTable) and table.bs_probes == [1, 8]
    cells = charts.predict_cells(CELLS, table)
    # T(8, 64) = 8 + alpha(8) + theta(64) = 8 + 0.7 + 2.0 ms; T(1, 7) = 8 + 0 + 2.0 * 6 / 63
    assert cells["fitted_ms"].tolist() == pytest.approx([8 + 2.0 * 6 / 63, 10.7])
    assert charts.table_from_fit(FIT[FIT["term"] != "theta"]) is None
    assert charts.predict_cells(CELLS, None)["fitted_ms"].isna().all()
    curves = charts.curve_frame(table, [1, 8], gamma=6, points=3)
    assert curves["bs"].tolist() == [1] * 3 + [8] * 3 and curves["m"].tolist()[-1] == 56


def test_costmodel_charts():
    table = charts.table_from_fit(FIT)
    cells = charts.predict_cells(CELLS, table)
    raw = charts.costmodel_raw_vs_fitted(cells, charts.curve_frame(table, [1, 8]))
    _check(raw, "Step time: measured cells vs the fitted additive model", "target tokens M", "step time (ms)")
    assert list(raw.data[0].y) == [8.1, 10.9] and [t.name for t in raw.data[1:]] == ["fitted, bs=1", "fitted, bs=8"]
    pvm = charts.predicted_vs_measured(cells)
    _check(pvm, "Predicted vs measured step time", "measured step time (ms", "predicted step time (ms)")
    assert [t.name for t in pvm.data] == ["exact", "fitted", "server"]
    assert pvm.data[2].marker.color == model_color("server")
    res = charts.residuals_by_batch(cells)
    _check(res, "Residuals by batch size", "batch size (requests)", "(ms)")
    assert list(res.data[1].y) == pytest.approx([-0.1, -0.9])  # server - measured
    err = charts.error_by_batch(pd.DataFrame({"run_id": "r", "model": ["fitted", "fitted", "server"],
                                              "bs_bucket": ["*", "1-7", "*"], "bs_lo": [None, 1, None],
                                              "n": [10, 4, 10], "mape": [0.02, 0.03, 0.1], "bias_ms": [0, 0.1, -1]}))
    _check(err, "Step-time error by batch size", "batch-size bucket", "MAPE")
    assert list(err.data[0].x) == ["all", "1-7"] and list(err.data[0].y) == [0.02, 0.03]


# -- throughput and requests ------------------------------------------------------

THROUGHPUT = pd.DataFrame({
    "run_id": ["a", "a", "a", "b"], "mode": ["compact", "compact", "compact", "static"],
    "method": ["compact", "compact", "compact", "static"], "workload": ["*", "*", "gsm8k", "*"],
    "concurrency": [8, 1, 8, 8], "requests": [10, 10, 5, 10], "per_user_tok_s": [100.0, 200.0, 120.0, 80.0],
    "throughput_tok_s": [800.0, 200.0, None, 640.0], "mean_accept_length": [4.0, 4.2, 5.0, 1.0],
})


def test_throughput_curves_one_line_per_run_sorted_by_concurrency():
    fig = charts.throughput_curves(THROUGHPUT)
    _check(fig, "Total throughput vs per-user speed", "per-user speed", "total throughput (tokens/s, wall clock)")
    assert [t.name for t in fig.data] == ["a (compact)", "b (static)"]
    assert list(fig.data[0].x) == [200.0, 100.0] and list(fig.data[0].text) == ["4.20", "4.00"]
    assert fig.data[1].line.color == mode_color("static") and fig.data[1].marker.symbol == "square"
    wl = charts.per_user_by_workload(THROUGHPUT)
    _check(wl, "Per-user speed by workload and concurrency", "concurrency", "per-user tok/s (wall clock)")
    assert [t.name for t in wl.data] == ["a (compact)"] and list(wl.data[0].y) == [120.0]
    assert list(wl.layout.xaxis.tickvals) == [8] and wl.layout.xaxis.type == "log"  # integer ticks only
    virtual = charts.throughput_curves(THROUGHPUT.assign(clock="virtual"))
    assert "virtual clock" in virtual.layout.xaxis.title.text and "virtual clock" in charts.caption_of(virtual)
    with pytest.raises(ValueError, match="mixes clocks"):
        charts.throughput_curves(THROUGHPUT.assign(clock=["virtual", "wall", "wall", "wall"]))


STEPS = pd.DataFrame({
    "step": [1, 2], "window": [6, 3], "correct_drafts": [2, 3], "ceiling_lo": [2.0, 3.0], "ceiling_mid": [2.0, 4.5],
    "ceiling_hi": [2.0, 6.0], "category": ["exact_in_window", "censored_diverged"], "truth_block": [None, 4.0],
    "confidence": [[0.9, 0.8, 0.1], [0.95, 0.9, 0.8]], "survival": [[0.9, 0.72, 0.072], [0.95, 0.855, 0.684]],
})


def test_request_timeline_and_confidence_heatmap():
    fig = charts.request_timeline(STEPS, workload="poetry")
    _check(fig, "Request timeline", "decode step", "drafts")
    assert [t.name for t in fig.data] == ["window (verified)", "accepted", "ceiling estimate", "full-block truth"]
    assert fig.data[1].marker.color == workload_color("poetry")
    assert list(fig.data[2].error_y.array) == pytest.approx([0.0, 1.5]) and list(fig.data[3].x) == [2]
    heat = charts.confidence_heatmap(STEPS)
    _check(heat, "Confidence and survival", "decode step", "draft position k")
    z = np.asarray(heat.data[0].z)
    assert z.shape == (3, 2) and z[2, 0] == pytest.approx(0.1)  # positions x steps
    assert list(heat.data[1].y) == [6.5, 3.5]  # the window line sits above the last verified position


def test_token_logprobs_colour_by_how_the_token_was_committed():
    df = pd.DataFrame({"pos": [0, 1, 2, 3], "logprob": [-0.5, -0.1, -2.0, -0.3], "step": [None, 1, 1, None],
                       "source": ["prefill", "draft", "bonus", None]})
    fig = charts.token_logprobs(df)
    _check(fig, "Committed tokens", "output position (tokens)", "logprob (nats)")
    assert [t.name for t in fig.data] == ["draft", "bonus", "prefill", "unmatched"]


# -- shared behaviour --------------------------------------------------------------

EMPTY_CASES = [
    (charts.accept_vs_ceiling, WORKLOADS), (charts.acceptance_by_position, None),
    (charts.estimate_categories, None), (charts.validation_scatter, VALIDATION),
    (charts.validation_coverage, VALIDATION), (charts.validation_bias, VALIDATION),
    (charts.window_by_workload, None), (charts.verify_len_distribution, DIST),
    (charts.utilisation_by_window, DIST), (charts.utilisation_by_workload, None), (charts.budget_timeline, None),
    (charts.reliability_diagram, BINS), (charts.calibration_metrics, METRICS), (charts.sts_before_after, None),
    (charts.recalibration_held_out, RECAL),
    (charts.costmodel_raw_vs_fitted, CELLS), (charts.predicted_vs_measured, CELLS),
    (charts.residuals_by_batch, CELLS), (charts.error_by_batch, None), (charts.throughput_curves, THROUGHPUT),
    (charts.per_user_by_workload, THROUGHPUT), (charts.request_timeline, STEPS), (charts.confidence_heatmap, STEPS),
    (charts.token_logprobs, None),
]


@pytest.mark.parametrize("builder, sample", EMPTY_CASES, ids=[b.__name__ for b, _ in EMPTY_CASES])
def test_every_builder_draws_an_empty_but_titled_figure_from_an_empty_frame(builder, sample):
    frames = [pd.DataFrame()] + ([sample.iloc[0:0]] if sample is not None else [])
    for frame in frames:
        fig = builder(frame)
        assert fig.layout.title.text and charts.caption_of(fig)
        assert axis_titles(fig)
        assert _is_empty_notice(fig), builder.__name__


def test_builders_accept_arrow_tables_and_row_lists():
    arrow = pa.Table.from_pandas(THROUGHPUT, preserve_index=False)
    assert len(charts.throughput_curves(arrow).data) == 2
    assert len(charts.throughput_curves(THROUGHPUT.to_dict("records")).data) == 2
    with pytest.raises(TypeError, match="pandas DataFrame, a pyarrow Table or a list of dicts"):
        charts.throughput_curves("runs.csv")


def test_a_frame_without_the_needed_columns_is_an_error_naming_them():
    with pytest.raises(ValueError, match=r"throughput_curves: the frame lacks columns \['throughput_tok_s'\]"):
        charts.throughput_curves(THROUGHPUT.drop(columns=["throughput_tok_s"]))


def test_a_workload_has_one_colour_on_every_chart():
    color = workload_color("poetry")
    assert charts.window_by_workload(charts.window_summary(DIST)).data[0].marker.color[1] == color
    assert [t for t in charts.verify_len_distribution(DIST).data if t.name == "poetry"][0].marker.color == color
    assert charts.request_timeline(STEPS, workload="poetry").data[1].marker.color == color
    assert [t for t in charts.accept_vs_ceiling(WORKLOADS).data if t.type == "bar"][0].marker.color[1] == color


def test_layout_regressions_stay_fixed_bars_from_zero_and_two_ceiling_sources_two_symbols():
    util = charts.utilisation_by_workload(charts.window_summary(DIST))
    assert util.layout.yaxis.range[0] == 0  # a bar's length is its value (it once started at 78%)
    fig = charts.accept_vs_ceiling(WORKLOADS)
    keys = {t.name: t.marker.symbol for t in fig.data if t.name and t.name.startswith("full-block ceiling")}
    assert len(keys) == 2 and len(set(keys.values())) == 2, keys  # exact filled, estimate open: never two alike
