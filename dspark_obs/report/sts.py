"""The STS refit figure: what Sequential Temperature Scaling fitted on tonight's run would gain.

For each run with confidences: fit STS on the run's judged labels as
``dspark-obs calibrate --fit-sts`` does (undoing the STS the server ran with,
read from its ``--speculative-dspark-confidence-sts-path``), on whole requests
holding :data:`STS_SAMPLE_ROWS` steps when the run has more (the grid search
costs every step once per temperature; six temperatures are pinned long before
millions of steps), then replay the
run's schedule with the recalibrated confidences (``dspark-obs replay --sts``)
and price both schedules with the same time model.  The figure
``sts_predicted_gain`` is ``tokens/s(sts) / tokens/s(replay) - 1``; its interval
spans the gains at the low and high ends of the full-block acceptance (the
ceiling's ``[lo, hi]``), not a sampling interval.  The refit is recommended when
the gain clears the ``sts_predicted_gain`` limit (a warning, by default).

The ECE after the fit is in-sample (fitted and scored on the same steps), so it
is optimistic; the replayed gain is the figure to act on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from dspark_obs.estimators import replay
from dspark_obs.estimators.calibration import sts
from dspark_obs.estimators.calibration.chunks import DEFAULT_SAMPLE_ROWS
from dspark_obs.sts_format import StsCalibration
from dspark_obs.report.inputs import RunInfo
from dspark_obs.report.model import Figure

__all__ = ["StsSection", "sts_section", "STS_SAMPLE_ROWS"]

STS_SAMPLE_ROWS = DEFAULT_SAMPLE_ROWS
"""Steps of whole requests the refit is fitted on when a run holds more (calibrate's sample for AUROC)."""


@dataclass
class StsSection:
    figures: list[Figure] = field(default_factory=list)
    fits: dict[str, object] = field(default_factory=dict)  # run -> StsFit
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)  # sts_before_after rows (with run_id)
    notes: list[str] = field(default_factory=list)


def _served_temperatures(run: RunInfo) -> tuple[list[float] | None, str | None]:
    """The STS temperatures the server ran with (None: none), or an error note."""
    path = run.server_info.get("speculative_dspark_confidence_sts_path")
    if not path:
        return None, None
    try:
        with open(path, "rb") as f:
            return StsCalibration.from_json(f.read()).temperatures, None
    except (OSError, ValueError) as exc:
        return None, (f"{run.run_id}: served with STS file {path}, which cannot be read here ({exc}); "
                      "the refit needs it to recover raw logits — run the report where the file exists")


def sts_section(con, runs: list[RunInfo], labels: dict[str, str]) -> StsSection:
    out = StsSection()
    frames = []
    for run in runs:
        kind = labels.get(run.run_id)
        if kind is None or run.mode not in ("compact", "cap-accept"):
            continue
        current, problem = _served_temperatures(run)
        if problem:
            out.notes.append(problem)
            continue
        try:
            fit = sts.fit_sts_run(con, run.run_id, labels=kind, current_temperatures=current,
                                  dataset=f"dspark-obs:{run.run_id}:labels={kind}", sample_rows=STS_SAMPLE_ROWS)
            rep = replay.replay_run(con, run.run_id, sts_temperatures=fit.temperatures,
                                    current_temperatures=current)
        except ValueError as exc:
            out.notes.append(f"{run.run_id}: STS refit not evaluated: {exc}")
            continue
        scen = {w["scenario"]: w for w in rep.whatif}
        base, new = scen.get("replay"), scen.get("sts")
        if not base or not new or not base.get("tokens_per_s"):
            out.notes.append(f"{run.run_id}: schedule replay priced no steps; STS gain unknown")
            continue
        gain = new["tokens_per_s"] / base["tokens_per_s"] - 1.0
        ends = [new[f"tokens_per_s_{e}"] / base[f"tokens_per_s_{e}"] - 1.0 for e in ("lo", "hi")
                if base.get(f"tokens_per_s_{e}")]
        out.fits[run.run_id] = fit
        out.figures.append(Figure(
            "sts_predicted_gain", run.run_id, gain, ci_low=min([gain, *ends]), ci_high=max([gain, *ends]),
            ci_method="ceiling [lo, hi] in the replay", n=int(new["steps"]),
            detail={"labels": kind, "temperatures": [round(t, 4) for t in fit.temperatures],
                    "served_temperatures": current, "tokens_per_s_replay": base["tokens_per_s"],
                    "tokens_per_s_sts": new["tokens_per_s"], "acceptance_source": new["acceptance_source"],
                    "estimated_share": new["estimated_share"], "time_model": new["time_model"],
                    "conformance": rep.conformance.get("share")}))
        frames.append(pd.DataFrame({
            "run_id": run.run_id, "position": range(1, len(fit.temperatures) + 1),
            "ece_raw": fit.ece_before, "ece_served": fit.ece_reported, "ece_after": fit.ece_after,
            "temperature": fit.temperatures}))
        out.notes += [f"{run.run_id}: {n}" for n in rep.notes]
    if frames:
        out.frame = pd.concat(frames, ignore_index=True)
    return out
