"""The one stage list: its order, which label kinds and cost-model pools a run gets, and the runner's loop."""

from __future__ import annotations

import pytest

from dspark_obs import pipeline
from dspark_obs.pipeline import STAGES, Plan


def test_stages_run_in_the_one_order():
    assert STAGES == ("estimate", "calibrate", "costmodel", "replay", "figures")


@pytest.mark.parametrize("mode, companion, kinds", [
    ("compact", "cap", ("observed", "reconstructed", "companion")),
    ("compact", None, ("observed", "reconstructed")),
    ("cap-accept", None, ("observed",)),
    (None, None, ("observed",)),
    ("static", None, ()),
])
def test_a_run_is_calibrated_with_the_label_kinds_its_mode_has(mode, companion, kinds):
    assert Plan("r", companion=companion, mode=mode).label_kinds() == kinds


def test_the_cost_model_tries_the_run_alone_then_with_its_companion():
    assert Plan("r", companion="c").pools() == (("r",), ("r", "c"))
    assert Plan("r").pools() == (("r",),)
    assert Plan("r", companion="c", costmodel_pools=(("r", "c"),)).pools() == (("r", "c"),)


def test_an_unknown_stage_is_refused_naming_the_stages():
    with pytest.raises(ValueError, match="unknown stage.*estimate, calibrate"):
        Plan("r", stages=("estimate", "plots"))


def _recording(monkeypatch, fail: dict | None = None) -> list:
    calls: list = []

    def runner(stage):
        def run(store, plan, notes):
            calls.append((stage, plan.run))
            if fail and (stage, plan.run) in fail:
                raise fail[(stage, plan.run)]
            notes.append(f"{plan.run}: {stage}")
        return run

    monkeypatch.setattr(pipeline, "_RUNNERS", {s: runner(s) for s in STAGES[:-1]})
    return calls


def test_plans_run_stage_by_stage_every_run_before_the_next_stage(monkeypatch):
    calls = _recording(monkeypatch)
    plans = pipeline.demo_plans("c", "cap")
    out = pipeline.run_plans(object(), plans)
    assert calls == [("estimate", "c"), ("estimate", "cap"), ("calibrate", "c"), ("costmodel", "c"), ("replay", "c")]
    assert out.notes == ["c: estimate", "cap: estimate", "c: calibrate", "c: costmodel", "c: replay"]


def test_a_tolerated_estimate_error_is_a_note_and_the_rest_still_run(monkeypatch):
    calls = _recording(monkeypatch, fail={("estimate", "r"): LookupError("no steps")})
    notes = pipeline.run_plan(object(), Plan("r", stages=("estimate", "calibrate"), tolerate_errors=True))
    assert calls == [("estimate", "r"), ("calibrate", "r")]
    assert notes == ["r: ceiling estimate unavailable: no steps", "r: calibrate"]
    with pytest.raises(LookupError):
        pipeline.run_plan(object(), Plan("r", stages=("estimate",)))


def test_the_figures_stage_draws_through_the_builder_it_is_handed(monkeypatch):
    _recording(monkeypatch)
    with pytest.raises(ValueError, match="figures_stage"):
        pipeline.run_plans(object(), [Plan("r", stages=("figures",))])
    out = pipeline.run_plans("store", [Plan("r", stages=("replay", "figures"))],
                             figures=lambda store, plan: (store, plan.run))
    assert out.reports == {"r": ("store", "r")}
    assert out.notes == ["r: replay", "r: wrote the report (dspark-obs report)"]
