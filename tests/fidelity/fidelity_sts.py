"""STS against SGLang's own fit and loader.

Without refinement our Sequential Temperature Scaling is SGLang's
``benchmark/dspark_sts_fit.fit_sts_temperatures`` (41-point log grid on
[0.1, 10], ECE of the survival per position); every STS file we write loads
with ``load_sts_calibration_from_path`` and says the same thing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sglang.benchmark import dspark_sts_fit as sg_fit
from sglang.srt.speculative.dspark_components.dspark_sts import load_sts_calibration_from_path

from dspark_obs.estimators.calibration.sts import fit_sts


def _dataset(seed: int, n: int = 4000, gamma: int = 6, true_t: float = 1.7):
    rng = np.random.default_rng(seed)
    logits = rng.normal(1.5, 1.6, size=(n, gamma))
    accept = rng.random((n, gamma)) < 1.0 / (1.0 + np.exp(-logits / true_t))
    prefix = np.cumprod(accept, axis=1).astype(np.float64)  # first k drafts all survive
    return logits, prefix


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grid_fit_is_sglangs_fit(seed):
    logits, prefix = _dataset(seed)
    ours = fit_sts(logits, prefix, refine=False)
    theirs = sg_fit.fit_sts_temperatures(logits=torch.from_numpy(logits), prefix_mask=torch.from_numpy(prefix),
                                         grid=sg_fit.default_temperature_grid(), num_bins=15)
    assert ours.temperatures == pytest.approx(theirs["temperatures"], rel=1e-12)
    assert ours.ece_before == pytest.approx(theirs["ece_before"], abs=1e-9)
    assert ours.ece_after == pytest.approx(theirs["ece_after"], abs=1e-9)


def test_written_sts_files_load_with_sglangs_loader(tmp_path):
    logits, prefix = _dataset(7)
    fit = fit_sts(logits, prefix)  # with the continuous refinement
    path = tmp_path / "sts.json"
    path.write_text(fit.to_sglang().to_json())
    loaded = load_sts_calibration_from_path(str(path))
    assert list(loaded.temperatures) == pytest.approx(fit.temperatures)
    assert loaded.num_samples == fit.num_samples
