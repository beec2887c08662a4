"""Line-oriented files (logs, JSON lines) as the importers and the sidecar read them."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(1-based line number, text)`` of each non-blank line, decoding invalid UTF-8 as U+FFFD."""
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            text = raw.decode("utf-8", "replace").strip()
            if text:
                yield i, text
