"""Calibration of the confidence head's survival, and its recalibration: the public face.

* :mod:`.events` -- the events per position and where their labels come from;
* :mod:`.metrics` -- ECE/MCE/debiased ECE/Brier/log loss/AUROC, pure, over one
  sufficient-statistics type (:class:`~.metrics.Bins`; per request, :func:`~.metrics.request_bins`);
* :mod:`.resampling` -- the request bootstrap of every metric at once (:class:`~.resampling.RequestSums`),
  behind the report's intervals and drift tests;
* :mod:`.calibrate` -- :func:`calibrate_run`, which scores a run and writes
  ``calibration`` and ``calibration_bins`` (:mod:`.chunks` for large runs, :mod:`.ray` on an engine);
* :mod:`.sts` -- SGLang's Sequential Temperature Scaling: fit, apply, its JSON;
* :mod:`.recalibration` -- held-out survival maps (``recalibration``).

The names load on first use (PEP 562), so ``import dspark_obs.estimators.calibration.sts``
does not pull in DuckDB and pandas with ``calibrate`` (SGLang's fidelity venv has neither).
"""

from __future__ import annotations

import importlib

_HOMES = {
    "calibrate": ("RunCalibration", "calibrate_run", "calibrate_kinds", "summarise_events"),
    "events": ("LABEL_KINDS", "CalibrationDataError", "RunEvents", "block_events", "load_events", "observed_events"),
    "metrics": ("BINNINGS", "ReliabilityCurve", "auroc_score", "bootstrap_calibration_error", "brier_score_loss",
                "debiased_calibration_error", "expected_calibration_error", "log_loss",
                "maximum_calibration_error", "parse_binning", "reliability_curve"),
}
_SUBMODULES = ("calibrate", "chunks", "events", "metrics", "ray", "recalibration", "resampling", "rows", "sts")
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [*_HOME_OF, "CALIBRATION", "CALIBRATION_BINS"]


def __getattr__(name: str):
    if name in ("CALIBRATION", "CALIBRATION_BINS"):
        # on first use: the package's names load lazily (see the module docstring)
        from dspark_obs import schema

        return getattr(schema, name)
    if name in _SUBMODULES:  # ``calibration.chunks`` and the like, as an eager package would have them
        return importlib.import_module(f"{__name__}.{name}")
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
