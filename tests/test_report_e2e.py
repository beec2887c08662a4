"""`dspark-obs report` end to end on emulator stores: pass, fail, unusable input, the page in Chromium.

One store, collected once for the module from the emulator (greedy traffic, lockstep batching):

* ``night-1``  calibrated head (head_temperature 1 at every position), seed 0 — the baseline;
* ``night-2``  calibrated head, seed 1 (other prompts) — must pass against night-1;
* ``night-bad`` over-confident head (head_temperature 0.5: c = sigmoid(2 logit)), seed 1 — must fail.

Only the collected tables are written: the report runs estimate, calibrate and costmodel itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dspark_obs import sql
from dspark_obs.cli import app
from dspark_obs.report.summary import validate
from dspark_obs.store import Store

runner = CliRunner()
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
RUNS = {"night-1": (1.0, 0), "night-2": (1.0, 1), "night-bad": (0.5, 1)}  # run -> (head temperature, seed)
BOOTSTRAP = "200"


def _collect(root: Path) -> None:
    from collectors.sglang.driver import DriveSpec
    from collectors.sglang.session import CollectOptions, collect
    from dspark_obs.emulator.engine import EngineConfig
    from dspark_obs.emulator.server import BackgroundServer

    store = Store(root)
    for run, (head_t, seed) in RUNS.items():
        spec = DriveSpec(["gsm8k", "arena-hard", "poetry"], 36, concurrency=12, temperature=0.0,
                         max_new_tokens=120, seed=seed)
        cfg = EngineConfig(mode="compact", seed=seed, head_temperature=(head_t,) * 6, lockstep_concurrency=12)
        with BackgroundServer(cfg) as server:
            collect(store, CollectOptions(url=server.url, run_id=run, poll_interval=0.1, flush_interval=1.0,
                                          drive=spec))


@pytest.fixture(scope="module")
def store_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nightly") / "data"
    _collect(root)
    assert "calibration" not in Store(root).tables()  # a bare collected store
    return root


def _report(*args: str):
    result = runner.invoke(app, ["report", *args])
    return result


@pytest.fixture(scope="module")
def good(store_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("report-good")
    result = _report("--data", str(store_root), "--run", "night-2", "--baseline", "night-1", "--out", str(out),
                     "--bootstrap", BOOTSTRAP)
    return result, out


@pytest.fixture(scope="module")
def bad(store_root, tmp_path_factory, good):  # after `good`: the history then holds both
    out = tmp_path_factory.mktemp("report-bad")
    result = _report("--data", str(store_root), "--run", "night-bad", "--baseline", "night-1", "--out", str(out),
                     "--bootstrap", BOOTSTRAP, "--no-png")
    return result, out


def test_a_calibrated_head_passes_against_a_calibrated_baseline(good):
    result, out = good
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().startswith("report PASS") and len(result.stderr.strip().splitlines()) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "pass" and summary["failing"] == [] and summary["exit_code"] == 0
    assert summary["runs"][0]["labels"] == "reconstructed"  # estimate + calibrate ran on the bare store
    figures = {f["id"]: f for f in summary["figures"]}
    assert figures["debiased_ece/night-2/*/k3"]["threshold"]["verdict"] == "pass"
    assert figures["debiased_ece/night-2/*/k3"]["drift"]["verdict"] in ("pass", "improved")
    assert figures["utilisation/night-2/*"]["ci"]["low"] < figures["utilisation/night-2/*"]["value"]
    assert {f["metric"] for f in summary["figures"]} >= {
        "ece", "debiased_ece", "brier", "auroc", "acceptance", "utilisation", "mean_acc_len", "ceiling_len",
        "estimator_coverage", "costmodel_mape", "server_table_mape", "lost_record_share", "dead_letters",
        "sts_predicted_gain"}
    assert any("ran the ceiling estimator" in n for n in summary["notes"])


def test_a_miscalibrated_head_fails_naming_the_metrics(bad):
    result, out = bad
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("report FAIL")
    assert "debiased_ece > 0.05 at night-bad */k" in line
    assert "ece > 0.08" in line and "drifted up vs baseline" in line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "fail" and summary["exit_code"] == 1
    assert {"debiased_ece", "drift:debiased_ece"} <= set(summary["failing"])
    deepest = next(f for f in summary["figures"] if f["id"] == "debiased_ece/night-bad/*/k6")
    assert deepest["verdict"] == "fail" and deepest["drift"]["q_value"] < 0.05 and deepest["drift"]["delta"] > 0.05


def test_summaries_validate_against_the_shipped_schema(good, bad):
    for _, out in (good, bad):
        summary = json.loads((out / "summary.json").read_text())
        validate(summary)
        assert summary["schema_version"].startswith("1.")


def test_markdown_is_plain_readable_text(good, bad):
    for (_, out), status in ((good, "PASS"), (bad, "FAIL")):
        md = (out / "summary.md").read_text()
        assert md.startswith(f"# DSpark nightly report: {status}\n")
        assert not re.search(r"</?[a-zA-Z][^>]*>", md), "no HTML in the Markdown"
        assert not re.search(r"\b(nan|None|inf)\b", md)
        for heading in ("## Calibration of the confidence head", "## Acceptance against the full-block ceiling",
                        "## Block-accept estimator against a truth", "## Step-time cost model",
                        "## Collection: gaps and dead letters", "## STS refit recommendation",
                        "## Drift against the baseline"):
            assert heading in md
    bad_md = (bad[1] / "summary.md").read_text()
    assert "## Failed" in bad_md and "| night-bad | debiased_ece | */k6 |" in bad_md


def test_pngs_are_written_for_every_chart(good):
    _, out = good
    summary = json.loads((out / "summary.json").read_text())
    assert summary["artifacts"]["png_dir"] == "figures"
    names = {c["name"] for c in summary["charts"]}
    assert {"calibration-metrics-night-2", "reliability-night-2", "accept-vs-ceiling", "utilisation-intervals",
            "costmodel-error", "drift"} <= names
    for chart in summary["charts"]:
        png = out / chart["png"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart["name"]


def test_each_report_appends_its_figures_to_the_reports_history(store_root, good, bad):
    con = sql.connect(store_root)
    rows = sql.query(con, "report_history", {"metric": "debiased_ece", "position": 6}).to_pylist()
    by_run = {r["run_id"]: r for r in rows}
    assert set(by_run) == {"night-2", "night-bad"}
    assert by_run["night-bad"]["verdict"] == "fail" and by_run["night-2"]["verdict"] == "pass"
    assert by_run["night-bad"]["value"] > by_run["night-2"]["value"]
    assert sql.query(con, "report_history", {"metric": "utilisation"}).num_rows == 2


def test_unusable_input_exits_2_with_one_line(store_root, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    bad_toml = tmp_path / "thresholds.toml"
    bad_toml.write_text("[metrics.ece\nmax = 0.1\n")
    cases = [
        (["--data", str(empty)], "the store holds no runs"),
        (["--data", str(tmp_path / "missing")], "does not exist"),
        (["--data", str(store_root), "--run", "night-9"], "--run night-9: no such run"),
        (["--data", str(store_root), "--since", "1h", "--now", "2000-01-01T00:00:00Z"],
         "no runs started in the last 1h"),
        (["--data", str(store_root), "--since", "tomorrow"], "--since: duration 'tomorrow'"),
        (["--data", str(store_root), "--run", "night-2", "--baseline", "nope"], "--baseline nope: no such run"),
        (["--data", str(store_root), "--thresholds", str(bad_toml)], "not valid TOML"),
        (["--data", "s3://bucket/data"], "cannot reach the object store"),
    ]
    for args, message in cases:
        result = _report(*args, "--out", str(tmp_path / "out"), "--no-png", "--no-history")
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_corrupt_store_exits_2_naming_the_file(store_root, tmp_path):
    for table in ("step_reqs", "runs"):
        copy = tmp_path / f"copy-{table}"
        shutil.copytree(store_root, copy)
        part = sorted((copy / table / "run_id=night-2").glob("part-*.parquet"))[0]
        data = part.read_bytes()
        part.write_bytes(data[: len(data) // 2])  # a truncated part file
        result = _report("--data", str(copy), "--run", "night-2", "--out", str(tmp_path / "out"), "--no-png")
        assert result.exit_code == 2, result.output
        assert f"unreadable part file {part}" in result.stderr, result.stderr


def test_exit_code_and_stderr_of_the_installed_command(tmp_path):
    """The real process: exit code 2 and exactly one line on stderr."""
    proc = subprocess.run([sys.executable, "-m", "dspark_obs.cli", "report", "--data", str(tmp_path), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "holds no runs" in proc.stderr


# -- the page in headless Chromium, with no network ---------------------------------

def _chromium() -> str:
    for candidate in (os.environ.get("BROWSER_PATH"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).is_file():
            return candidate
    if os.environ.get("CI"):
        pytest.fail("Debian's chromium is not installed: apt-get install -y chromium (CI must provide it)")
    pytest.skip("Debian's chromium is not installed: apt-get install -y chromium")


def test_the_html_renders_its_charts_offline_in_chromium(good):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("the playwright package is not installed: pip install playwright")
        pytest.skip("the playwright package is not installed: pip install playwright (no `playwright install`)")
    chromium = _chromium()
    _, out = good
    summary = json.loads((out / "summary.json").read_text())
    requested, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
            page = context.new_page()

            def block(route):
                if route.request.url.startswith("file:"):
                    route.continue_()
                else:
                    requested.append(route.request.url)
                    route.abort()

            page.route("**/*", block)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto((out / "report.html").as_uri())
            n = len(summary["charts"])
            page.wait_for_function(
                "n => [...document.querySelectorAll('.js-plotly-plot')]"
                ".filter(d => d.querySelector('svg.main-svg')).length >= n", arg=n, timeout=60_000)
            drawn = page.evaluate(  # an SVG with at least one drawn trace
                "() => [...document.querySelectorAll('.js-plotly-plot')].filter(d => d.querySelector("
                "'svg.main-svg .scatterlayer .trace, svg.main-svg .barlayer .trace')).length")
            title = page.title()
        finally:
            browser.close()
    assert drawn == n >= 8
    assert requested == [], f"the page tried the network: {requested}"
    assert errors == []
    assert title.startswith("DSpark nightly report: PASS")


def test_the_sts_refit_is_evaluated_and_a_recommendation_writes_sglangs_file(store_root, bad, tmp_path):
    from dspark_obs.estimators.calibration.sts import StsCalibration, StsFit, fit_sts_run
    from dspark_obs.report.build import _sts_rows
    from dspark_obs.report.model import Figure, ThresholdVerdict
    from dspark_obs.report.render_md import render_markdown
    from dspark_obs.report.sts import StsSection

    _, out = bad
    summary = json.loads((out / "summary.json").read_text())
    (sts,) = summary["sts"]
    assert sts["run_id"] == "night-bad" and not sts["recommended"] and sts["file"] is None
    # The head's logits were doubled: T ~ 2 undoes it.  The fit is sequential (T_k minimises the ECE of S_k
    # with T_1..T_{k-1} fixed), so on 36 requests one position's overshoot is paid back by a later one: the
    # scale S_k sees -- the geometric mean of T_1..T_k -- stays near 2 at every depth, and the fitted
    # survivals are better calibrated than the recorded ones at every position.
    temps = sts["temperatures"]
    assert 1.6 < statistics.median(temps) < 2.6, temps
    cumulative = [statistics.geometric_mean(temps[:k]) for k in range(1, len(temps) + 1)]
    assert all(1.5 < t < 2.7 for t in cumulative), (temps, cumulative)
    refit = fit_sts_run(store_root, "night-bad", labels=summary["runs"][0]["labels"])
    assert refit.temperatures == pytest.approx(temps)
    assert all(after < reported for after, reported in zip(refit.ece_after, refit.ece_reported)), refit
    gain = next(f for f in summary["figures"] if f["metric"] == "sts_predicted_gain")
    assert gain["detail"]["conformance"] == 1.0 and gain["threshold"]["verdict"] == "pass"

    fit = StsFit(temperatures=[2.0] * 6, grid_temperatures=[2.0] * 6, ece_before=[0.1] * 6, ece_after=[0.01] * 6,
                 num_samples=10, n_labelled=[10] * 6)
    fig = Figure("sts_predicted_gain", "night-bad", 0.03, ci_low=0.02, ci_high=0.04)
    fig.threshold = ThresholdVerdict("max", 0.01, "point", "warn", True, 0.03, "warn")
    rows = _sts_rows(StsSection(fits={"night-bad": fit}), [fig], tmp_path)
    assert rows[0]["recommended"] and rows[0]["file"] == "sts-refit-night-bad.json"
    assert StsCalibration.from_json((tmp_path / rows[0]["file"]).read_bytes()).temperatures == [2.0] * 6
    md = render_markdown({**summary, "sts": rows})
    assert "night-bad: REFIT RECOMMENDED. Replay predicts +3.00% tokens/s" in md
    assert "--speculative-dspark-confidence-sts-path" in md
