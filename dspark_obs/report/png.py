"""PNG files of a report's charts, through the dashboard's exporter (:func:`dspark_obs.ui.export.figure_png`).

Kaleido starts a headless Chromium per image unless a session is open; one
session for the whole report makes each image a fraction of a second instead
of a few seconds.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

from dspark_obs.ui.export import ExportError, figure_png, find_chromium

__all__ = ["export_pngs"]


@contextlib.contextmanager
def _kaleido_session():
    """A persistent kaleido browser while the block runs (a no-op where kaleido cannot start one)."""
    browser = find_chromium()
    if browser is None:  # kaleido's server thread would die with a traceback; figure_png names the fix
        yield
        return
    if not os.environ.get("BROWSER_PATH"):
        os.environ["BROWSER_PATH"] = browser
    started = False
    try:
        import kaleido  # why: optional at import (PNG export only, it drives Chromium)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kaleido.start_sync_server(silence_warnings=True)
        started = True
    except Exception:  # no kaleido, an old kaleido or no browser: figure_png says what is missing
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "kopts is ignored if using a server"
            yield
    finally:
        if started:
            with contextlib.suppress(Exception):
                kaleido.stop_sync_server(silence_warnings=True)


def export_pngs(charts: list, directory: Path) -> tuple[dict[str, str], list[str]]:
    """Write ``<name>.png`` for every chart into ``directory``; ``({name: path}, notes)``.

    A failed export (kaleido or Chromium missing) stops the export with a note
    naming the fix; the report is complete without PNGs.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.png"):
        stale.unlink()
    written: dict[str, str] = {}
    with _kaleido_session():
        for chart in charts:
            try:
                data = figure_png(chart.figure, scale=1.5)
            except ExportError as exc:
                return written, [f"PNG export stopped: {exc}"]
            path = directory / f"{chart.name}.png"
            path.write_bytes(data)
            written[chart.name] = str(path)
    return written, []
