"""What the demo, ``estimate``, ``calibrate`` and ``report`` write on the demo store is pinned.

``tests/outputs_pinned.json`` holds digests (:mod:`output_digest`) of every table and report summary
they wrote, taken with ``PYTHONPATH=. python tests/output_digest.py --pin`` on the code before the
estimator stages moved into :mod:`dspark_obs.pipeline` and the two stores became one.  They start
from what ``demo --quick`` collected (``tests/data/demo-collected``), as a collection on a loaded
machine is not the same twice.  A change meant to alter an output retakes the pin and says why in
its commit.
"""

from __future__ import annotations

import json
from pathlib import Path

from output_digest import pinned_outputs

PINNED = json.loads((Path(__file__).parent / "outputs_pinned.json").read_text())


def test_demo_estimate_calibrate_and_report_write_what_they_wrote_before(tmp_path):
    got = pinned_outputs(tmp_path)
    for key, want in PINNED.items():  # one section at a time, so a failure names the output that moved
        assert got[key] == want, key
