"""Run one benchmark function in this fresh process and print its JSON result (see ``bench.common.run_child``).

    python -m bench.child bench.ingest:ours '{"body": "/tmp/x.json", "repeat": 5}'
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import peak_rss_mb  # noqa: E402


def main() -> int:
    target, kwargs = sys.argv[1], json.loads(sys.argv[2])
    module, func = target.split(":")
    result = getattr(importlib.import_module(module), func)(**kwargs)
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
