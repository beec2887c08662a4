"""The ceiling estimator's fit: what a run's verified drafts taught, kept so another process can use it.

``dspark-obs estimate`` fits, once per run, the acceptance model, the drafter
map (and whether it explains the verified outcomes better) and the binned
prior behind the sampled requests' ``mid`` (:mod:`~dspark_obs.estimators.ceiling.prior`,
:mod:`~dspark_obs.estimators.ceiling.drafter`).  ``estimate --fit-out FILE`` writes them as JSON; the
sidecar's live ceiling (``collect --ceiling-fit FILE``) and a later
``estimate --fit-in FILE`` read them back, so a run of the same deployment
(same drafter, head and STS) is estimated by the same numbers, live and
offline.  The file holds the fitted arrays exactly (floats round-trip through
JSON's shortest repr).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from dspark_obs.estimators.ceiling.drafter import DrafterMap
from dspark_obs.estimators.ceiling.prior import AcceptanceModel, BinnedPrior

__all__ = ["CeilingFit", "FORMAT"]

FORMAT = "dspark-obs ceiling fit v1"


@dataclass(frozen=True)
class CeilingFit:
    """The models :func:`~dspark_obs.estimators.ceiling.estimate_ceiling` takes, fitted on one run."""

    acceptance: AcceptanceModel
    drafter: DrafterMap
    use_drafter: bool
    binned: Optional[BinnedPrior]
    meta: dict = field(default_factory=dict, compare=False)  # run_id, gamma: where it was fitted

    @property
    def gamma(self) -> int:
        return self.acceptance.gamma

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "meta": self.meta, "use_drafter": bool(self.use_drafter),
                "acceptance": _encode(self.acceptance), "drafter": _encode(self.drafter),
                "binned": None if self.binned is None else _encode(self.binned)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "CeilingFit":
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a ceiling fit (expected format {FORMAT!r}): write one with "
                             "`dspark-obs estimate --data D --run R --fit-out FILE`")
        return cls(_decode(AcceptanceModel, doc["acceptance"]), _decode(DrafterMap, doc["drafter"]),
                   bool(doc["use_drafter"]), None if doc.get("binned") is None else _decode(BinnedPrior, doc["binned"]),
                   dict(doc.get("meta") or {}))

    def save(self, path: Path | str) -> None:
        Path(path).write_text(json.dumps(self.to_json()) + "\n")

    @classmethod
    def load(cls, path: Path | str) -> "CeilingFit":
        """Read a fit; ValueError naming the file and the fix when it is not one."""
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from exc


def _value(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return {"array": v.tolist(), "dtype": str(v.dtype), "shape": list(v.shape)}
    if isinstance(v, dict):  # the acceptance model's dicts are keyed by greedy (bool)
        return {"by_greedy": {str(bool(k)).lower(): _value(x) for k, x in v.items()}}
    if isinstance(v, np.generic):
        return v.item()
    return v


def _unvalue(v: Any) -> Any:
    if isinstance(v, dict) and "array" in v:
        return np.asarray(v["array"], dtype=v["dtype"]).reshape(v["shape"])
    if isinstance(v, dict) and "by_greedy" in v:
        return {k == "true": _unvalue(x) for k, x in v["by_greedy"].items()}
    return v


def _encode(obj) -> dict[str, Any]:
    return {f.name: _value(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _decode(cls, doc: dict[str, Any]):
    return cls(**{f.name: _unvalue(doc[f.name]) for f in dataclasses.fields(cls)})
