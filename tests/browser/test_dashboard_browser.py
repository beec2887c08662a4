"""Every dashboard page in headless Chromium: the charts render and no error shows.

Starts `dspark-obs dashboard` on a sample store (see conftest.py), opens each
page, waits for Streamlit to finish the script run and for Plotly to draw every
chart, fails on any exception or error alert, and saves a full-page screenshot
of each page (set DSPARK_OBS_SCREENSHOTS=DIR to keep them somewhere).
"""

from __future__ import annotations

import pytest

# url path -> Plotly charts the page draws on the sample store
PAGES = {
    "": 3, "ceiling": 4, "windows": 2, "calibration": 3, "costmodel": 4, "throughput": 3, "requests": 1,
    "compare": 1, "sql_console": 0,
}
ERRORS = '[data-testid="stException"], [data-testid="stAlertContentError"]'
LOAD_TIMEOUT_MS = 90_000


def _settle(page, charts: int) -> None:
    """Wait until the script run is over and Plotly has drawn ``charts`` charts."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=LOAD_TIMEOUT_MS)
    page.wait_for_function(
        """n => document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot .main-svg').length >= n
               && !document.querySelector('[data-testid="stSkeleton"]')""",
        arg=charts, timeout=LOAD_TIMEOUT_MS)


def _screenshot(page, path) -> None:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to its height first."""
    height = page.evaluate("() => document.querySelector('[data-testid=stMain]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 40, 12_000)})
    page.wait_for_timeout(400)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 1000})


def _errors(page) -> list[str]:
    return [e.inner_text()[:500] for e in page.locator(ERRORS).all()]


@pytest.fixture(scope="module")
def page(browser, dashboard_url):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    console_errors: list[str] = []
    pg.on("pageerror", lambda exc: console_errors.append(str(exc)))
    pg.console_errors = console_errors
    yield pg
    context.close()


@pytest.mark.parametrize("path", list(PAGES), ids=[p or "overview" for p in PAGES])
def test_page_renders_its_charts_without_errors(page, dashboard_url, screenshot_dir, path):
    page.goto(f"{dashboard_url}/{path}")
    _settle(page, PAGES[path])
    assert page.locator("h1").first.inner_text().strip(), "every page has a title"
    charts = page.locator('[data-testid="stPlotlyChart"]').count()
    assert charts == PAGES[path], f"{path or 'overview'}: {charts} charts"
    assert not _errors(page), _errors(page)
    _screenshot(page, screenshot_dir / f"{path or 'overview'}.png")
    print(f"screenshot: {screenshot_dir / (path or 'overview')}.png")
    assert not page.console_errors, page.console_errors


def test_sql_console_runs_a_query_in_the_browser(page, dashboard_url, screenshot_dir):
    page.goto(f"{dashboard_url}/sql_console")
    _settle(page, 0)
    page.get_by_test_id("stBaseButton-primaryFormSubmit").click()
    page.wait_for_selector('[data-testid="stDataFrame"]', timeout=LOAD_TIMEOUT_MS)
    assert "rows" in page.locator('[data-testid="stCaptionContainer"]').all_inner_texts()[-1]
    assert not _errors(page), _errors(page)
    _screenshot(page, screenshot_dir / "sql_console_result.png")
