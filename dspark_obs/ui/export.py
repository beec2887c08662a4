"""PNG export of chart-builder figures through kaleido (which drives a headless Chromium).

Kaleido finds Chromium through ``BROWSER_PATH`` or its own discovery on
``PATH``; :func:`find_chromium` looks in the usual places (Debian's package is
``/usr/bin/chromium``) and :func:`figure_png` points kaleido at what it found.

    apt-get install -y chromium      # Debian / Ubuntu: what kaleido needs here
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import plotly.graph_objects as go

__all__ = ["ExportError", "find_chromium", "figure_png", "DEFAULT_WIDTH_PX"]

DEFAULT_WIDTH_PX = 1100
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
_FIXED_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/lib/chromium/chromium",
                "/snap/bin/chromium")


class ExportError(RuntimeError):
    """A figure could not be rendered to PNG; the message says what to install or set."""


def find_chromium() -> str | None:
    """Path of a Chromium-family browser: ``BROWSER_PATH`` if it exists, else PATH, else Debian's path."""
    explicit = os.environ.get("BROWSER_PATH")
    if explicit and Path(explicit).is_file():
        return explicit
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return next((p for p in _FIXED_PATHS if Path(p).is_file()), None)


def figure_png(fig: go.Figure, *, width: int | None = None, height: int | None = None, scale: float = 2.0) -> bytes:
    """The figure as PNG bytes (``width`` defaults to 1100 px, ``height`` to the figure's own).

    Raises :class:`ExportError` when kaleido or Chromium is missing, naming the fix.
    """
    try:
        import kaleido  # noqa: F401  (plotly imports it lazily; fail here with a useful message)
    except ImportError as exc:
        raise ExportError("PNG export needs the kaleido package: pip install 'kaleido>=1'") from exc
    browser = find_chromium()
    if browser is None:
        raise ExportError("PNG export needs Chromium for kaleido: install it (Debian/Ubuntu: apt-get install -y "
                          "chromium) or set BROWSER_PATH to a Chrome/Chromium executable")
    if not os.environ.get("BROWSER_PATH") or not Path(os.environ["BROWSER_PATH"]).is_file():
        os.environ["BROWSER_PATH"] = browser
    height = height or (int(fig.layout.height) if fig.layout.height else 450)
    try:
        return fig.to_image(format="png", width=width or DEFAULT_WIDTH_PX, height=height, scale=scale)
    except Exception as exc:  # kaleido raises several types (ChromeNotFoundError, RuntimeError, ...)
        raise ExportError(f"PNG export failed in kaleido with Chromium at {browser}: {exc}") from exc
