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

__all__ = ["REPORTS", "append"]

_i16, _i64, _f64, _str = pa.int16(), pa.int64(), pa.float64(), pa.string()
_ts = pa.timestamp("us", tz="UTC")


_f = schema.field  # a documented column


REPORTS = pa.schema([
    _f("report_id", _str, "id of the report that judged the figure (UTC time and a short hash)", False),
    _f("generated_at", _ts, "when the report was made (UTC)", False),
    _f("report_status", _str, "the whole report's outcome: pass | fail", False),
    _f("run_started_at", _ts, "when the figure's run started (the x axis of a history)"),
    _f("section", _str, "calibration | ceiling | estimator | costmodel | collection | sts", False),
    _f("metric", _str, "figure name, e.g. debiased_ece, utilisation, estimator_coverage", False),
    _f("workload", _str, "workload; '*' = all workloads; null when not per workload"),
    _f("position", _i16, "draft position k (1..gamma) for per-position figures; else null"),
    _f("labels", _str, "calibration labels behind the figure (companion | reconstructed | observed)"),
    _f("value", _f64, "the figure"),
    _f("ci_low", _f64, "lower end of its interval (see the report's summary.json for the method)"),
    _f("ci_high", _f64, "upper end of its interval"),
    _f("n", _i64, "samples behind the figure (request-steps, steps, ...)"),
    _f("limit_kind", _str, "max | min: which side of the limit passes; null without a limit"),
    _f("limit_value", _f64, "the threshold the figure was held to"),
    _f("threshold_verdict", _str, "pass | fail | warn | insufficient | none"),
    _f("baseline_runs", _str, "comma-separated runs the drift test compared against"),
    _f("baseline_value", _f64, "the figure over the baseline runs"),
    _f("delta", _f64, "value - baseline_value"),
    _f("p_value", _f64, "two-sided p-value of the drift test"),
    _f("q_value", _f64, "Benjamini-Hochberg adjusted p-value over the report's drift tests"),
    _f("drift_test", _str, "the significance test used for drift"),
    _f("drift_verdict", _str, "pass | improved | warn | fail | no_baseline | not_tested | insufficient"),
    _f("verdict", _str, "combined verdict of the figure: pass | warn | fail | info | insufficient", False),
    _f("summary_schema_version", _str, "version of the report's summary.json schema"),
])

schema.register("reports", REPORTS)


def append(store, run_id: str, rows: list[dict]) -> None:
    """Append one report's rows for ``run_id`` to the ``reports`` table (a new part file)."""
    store.write("reports", run_id, rows)
