"""The nightly report: gates, drift against a baseline, and a record over time.

``dspark-obs report`` (:func:`build_report`) judges a night's runs: calibration of
the confidence head per position and workload, acceptance against the
full-block ceiling, the block-accept estimator against a truth, the cost
model, collection losses and an STS refit's replayed gain — each figure with its
interval, a threshold verdict (:mod:`~dspark_obs.report.thresholds`) and a drift
verdict against the baseline (:mod:`~dspark_obs.report.gates`).  It writes a
self-contained HTML page drawn with the dashboard's chart builders,
``summary.json`` (:mod:`~dspark_obs.report.summary`), ``summary.md`` and PNGs,
and appends its figures to the store's ``reports`` table.

Modules: ``inputs`` (runs, readability, estimator stages), ``calibration``,
``ceiling``, ``costmodel``, ``collection``, ``sts`` (the figures of each
section), ``bootstrap`` and ``stats`` (intervals and tests), ``gates`` and
``thresholds`` (verdicts), ``plots`` and ``charts`` (figures), ``render_md``,
``render_html``, ``png``, ``summary`` (outputs), ``build`` (the whole report).
"""

from dspark_obs.report.build import ReportOptions, ReportResult, build_report, figures_stage
from dspark_obs.report.inputs import InputError
from dspark_obs.report.summary import SCHEMA_VERSION
from dspark_obs.report.thresholds import ThresholdsError, load_thresholds

__all__ = ["ReportOptions", "ReportResult", "build_report", "figures_stage", "InputError", "ThresholdsError", "load_thresholds",
           "SCHEMA_VERSION"]
