"""The analysis stages in their one order, and the one runner every caller uses.

A collected run becomes analysed by five stages, always in this order::

    estimate -> calibrate -> costmodel -> replay -> figures

``estimate`` fills the ceiling tables (:mod:`dspark_obs.estimators.ceiling`),
``calibrate`` the calibration table once per label kind, ``costmodel`` the
fitted cost table and its error, ``replay`` the schedule replay, and
``figures`` the report (every chart and verdict, :mod:`dspark_obs.report`, which
hands its builder in: the report runs the stages a run lacks through this module).

Why one module: the demo, the report (a store that was only collected),
the dashboard's sample data and the CLI all run these stages; each used to
carry its own list, and the lists drifted.  A :class:`Plan` says *which*
stages run on *which* run and how (bootstrap size, seed, skip what is done,
turn a stage's data error into a note); :func:`run_plan` is the only loop.
The stages only orchestrate: the arithmetic lives in the estimators, the
tables in the store; this module opens one connection per stage and writes
nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["STAGES", "LABEL_KINDS", "Plan", "Outcome", "run_plans", "run_plan", "demo_plans"]

STAGES = ("estimate", "calibrate", "costmodel", "replay", "figures")
"""Every stage, in the order they run (a later stage reads what an earlier one wrote)."""

LABEL_KINDS = ("observed", "reconstructed", "companion")
"""Calibration label kinds, in the order ``calibrate`` runs them (the estimator's own list)."""


@dataclass(frozen=True)
class Plan:
    """What to run on one run.

    ``companion``: its cap-accept companion (compact runs); ``mode``: its verify
    mode, which decides the label kinds (``static`` runs are not calibrated).
    ``costmodel_pools``: run lists tried in order until one fits (default: the
    run alone).  ``only_missing`` skips a stage whose table already holds the
    run; ``tolerate_errors`` turns a stage's data error into a note (the report
    then shows that section as unavailable).  ``engine`` (a RayEngine) runs
    the ceiling and calibration stages on Ray.  ``report`` holds the options of
    the ``figures`` stage (:class:`dspark_obs.report.ReportOptions` fields).
    """

    run: str
    companion: str | None = None
    mode: str | None = "compact"
    stages: tuple[str, ...] = STAGES
    labels: tuple[str, ...] | None = None
    n_bootstrap: int = 200
    seed: int = 0
    costmodel_pools: tuple[tuple[str, ...], ...] | None = None
    only_missing: bool = False
    tolerate_errors: bool = False
    engine: Any = None
    report: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise ValueError(f"unknown stage(s) {', '.join(unknown)}; stages: {', '.join(STAGES)}")

    def label_kinds(self) -> tuple[str, ...]:
        """The calibration label kinds this run has: observed always; the rest on compact runs."""
        if self.labels is not None:
            return self.labels
        if self.mode == "static":
            return ()
        if self.mode != "compact":
            return ("observed",)
        return ("observed", "reconstructed") + (("companion",) if self.companion else ())

    def pools(self) -> tuple[tuple[str, ...], ...]:
        if self.costmodel_pools is not None:
            return self.costmodel_pools
        return ((self.run,),) + (((self.run, self.companion),) if self.companion else ())


def _connect(store):
    from dspark_obs import sql as sqlmod  # at call time: DuckDB's import is start-up cost for every command

    return sqlmod.connect(store.location)


def _has_rows(store, table: str, run: str) -> bool:
    con = _connect(store)
    return con.sql(f"SELECT count(*) FROM {table} WHERE run_id = $run", params={"run": run}).fetchall()[0][0] > 0


def _estimate(store, plan: Plan, notes: list[str]) -> None:
    from dspark_obs.estimators import ceiling  # at call time: scipy and the estimators are start-up cost

    if plan.only_missing and _has_rows(store, "ceiling_summary", plan.run):
        return
    companion = plan.companion if plan.mode == "compact" else None
    ceiling.estimate_run(store, plan.run, companion=companion, n_bootstrap=plan.n_bootstrap, seed=plan.seed,
                         engine=plan.engine)
    notes.append(f"{plan.run}: ran the ceiling estimator (dspark-obs estimate)")


def _calibrate(store, plan: Plan, notes: list[str]) -> None:
    from dspark_obs.estimators import calibration  # at call time: scipy and the estimators are start-up cost

    kinds = plan.label_kinds()
    present: set[str] = set()
    if kinds and plan.only_missing:
        present = {k for k, in _connect(store).sql("SELECT DISTINCT labels FROM calibration WHERE run_id = $run",
                                                   params={"run": plan.run}).fetchall()}
    missing = [kind for kind in kinds if kind not in present]
    if not missing:
        return
    try:  # every chunk read once for all the missing kinds
        results = calibration.calibrate_kinds(store, plan.run, missing, companion=plan.companion,
                                              n_bootstrap=plan.n_bootstrap, seed=plan.seed, engine=plan.engine)
    except ValueError as exc:  # an option or the store itself: every kind
        results = {kind: exc for kind in missing}
    for kind, result in results.items():
        if isinstance(result, ValueError):  # CalibrationDataError is a ValueError
            if not plan.tolerate_errors:
                raise result
            notes.append(f"{plan.run}: {kind} calibration unavailable: {result}")
        else:
            notes.append(f"{plan.run}: calibrated with {kind} labels (dspark-obs calibrate)")


def _costmodel(store, plan: Plan, notes: list[str]) -> None:
    from dspark_obs.estimators import costmodel  # at call time: the estimators are start-up cost

    if plan.only_missing and _has_rows(store, "costmodel_error", plan.run):
        return
    pools = plan.pools()
    con = _connect(store)
    for pool in pools:
        try:
            costmodel.write_results(store, costmodel.fit_runs(con, list(pool)))
            notes.append(f"{plan.run}: fitted the cost model on {', '.join(pool)} (dspark-obs costmodel)")
            return
        except ValueError as exc:
            if pool is pools[-1]:
                if not plan.tolerate_errors:
                    raise
                notes.append(f"{plan.run}: cost model unavailable: {exc}")


def _replay(store, plan: Plan, notes: list[str]) -> None:
    from dspark_obs.estimators import replay  # at call time: the estimators are start-up cost

    if plan.only_missing and _has_rows(store, "replay_conformance", plan.run):
        return
    replay.write_results(store, replay.replay_run(_connect(store), plan.run))
    notes.append(f"{plan.run}: replayed the schedule (dspark-obs replay)")


_RUNNERS: dict[str, Callable[[Any, Plan, list[str]], None]] = {
    "estimate": _estimate, "calibrate": _calibrate, "costmodel": _costmodel, "replay": _replay,
}


@dataclass
class Outcome:
    """What a pipeline run did: its notes, in order, and the report of each run whose figures were drawn."""

    notes: list[str] = field(default_factory=list)
    reports: dict[str, Any] = field(default_factory=dict)


def run_plans(store, plans: Sequence[Plan], *, figures: Callable[[Any, Plan], Any] | None = None,
              progress: Callable[[str, str], None] | None = None) -> Outcome:
    """Run every plan's stages on ``store``, stage by stage in :data:`STAGES` order (all runs' estimates first).

    Stage-major, so a stage of one run can read what an earlier stage wrote for
    another (the compact run's calibration reads its companion's rows).  With
    ``tolerate_errors`` a stage's data error (too few steps, no such run)
    becomes a note; calibrate and costmodel note per label kind and per pool.
    ``progress(stage, run)`` is called before each stage.

    ``figures(store, plan)`` draws the ``figures`` stage:
    :func:`dspark_obs.report.figures_stage`, handed in because the report sits
    above this module (it runs the stages a run lacks through it).
    """
    out = Outcome()

    def draw(store, plan: Plan, notes: list[str]) -> None:
        if figures is None:
            raise ValueError("the figures stage draws the report: pass figures=dspark_obs.report.figures_stage")
        out.reports[plan.run] = figures(store, plan)
        notes.append(f"{plan.run}: wrote the report (dspark-obs report)")

    runners = {**_RUNNERS, "figures": draw}
    for stage in STAGES:
        for plan in (p for p in plans if stage in p.stages):
            if progress is not None:
                progress(stage, plan.run)
            try:
                runners[stage](store, plan, out.notes)
            except (ValueError, LookupError) as exc:
                if not plan.tolerate_errors or stage != "estimate":
                    raise
                out.notes.append(f"{plan.run}: ceiling estimate unavailable: {exc}")
    return out


def run_plan(store, plan: Plan, **kwargs) -> list[str]:
    """:func:`run_plans` on one plan; its notes."""
    return run_plans(store, [plan], **kwargs).notes


def demo_plans(compact: str, companion: str, *, n_bootstrap: int = 200,
               stages: Sequence[str] = STAGES[:-1]) -> list[Plan]:
    """The demo's analysis: the compact run with its companion (every label kind, the cost model on both), and
    the companion's own ceiling."""
    both = ((compact, companion),)
    return [Plan(compact, companion=companion, stages=tuple(stages), n_bootstrap=n_bootstrap,
                 labels=LABEL_KINDS, costmodel_pools=both),
            Plan(companion, mode="cap-accept", stages=("estimate",), n_bootstrap=n_bootstrap)]
