"""Calibration of the confidence head's survival, and its recalibration: the public face.

* :mod:`.events` -- the events per position and where their labels come from;
* :mod:`.metrics` -- ECE/MCE/debiased ECE/Brier/log loss/AUROC, pure, over one
  sufficient-statistics type (:class:`~.metrics.Bins`);
* :mod:`.calibrate` -- :func:`calibrate_run`, which scores a run and writes
  ``calibration`` and ``calibration_bins`` (:mod:`.chunks` for large runs, :mod:`.ray` on an engine);
* :mod:`.sts` -- SGLang's Sequential Temperature Scaling: fit, apply, its JSON;
* :mod:`.recalibration` -- held-out survival maps (``recalibration``).
"""

from dspark_obs.estimators.calibration.calibrate import RunCalibration, calibrate_run, summarise_events
from dspark_obs.estimators.calibration.events import (
                                                      LABEL_KINDS,
                                                      CalibrationDataError,
                                                      RunEvents,
                                                      block_events,
                                                      load_events,
                                                      observed_events,
)
from dspark_obs.estimators.calibration.metrics import (
                                                      BINNINGS,
                                                      ReliabilityCurve,
                                                      auroc_score,
                                                      bootstrap_calibration_error,
                                                      brier_score_loss,
                                                      debiased_calibration_error,
                                                      expected_calibration_error,
                                                      log_loss,
                                                      maximum_calibration_error,
                                                      parse_binning,
                                                      reliability_curve,
)
from dspark_obs.schema import CALIBRATION, CALIBRATION_BINS

__all__ = [
    "BINNINGS", "LABEL_KINDS", "ReliabilityCurve", "RunEvents", "RunCalibration",
    "expected_calibration_error", "maximum_calibration_error", "debiased_calibration_error",
    "brier_score_loss", "log_loss", "auroc_score", "reliability_curve",
    "bootstrap_calibration_error", "parse_binning", "block_events", "observed_events",
    "CalibrationDataError", "load_events", "summarise_events", "calibrate_run",
    "CALIBRATION", "CALIBRATION_BINS",
]
