"""Tests for dspark_obs.report.charts: the report's own builders follow the chart-builder conventions."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from dspark_obs.report import charts
from dspark_obs.ui.charts import caption_of


def _intervals() -> pd.DataFrame:
    return pd.DataFrame({"run_id": ["n2", "n2", "n1"], "role": ["current", "current", "baseline"],
                         "workload": ["*", "poetry", "poetry"], "value": [0.96, 0.95, 0.97],
                         "ci_low": [0.95, 0.94, 0.96], "ci_high": [0.97, 0.96, 0.98]})


def _forest() -> pd.DataFrame:
    return pd.DataFrame({"label": ["ece · r */k1", "auroc · r */k1"], "delta": [0.04, -0.06],
                         "delta_low": [0.02, -0.09], "delta_high": [0.06, -0.03], "min_delta": [0.02, 0.03],
                         "better": ["lower", "higher"], "verdict": ["fail", "fail"]})


def _history() -> pd.DataFrame:
    t0 = dt.datetime(2026, 11, 28, tzinfo=dt.timezone.utc)
    return pd.DataFrame({"metric": ["ece", "ece", "utilisation"], "run_id": ["a", "b", "a"],
                         "run_started_at": [t0, t0 + dt.timedelta(days=1), t0], "value": [0.03, 0.09, 0.96],
                         "ci_low": [None, None, 0.95], "ci_high": [None, None, 0.97],
                         "verdict": ["pass", "fail", "pass"]})


@pytest.mark.parametrize("build, frame", [
    (lambda d: charts.metric_intervals(d, title="Utilisation", y_title="utilisation (%)", limit=0.85,
                                       limit_kind="min"), _intervals),
    (charts.drift_forest, _forest),
    (charts.report_history, _history),
])
def test_builders_title_caption_and_data(build, frame):
    fig = build(frame())
    assert fig.layout.title.text and caption_of(fig)
    assert any(len([v for v in (t.x if t.x is not None else []) if v is not None]) for t in fig.data)
    empty = build(frame().iloc[0:0])
    assert empty.layout.annotations and caption_of(empty)  # "no data" written across an empty figure


def test_drift_forest_puts_worse_to_the_right_in_units_of_the_material_change():
    fig = charts.drift_forest(_forest())
    points = fig.data[0]
    assert list(points.x) == pytest.approx([2.0, 2.0])  # +0.04/0.02 (lower better), -(-0.06)/0.03 (higher better)
    assert list(fig.layout.yaxis.categoryarray) == ["ece · r */k1", "auroc · r */k1"]


def test_history_has_one_panel_per_metric_and_colours_by_verdict():
    fig = charts.report_history(_history())
    assert [a.text for a in fig.layout.annotations][:2] == ["ece", "utilisation"]
    assert list(fig.data[0].marker.color) == [charts.verdict_color("pass"), charts.verdict_color("fail")]


def test_builders_reject_frames_without_their_columns():
    with pytest.raises(ValueError, match=r"drift_forest: the frame lacks columns \['delta'"):
        charts.drift_forest(pd.DataFrame({"label": ["x"]}))
