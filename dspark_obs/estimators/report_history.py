"""The ``reports`` table: one row per figure of every ``dspark-obs report``, kept over nights.

Each report appends the figures it judged (ECE per position and workload,
utilisation, coverage, cost-model error, ...) with their interval, their
threshold and drift verdicts and the report's overall status, partitioned by
the run the figure describes.  Reports are never rewritten: re-running a report
for a run adds a new ``report_id``; the latest report of a run is the row with
the greatest ``generated_at``.  The dashboard's Overview and SQL read the
history from here (canned query ``report_history``)::

    dspark-obs sql --data D report_history --param metric=utilisation

:func:`append` is the thin writer; the report builds the rows
(:mod:`dspark_obs.report`).
"""

from __future__ import annotations

import pyarrow as pa

from dspark_obs import schema
from dspark_obs.schema import REPORTS

__all__ = ["REPORTS", "append"]

_i16, _i64, _f64, _str = pa.int16(), pa.int64(), pa.float64(), pa.string()
_ts = pa.timestamp("us", tz="UTC")


_f = schema.field  # a documented column


def append(store, run_id: str, rows: list[dict]) -> None:
    """Append one report's rows for ``run_id`` to the ``reports`` table (a new part file)."""
    store.write("reports", run_id, rows)
