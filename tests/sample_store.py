"""A small store with every table the dashboard reads, for UI tests and screenshots (a test fixture).

Like ``dspark-obs demo`` but smaller and with the estimator tables filled: a
compact run and its cap-accept companion collected from the embedded emulator
(temperature sampling, three workloads), then ``ceiling``, ``calibration``
(all label kinds), held-out ``recalibration``, ``costmodel`` results and a stored STS fit written as
the CLI commands would; the estimator stages run through :mod:`dspark_obs.pipeline`, as the demo's do.
About 15-30 s on two cores.

    PYTHONPATH=. python tests/sample_store.py /tmp/ui-sample
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["SAMPLE_RUNS", "SAMPLE_SWEEP", "build_sample_store"]

SAMPLE_RUNS = {"compact": "sample-compact", "cap-accept": "sample-cap-accept"}
SAMPLE_SWEEP = "sample-sweep"
_DONE = ".sample-complete"


def build_sample_store(root: str | Path, *, requests: int = 36, concurrency: int = 12, max_new_tokens: int = 160,
                       seed: int = 0, bootstrap: int = 50, sweep: bool = False, report: bool = False) -> Path:
    """Collect the sample runs into ``root`` and fill the estimator tables; returns ``root``.

    ``sweep`` adds a small concurrency sweep of the four methods (every page then
    has its figures, Fig. 1 and Fig. 3 included); ``report`` writes a report so
    the Overview shows verdicts.  A root that already holds a complete sample
    is returned as is (the marker file ``.sample-complete`` is written last).
    """
    from collectors.sglang.driver import DriveSpec
    from collectors.sglang.session import CollectOptions, collect
    from dspark_obs import pipeline, sql
    from dspark_obs.emulator.engine import EngineConfig
    from dspark_obs.emulator.server import BackgroundServer
    from dspark_obs.estimators.calibration import recalibration
    from dspark_obs.store import Store

    root = Path(root)
    if (root / _DONE).exists():
        return root
    store = Store(root)
    spec = DriveSpec(["gsm8k", "arena-hard", "poetry"], requests, concurrency=concurrency, temperature=0.7,
                     max_new_tokens=max_new_tokens, seed=seed)
    for mode, run_id in SAMPLE_RUNS.items():
        for table in store.tables():
            store.drop_run(table, run_id)
        with BackgroundServer(EngineConfig(mode=mode, seed=seed)) as server:
            collect(store, CollectOptions(
                url=server.url, run_id=run_id, poll_interval=0.1, flush_interval=1.0, drive=spec,
                labels={"sample": "1", "method": mode},
                companion_of=SAMPLE_RUNS["compact"] if mode == "cap-accept" else None))
    compact, companion = SAMPLE_RUNS["compact"], SAMPLE_RUNS["cap-accept"]
    pipeline.run_plans(store, [
        pipeline.Plan(compact, labels=pipeline.LABEL_KINDS, n_bootstrap=bootstrap,
                      costmodel_pools=((compact, companion),), stages=("estimate", "calibrate", "costmodel")),
        pipeline.Plan(companion, mode="cap-accept", n_bootstrap=bootstrap, stages=("calibrate",))])
    con = sql.connect(root, read_only=False)
    recalibration.recalibrate_run(con, compact, labels="companion", n_bootstrap=min(bootstrap, 50))
    _store_sts(store, con, compact)
    if sweep:
        from dspark_obs import sweep as sweep_mod

        sweep_mod.run_sweep(store, sweep_mod.SweepOptions.quick(
            SAMPLE_SWEEP, concurrency=(1, 2, 4, 8, 16, 32), min_requests=4, requests_per_slot=1,
            max_new_tokens=32, seed=seed))
    if report:
        from dspark_obs.report import figures_stage

        pipeline.run_plans(store, [pipeline.Plan(compact, stages=("figures",), n_bootstrap=bootstrap,
                                                 report={"png": False})], figures=figures_stage)
    (root / _DONE).write_text("ok\n")
    return root


def _store_sts(store, con, run_id: str) -> None:
    """An STS fit on the companion labels, stored as `dspark-obs ingest --sts` would store its file."""
    import datetime as dt

    from dspark_obs.estimators.calibration import sts

    fit = sts.fit_sts_run(con, run_id, labels="companion", dataset=f"dspark-obs:{run_id}:labels=companion")
    cal = fit.to_sglang()
    store.write("sts_calibrations", run_id, [{
        "path": f"sts-{run_id}.json", "temperatures": cal.temperatures, "dataset": cal.dataset,
        "num_samples": cal.num_samples, "ece_before": cal.ece_before, "ece_after": cal.ece_after,
        "raw_json": cal.to_json(), "imported_at": dt.datetime.now(dt.timezone.utc)}])


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--full"]):
        sys.exit("usage: PYTHONPATH=. python tests/sample_store.py OUT_DIR [--full]   (--full: with a sweep and a report)")
    full = sys.argv[2:] == ["--full"]
    print(build_sample_store(sys.argv[1], sweep=full, report=full))
