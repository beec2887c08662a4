"""Every dashboard page in Chromium with two runs selected (in the URL): layout, assets and clocks.

On the full sample store (a compact run, its cap-accept companion, a small
sweep of the four methods and a report) every page is opened with
``?runs=sample-compact&runs=sample-cap-accept`` and checked for:

* no overlap between any two of a chart's title, legend, axis titles and
  subplot titles (their bounding boxes in the rendered SVG);
* no request leaving the dashboard's own origin (Playwright's request log);
* the clock (``wall clock`` / ``virtual clock``) named on every throughput and
  latency chart;
* no error or exception.

Screenshots of every page go to ``$DSPARK_OBS_SCREENSHOTS`` (default: a tmp dir).
"""

from __future__ import annotations

import pytest

from sample_store import SAMPLE_RUNS

from .test_dashboard_browser import ERRORS, LOAD_TIMEOUT_MS, _screenshot

TWO_RUNS = "?runs=sample-compact&runs=sample-cap-accept"
# url path -> charts the page draws with the two sample runs selected
PAGES = {
    "": 3, "ceiling": 4, "windows": 2, "calibration": 3, "costmodel": 4, "throughput": 5, "requests": 1,
    "compare": 1, "sql_console": 0,
    # the request explorer draws one view at a time: its other two; so does the ceiling's estimate vs truth
    "requests?rq_view=confidences+and+survival": 1, "requests?rq_view=committed+tokens": 1,
    "ceiling?ceil_val=interval+coverage": 4, "ceiling?ceil_val=bias+by+category": 4,
    "calibration?cal_counts=1": 3,  # the reliability diagram with its bin-count row
    # the windows and calibration pages draw one view at a time too
    "windows?win_view=utilisation": 2, "windows?win_view=budget+over+time": 1,
    "calibration?cal_view=metrics+by+position": 3, "calibration?recal_metric=brier": 3,
}
# Titles of the charts that show a throughput or a latency: each must name its clock.
TIMED = ("throughput", "latency", "per-user", "speed", "step time")

_BOXES_JS = """
() => [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')].map(plot => {
    const box = el => { const r = el.getBoundingClientRect();
                        return {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom, text: el.textContent.trim()}; };
    const svg = plot.querySelector('.main-svg:last-of-type') || plot;
    const parts = [];
    const title = plot.querySelector('.g-gtitle .gtitle');
    if (title) parts.push({kind: 'title', ...box(title)});
    const legend = plot.querySelector('.legend .bg');
    if (legend && legend.getBoundingClientRect().width > 0) parts.push({kind: 'legend', ...box(legend)});
    plot.querySelectorAll('[class^="g-x"][class$="title"] text, [class^="g-y"][class$="title"] text')
        .forEach(t => { if (t.textContent.trim()) parts.push({kind: 'axis title', ...box(t)}); });
    plot.querySelectorAll('.infolayer .annotation').forEach(a => {
        const t = a.textContent.trim();
        if (t && !t.startsWith('limit') && !t.startsWith('No ')) parts.push({kind: 'subplot title', ...box(a)});
    });
    return {title: title ? title.textContent : '', text: plot.textContent, parts};
})
"""


def _overlaps(parts: list[dict], tolerance: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of chart elements whose boxes intersect by more than ``tolerance`` px each way."""
    found = []
    for i, a in enumerate(parts):
        for b in parts[i + 1:]:
            w = min(a["x1"], b["x1"]) - max(a["x0"], b["x0"])
            h = min(a["y1"], b["y1"]) - max(a["y0"], b["y0"])
            if w > tolerance and h > tolerance:
                found.append((f"{a['kind']} '{a['text'][:40]}'", f"{b['kind']} '{b['text'][:40]}'"))
    return found


@pytest.fixture(scope="module")
def sample_root(tmp_path_factory):
    from sample_store import build_sample_store

    return build_sample_store(tmp_path_factory.getbasetemp() / "ui-sample-full", sweep=True, report=True)


@pytest.fixture(scope="module")
def page(dashboard_url, browser):  # the store (built with asyncio) before the Playwright loop
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.external = []
    pg.page_errors = []
    origin = dashboard_url.rstrip("/")
    pg.on("request", lambda req: pg.external.append(req.url)
          if not req.url.startswith((origin, "data:", "blob:", "about:")) else None)
    pg.on("pageerror", lambda exc: pg.page_errors.append(str(exc)))
    yield pg
    context.close()


def _settle(page, charts: int) -> None:
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=LOAD_TIMEOUT_MS)
    page.wait_for_function(
        """n => document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot .main-svg').length >= n
               && !document.querySelector('[data-testid="stSkeleton"]')""", arg=charts, timeout=LOAD_TIMEOUT_MS)
    page.wait_for_timeout(300)  # let Plotly finish laying out legends and titles


def _name(path: str) -> str:
    """A file-name-safe id: ``requests?rq_view=committed+tokens`` -> ``requests-committed-tokens``."""
    page, _, query = path.partition("?")
    return "-".join([page or "overview", *query.partition("=")[2].split("+")]) if query else page or "overview"


@pytest.mark.parametrize("path", list(PAGES), ids=[_name(p) for p in PAGES])
def test_page_with_two_runs_has_no_overlap_no_external_request_and_names_its_clock(page, dashboard_url,
                                                                                  screenshot_dir, path):
    page.external.clear()
    page.goto(f"{dashboard_url}/{path}{TWO_RUNS if '?' not in path else '&' + TWO_RUNS[1:]}")
    _settle(page, PAGES[path])
    errors = [e.inner_text()[:300] for e in page.locator(ERRORS).all()]
    assert not errors, errors
    assert page.locator('[data-testid="stPlotlyChart"]').count() == PAGES[path]
    runs_filter = page.locator('[data-testid="stSidebar"] [data-testid="stMultiSelect"]').first.inner_text()
    assert all(run in runs_filter for run in SAMPLE_RUNS.values()), runs_filter  # the two runs, from the URL
    assert "sample-sweep" not in runs_filter, runs_filter
    for chart in page.evaluate(_BOXES_JS):
        assert not _overlaps(chart["parts"]), (path, chart["title"], _overlaps(chart["parts"]))
        if any(word in chart["title"].lower() for word in TIMED):
            assert "wall clock" in chart["text"] or "virtual clock" in chart["text"], (path, chart["title"])
    _screenshot(page, screenshot_dir / f"{_name(path)}.png")
    assert not page.external, page.external
    assert not page.page_errors, page.page_errors
