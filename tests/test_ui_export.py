"""PNG export through kaleido and Debian's chromium; the palette's stability."""

from __future__ import annotations

import os

import plotly.graph_objects as go
import pytest

from dspark_obs.ui import charts, export, palette


def test_find_chromium_prefers_browser_path(tmp_path, monkeypatch):
    fake = tmp_path / "my-chrome"
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("BROWSER_PATH", str(fake))
    assert export.find_chromium() == str(fake)
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "missing"))
    assert export.find_chromium() != str(tmp_path / "missing")


def test_missing_chromium_is_an_export_error_naming_the_fix(monkeypatch):
    monkeypatch.setattr(export, "find_chromium", lambda: None)
    with pytest.raises(export.ExportError, match="apt-get install -y chromium.*BROWSER_PATH"):
        export.figure_png(go.Figure())


def test_a_chart_renders_to_png_through_kaleido():
    if export.find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (apt-get install -y chromium) for kaleido's PNG export")
        pytest.skip("no Chromium on this machine: apt-get install -y chromium")
    fig = charts.throughput_curves([{"run_id": "a", "mode": "compact", "method": "compact", "workload": "*",
                                     "concurrency": 1, "requests": 3, "per_user_tok_s": 100.0,
                                     "throughput_tok_s": 100.0, "mean_accept_length": 4.0}])
    png = export.figure_png(fig, width=600, height=400, scale=1)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_palette_is_stable_and_distinguishes_modes():
    assert palette.workload_color("gsm8k") == "#4C78A8"
    assert palette.workload_color("my-workload") == palette.workload_color("my-workload")
    assert palette.workload_color(None) == palette.workload_color("unknown")
    modes = ("compact", "cap-accept", "static", "no-trim")
    for style in (palette.mode_color, palette.mode_dash, palette.mode_symbol, palette.mode_pattern):
        assert len({style(m) for m in modes}) == len(modes), style.__name__
    known = set(palette.WORKLOAD_COLORS.values())
    assert not known & {palette.mode_color(m) for m in modes}  # a mode never looks like a workload
