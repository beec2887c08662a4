"""SGLang 0.5.23's STS calibration file, as a data contract.

``--speculative-dspark-confidence-sts-path`` loads a ``DSparkStsCalibration``
(``sglang/srt/speculative/dspark_components/dspark_sts.py``):
``{temperatures, dataset, num_samples, ece_before, ece_after}``, and the server
applies ``c_k = sigmoid(raw_k / T_k)``.  The one declaration of that file here:
``calibrate --fit-sts`` writes it, ``ingest --sts``, ``calibrate --current-sts``,
the report and the dashboard read it.  Only msgspec, so SGLang's fidelity venv
(no DuckDB, no pandas) imports it.

>>> StsCalibration.from_json('{"temperatures": [1.5, 2.0]}').temperatures
[1.5, 2.0]
"""

from __future__ import annotations

import math

import msgspec

__all__ = ["StsCalibration"]


class StsCalibration(msgspec.Struct, frozen=True, omit_defaults=True):
    """SGLang's STS file (``DSparkStsCalibration``): loads with ``load_sts_calibration_from_path``.

    Checked as SGLang checks it (at least one temperature, every one > 0) and
    also finite: an infinite temperature flattens every confidence to 0.5.
    """

    temperatures: list[float]
    dataset: str = ""
    num_samples: int = 0
    ece_before: list[float] = []
    ece_after: list[float] = []

    def __post_init__(self) -> None:
        if not self.temperatures:
            raise ValueError("an STS calibration needs at least one temperature")
        if not all(t > 0 and math.isfinite(t) for t in self.temperatures):
            raise ValueError(f"STS temperatures must all be finite and > 0, got {self.temperatures}")

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode("utf-8")

    @classmethod
    def from_json(cls, text: str | bytes) -> "StsCalibration":
        """Parse an STS file's text; a malformed file is a ValueError naming the problem.

        >>> StsCalibration.from_json('{"temperatures": [1.0, 0.0]}')
        Traceback (most recent call last):
        ...
        ValueError: not an SGLang STS calibration ({temperatures: [...], ...}): STS temperatures must all be finite and > 0, got [1.0, 0.0]
        """
        try:
            return msgspec.json.decode(text, type=cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"not an SGLang STS calibration ({{temperatures: [...], ...}}): {exc}") from None
        except msgspec.DecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
