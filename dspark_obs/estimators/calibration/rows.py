"""The ``calibration`` and ``calibration_bins`` rows of one workload x position, from its sufficient statistics.

One builder for the one pass (:mod:`.calibrate`) and the chunks (:mod:`.chunks`):
they differ only in how they got the cell's bins and the ECE of each bootstrap
resample, never in what a row says.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dspark_obs.estimators.calibration.metrics import (Bins, curve_of, debiased_ece_of, ece_of, mce_of,
                                                       none_if_nan, normal_interval)

__all__ = ["cell_rows"]


def cell_rows(base: dict, common: dict, bins: dict[str, Bins], *, level: float,
              ece_resamples: Callable[[str, Bins], np.ndarray] | None = None) -> tuple[list[dict], list[dict]]:
    """One ``calibration`` row per binning (``base`` and ``common`` columns, then the binned metrics and, with
    ``ece_resamples(binning, bins)``, the ECE's interval at ``level``) and its ``calibration_bins`` rows.

    ``bins`` maps each binning to the cell's :class:`~.metrics.Bins`; a binning
    without them (an empty cell) gets a row of ``base`` and ``common`` alone.
    """
    rows, bin_rows = [], []
    for name, b in bins.items():
        row = {**base, "binning": name, **common}
        if b is not None:
            row.update(ece=ece_of(b), mce=mce_of(b), debiased_ece=debiased_ece_of(b))
            if ece_resamples is not None:
                lo, hi = normal_interval(row["ece"], ece_resamples(name, b), level)
                row.update(ece_ci_lo=none_if_nan(lo), ece_ci_hi=none_if_nan(hi))
            bin_rows += [{**base, "binning": name, **r} for r in curve_of(b).rows()]
        rows.append(row)
    return rows, bin_rows
