"""The Streamlit dashboard under Streamlit's AppTest: every page on a filled store and on an empty one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import dspark_obs.ui
from legend_checks import figure_from_spec, legend_problems
from sample_store import build_sample_store

APP = str(Path(dspark_obs.ui.__file__).with_name("app.py"))
TIMEOUT_S = 600  # a hang guard: a loaded machine may take minutes for one page script

# page file -> chart titles (substrings) the page must draw on the sample store, and the minimum number of tables
PAGES = {
    "overview": (["Accepted vs full-block ceiling per workload", "ECE of survival S_k by draft position"], 2),
    "ceiling": (["Accepted vs full-block ceiling per workload", "Acceptance by draft position",
                 "Estimate categories per workload", "Estimated vs true full-block acceptance"], 2),
    "windows": (["Mean verify window per workload", "Per-step verify-window distribution per workload"], 1),
    "calibration": (["Reliability of survival S_k per draft position", "Recalibration, held out: ECE",
                     "STS: ECE per position"], 1),
    "costmodel": (["Step time: measured cells vs the fitted additive model", "Predicted vs measured step time",
                   "Residuals by batch size", "Step-time error by batch size"], 1),
    "throughput": (["Total throughput vs per-user speed", "Per-user speed by workload and concurrency",
                    "Latency percentiles per run"], 2),
    "compare": (["against"], 1),
    "requests": (["window, accepted drafts and full-block ceiling"], 0),
    "sql_console": ([], 0),
}


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    return build_sample_store(tmp_path_factory.getbasetemp() / "ui-sample")


def _app(root: Path | str, monkeypatch) -> AppTest:
    monkeypatch.setenv("DSPARK_OBS_DATA", str(root))
    return AppTest.from_file(APP, default_timeout=TIMEOUT_S)


def _chart_titles(at: AppTest) -> list[str]:
    return [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "") for c in at.get("plotly_chart")]


def _assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _open(at: AppTest, page: str) -> AppTest:
    return at.switch_page(f"app_pages/{page}.py").run()


def test_every_page_draws_its_charts_and_tables_on_the_sample_store(sample_root, monkeypatch):
    at = _app(sample_root, monkeypatch).run()  # the default page is the overview
    _assert_clean(at)
    assert at.title[0].value == "Overview"
    for page, (titles, tables) in PAGES.items():
        _open(at, page)
        _assert_clean(at)
        got = _chart_titles(at)
        for expected in titles:
            assert any(expected in t for t in got), (page, expected, got)
        assert len(at.dataframe) >= tables, (page, len(at.dataframe))
        assert at.title and at.title[0].value, page
        for chart in at.get("plotly_chart"):  # every legend entry names something drawn, and looks unlike the others
            fig = figure_from_spec(chart.proto.spec)
            assert not legend_problems(fig), (page, fig.layout.title.text, legend_problems(fig))
        if titles:  # every chart comes with its caption and a PNG export button
            assert len(at.get("download_button")) >= len(titles), page


def test_every_page_explains_how_to_collect_on_an_empty_store(tmp_path, monkeypatch):
    at = _app(tmp_path, monkeypatch).run()
    for page in PAGES:
        _open(at, page)
        _assert_clean(at)
        assert not at.get("plotly_chart"), page
        notices = " ".join(i.value for i in at.info)
        assert "dspark-obs demo" in notices and "dspark-obs collect" in notices, (page, notices)


def test_a_missing_data_root_is_a_message_with_the_fix(tmp_path, monkeypatch):
    at = _app(tmp_path / "not-yet", monkeypatch).run()
    _assert_clean(at)
    assert "does not exist yet" in at.info[0].value
    monkeypatch.delenv("DSPARK_OBS_DATA")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert "dspark-obs dashboard --data" in at.error[0].value


def test_estimator_pages_name_the_command_that_fills_their_tables(tmp_path, sample_root, monkeypatch):
    from dspark_obs.store import Store

    bare = Store(tmp_path)
    for table in ("runs", "steps", "step_reqs", "requests", "tokens"):
        bare.write(table, "sample-compact", Store(sample_root).read(table, "sample-compact").drop_columns(["run_id"]))
    at = _app(tmp_path, monkeypatch).run()
    expected = {"ceiling": "dspark-obs estimate", "calibration": "dspark-obs calibrate",
                "costmodel": "dspark-obs costmodel", "overview": "dspark-obs estimate"}
    for page, command in expected.items():
        _open(at, page)
        _assert_clean(at)
        assert command in " ".join(i.value for i in at.info), page


def test_filters_narrow_every_page_without_errors(sample_root, monkeypatch):
    at = _app(sample_root, monkeypatch).run()
    at.multiselect(key="url-workloads").set_value(["poetry"]).run()
    at.multiselect(key="url-runs").set_value(["sample-compact"]).run()
    _assert_clean(at)
    for page in PAGES:
        _open(at, page)
        _assert_clean(at)
    _open(at, "overview")
    table = next(d.value for d in at.dataframe if "mean_acc_len" in d.value.columns)  # the per-workload table
    assert set(table["workload"]) == {"*", "poetry"} and set(table["run_id"]) == {"sample-compact"}


def test_an_empty_selection_warns_instead_of_failing(sample_root, monkeypatch):
    at = _app(sample_root, monkeypatch).run()
    at.multiselect(key="url-workloads").set_value([]).run()
    _assert_clean(at)
    assert any("empty selection" in w.value for w in at.sidebar.warning)
    for page in ("ceiling", "windows", "requests"):
        _open(at, page)
        _assert_clean(at)


def test_calibration_page_shows_stored_sts_fits_one_and_offers_the_json(sample_root, monkeypatch):
    at = _open(_app(sample_root, monkeypatch), "calibration")
    sts_charts = lambda: [t for t in _chart_titles(at) if t.startswith("STS: ECE per position")]  # noqa: E731
    assert len(sts_charts()) == 1  # the stored file's before/after
    assert at.get_by_key("sts_stored_download") is not None
    at.toggle(key="sts_fit").set_value(True).run()
    _assert_clean(at)
    assert len(sts_charts()) == 2  # and the fit made here
    assert at.get_by_key("sts_download") is not None
    at.segmented_control(key="cal_compare").set_value("workloads").run()
    _assert_clean(at)
    assert any(t.startswith("Reliability of survival") for t in _chart_titles(at))


def test_request_explorer_draws_one_view_at_a_time(sample_root, monkeypatch):
    at = _open(_app(sample_root, monkeypatch), "requests")
    assert len(at.get("plotly_chart")) == 1 and "window, accepted drafts" in _chart_titles(at)[0]
    for view, title in (("confidences and survival", "Confidence and survival per step and draft position"),
                        ("committed tokens", "Committed tokens and their target logprobs")):
        at.segmented_control(key="url-rq_view").set_value(view).run()
        _assert_clean(at)
        assert _chart_titles(at) == [title]
        assert at.query_params["rq_view"] in (view, [view])  # the view is in the URL, to be shared
    at.segmented_control(key="url-rq_view").set_value("step timeline").run()
    assert "rq_view" not in at.query_params  # the default view leaves the URL plain


def test_ceiling_page_draws_one_estimate_vs_truth_view_at_a_time(sample_root, monkeypatch):
    at = _open(_app(sample_root, monkeypatch), "ceiling")
    validation = ("Estimated vs true full-block acceptance", "Interval coverage by bin of the estimate",
                  "Estimate bias by category and workload")
    shown = lambda: [v for v in validation if any(t.startswith(v) for t in _chart_titles(at))]  # noqa: E731
    assert shown() == [validation[0]] and len(at.get("plotly_chart")) == 4
    for view, title in (("interval coverage", validation[1]), ("bias by category", validation[2])):
        at.segmented_control(key="url-ceil_val").set_value(view).run()
        _assert_clean(at)
        assert shown() == [title] and len(at.get("plotly_chart")) == 4
        assert at.query_params["ceil_val"] in (view, [view])  # the view is in the URL, to be shared
    at.segmented_control(key="url-ceil_val").set_value("estimate vs truth").run()
    assert shown() == [validation[0]] and "ceil_val" not in at.query_params


# page -> (the view's URL key, {view: the charts it draws}); the first view is the default
VIEWS = {
    "windows": ("win_view", {
        "windows": ["Mean verify window per workload", "Per-step verify-window distribution per workload"],
        "utilisation": ["Utilisation against the ceiling per workload", "Utilisation against the ceiling by window"],
        "budget over time": ["Verify budget and batch size over the run"]}),
    "calibration": ("cal_view", {
        "reliability diagram": ["Reliability of survival S_k per draft position", "Recalibration, held out: ECE",
                                "STS: ECE per position"],
        "metrics by position": ["Calibration by draft position", "Recalibration, held out: ECE",
                                "STS: ECE per position"]}),
}


@pytest.mark.parametrize("page", sorted(VIEWS))
def test_pages_with_views_draw_one_view_at_a_time(sample_root, page, monkeypatch):
    key, views = VIEWS[page]
    at = _open(_app(sample_root, monkeypatch), page)
    known = {w for titles in views.values() for w in titles}
    drawn = lambda: [w for t in _chart_titles(at) for w in sorted(known) if t.startswith(w)]  # noqa: E731
    default = next(iter(views))
    assert drawn() == views[default] and len(at.get("plotly_chart")) == len(views[default])
    for view, titles in list(views.items())[1:]:
        at.segmented_control(key=f"url-{key}").set_value(view).run()
        _assert_clean(at)
        assert drawn() == titles and len(at.get("plotly_chart")) == len(titles), (view, _chart_titles(at))
        assert at.query_params[key] in (view, [view])  # the view is in the URL, to be shared
    at.segmented_control(key=f"url-{key}").set_value(default).run()
    assert drawn() == views[default] and key not in at.query_params  # the default leaves the URL plain


def test_held_out_recalibration_draws_one_metric_at_a_time(sample_root, monkeypatch):
    at = _open(_app(sample_root, monkeypatch), "calibration")
    recal = lambda: [t for t in _chart_titles(at) if t.startswith("Recalibration, held out")]  # noqa: E731
    assert [t.split(":")[1].split()[0] for t in recal()] == ["ECE"]
    at.segmented_control(key="url-recal_metric").set_value("brier").run()
    _assert_clean(at)
    assert [t.split(":")[1].split()[0] for t in recal()] == ["Brier"]
    assert at.query_params["recal_metric"] in ("brier", ["brier"])


def test_calibration_page_draws_the_bin_counts_row_on_request(sample_root, monkeypatch):
    at = _open(_app(sample_root, monkeypatch), "calibration")
    reliability = lambda: next(json.loads(c.proto.spec) for c in at.get("plotly_chart")  # noqa: E731
                               if json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("Reliability"))
    log_axes = lambda: [k for k, v in reliability()["layout"].items()  # noqa: E731
                        if k.startswith("yaxis") and v.get("type") == "log"]
    assert not log_axes()
    at.toggle(key="url-cal_counts").set_value(True).run()
    _assert_clean(at)
    assert log_axes() and at.query_params["cal_counts"] in ("1", ["1"])


def test_request_explorer_switches_requests(sample_root, monkeypatch):
    at = _open(_app(sample_root, monkeypatch), "requests")
    options = at.selectbox(key="rq_rid").options
    at.selectbox(key="rq_rid").set_value(options[-1]).run()
    _assert_clean(at)
    assert any(t.startswith(f"{options[-1]}:") for t in _chart_titles(at))
    at.text_input(key="rq_search").set_value("no-such-request").run()
    _assert_clean(at)
    assert at.info


def test_sql_console_runs_queries_and_reports_mistakes_as_messages(sample_root, monkeypatch):
    at = _open(_app(sample_root, monkeypatch), "sql_console")
    at.text_area(key="sql_text").set_value("SELECT run_id, count(*) AS n FROM steps GROUP BY 1 ORDER BY 1")
    at.button[0].click().run()  # the form's Run button
    _assert_clean(at)
    assert list(at.dataframe[0].value["run_id"]) == ["sample-cap-accept", "sample-compact"]
    at.text_area(key="sql_text").set_value("DELETE FROM steps")  # form widgets: the value goes in on submit
    at.button[0].click().run()
    assert not at.exception
    assert "read-only" in at.error[0].value and "SELECT" in at.error[0].value
    at.text_area(key="sql_text").set_value("SELECT nope FROM steps")
    at.button[0].click().run()
    assert not at.exception and "Query failed" in at.error[0].value
    at.selectbox(key="sql_canned").set_value("ui_window_dist").run()
    at.button[0].click().run()
    _assert_clean(at)
    assert "utilisation" in at.dataframe[0].value.columns
