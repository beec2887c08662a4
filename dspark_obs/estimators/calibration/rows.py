"""The ``calibration``, ``calibration_bins`` and ``calibration_resamples`` rows of one workload x position,
from its sufficient statistics.

One builder for the one pass (:mod:`.calibrate`) and the chunks (:mod:`.chunks`):
they differ only in how they got the cell's bins and the figures of each bootstrap
resample, never in what a row says.  The resamples are kept (ECE, debiased ECE and
Brier of each) so that ``dspark-obs report`` draws its intervals and drift tests
from them instead of reading every step again.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from dspark_obs.schema import CALIBRATION_RESAMPLES

from dspark_obs.estimators.calibration.metrics import (Bins, curve_of, debiased_ece_of, ece_of, mce_of,
                                                       none_if_nan, normal_interval)

__all__ = ["cell_rows", "RESAMPLED", "resample_table", "resample_table_of"]

RESAMPLED = ("ece", "debiased_ece", "brier")
"""The figures ``calibration_resamples`` keeps per bootstrap resample."""


def cell_rows(base: dict, common: dict, bins: dict[str, Bins], *, level: float,
              resamples: Callable[[str, Bins], dict[str, np.ndarray]] | None = None
              ) -> tuple[list[dict], list[dict], list[pa.Table]]:
    """One ``calibration`` row per binning (``base`` and ``common`` columns, then the binned metrics and, with
    ``resamples(binning, bins)`` — each resample's figures of :data:`RESAMPLED` — the ECE's interval at
    ``level``), its ``calibration_bins`` rows and its ``calibration_resamples`` rows (one table per binning).

    ``bins`` maps each binning to the cell's :class:`~.metrics.Bins`; a binning
    without them (an empty cell) gets a row of ``base`` and ``common`` alone.
    """
    rows, bin_rows, resample_rows = [], [], []
    for name, b in bins.items():
        row = {**base, "binning": name, **common}
        if b is not None:
            row.update(ece=ece_of(b), mce=mce_of(b), debiased_ece=debiased_ece_of(b))
            if resamples is not None:
                figures = resamples(name, b)
                lo, hi = normal_interval(row["ece"], figures["ece"], level)
                row.update(ece_ci_lo=none_if_nan(lo), ece_ci_hi=none_if_nan(hi))
                resample_rows.append(resample_table({**base, "binning": name}, figures))
            bin_rows += [{**base, "binning": name, **r} for r in curve_of(b).rows()]
        rows.append(row)
    return rows, bin_rows, resample_rows


def resample_table(keys: dict, figures: dict[str, np.ndarray]) -> pa.Table:
    """``calibration_resamples`` rows of one cell and binning: ``keys`` on every row, one row per resample."""
    n = len(figures["ece"])
    columns = {name: pa.array([value] * n) for name, value in keys.items()}
    columns["resample"] = pa.array(np.arange(n, dtype=np.int32))
    for metric in RESAMPLED:
        columns[metric] = pa.array(np.asarray(figures[metric], dtype=np.float64), from_pandas=True)
    return pa.table(columns)


def resample_table_of(parts: list[pa.Table]) -> pa.Table:
    """The ``calibration_resamples`` table of the cells' parts (empty, with its columns, when there are none)."""
    target = CALIBRATION_RESAMPLES.remove_metadata()
    return pa.concat_tables([t.select(target.names).cast(target) for t in parts]) if parts else target.empty_table()
