"""The options every estimator command shares to spread its work (``--engine``, ``--jobs``, Ray's own).

Declared once here and used as the defaults of ``estimate``, ``calibrate`` and
``report``, so the three say the same thing and check it the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import typer

from dspark_obs.console import check_choice, fail

__all__ = ["ENGINE", "RAY_ADDRESS", "RAY_WORKERS", "JOBS", "PRELOAD", "WARM", "DATA_ROOT_HELP", "engine_for",
           "data_root"]

ENGINE = typer.Option("local", "--engine", help="local: this machine (--jobs processes) | ray: the run's chunks (rid "
                      "ranges) split "
                      "into Ray tasks that run the same per-chunk code; same tables (pip install 'dspark-obs[ray]').")
RAY_ADDRESS = typer.Option(None, "--ray-address", help="With --engine ray: the cluster to run on (ray://head:10001, "
                           "or the host:port `ray start --head` printed). Default: a local Ray on this machine.")
RAY_WORKERS = typer.Option(None, "--ray-workers", min=1, help="With --engine ray and no --ray-address: CPUs of "
                           "the local Ray, one task each (default: all cores).")
JOBS = typer.Option(None, "--jobs", "-j", min=1, help="With --engine local: cores to use, one process each, the "
                    "run's chunks split as --engine ray does (--jobs 1: this process alone, on one thread); "
                    "same tables as --jobs 1 (default: all cores).")
PRELOAD = {"estimate": ("dspark_obs.sql", "dspark_obs.estimators.ceiling.ray"),
           "calibrate": ("dspark_obs.sql", "dspark_obs.estimators.calibration.ray")}
PRELOAD["report"] = PRELOAD["estimate"] + PRELOAD["calibrate"][1:]
"""What each command's tasks import: loaded once, before the ``--jobs`` workers fork."""
WARM = {"estimate": ("dspark_obs.estimators.compiled:warm",), "calibrate": ()}
WARM["report"] = WARM["estimate"]
"""What each ``--jobs`` worker runs once it is up, while the command plans (the estimator's compiled loops)."""
DATA_ROOT_HELP = ("Data root of the store: a directory (from `dspark-obs collect` or `demo`) or an object-store URL "
                  "(s3://bucket/prefix?endpoint_override=host:port&scheme=http).")


def engine_for(engine: str, address: Optional[str], workers: Optional[int], jobs: Optional[int] = None,
               preload: tuple = (), ctx: Optional[typer.Context] = None, warm: tuple = ()):
    """The engine the options ask for, started: a :class:`~dspark_obs.ray_engine.RayEngine`, a
    :class:`~dspark_obs.process_engine.ProcessEngine` of ``jobs`` processes (default: all cores; its
    workers fork after importing ``preload``, run ``warm`` while the command goes on, and end when the
    command's ``ctx`` closes), or None for one
    process, which then takes one core until ``ctx`` closes (:func:`~dspark_obs.process_engine.one_core`)."""
    # at call time: the CLI imports this module to declare its options; each engine loads for its command
    from dspark_obs.ray_engine import ENGINES, RayEngine, RayUnavailable

    check_choice("--engine", engine, ENGINES)
    if engine == "local":
        if address is not None or workers is not None:
            fail("--ray-address and --ray-workers need --engine ray")
        # at call time: the CLI imports this module to declare its options; each engine loads for its command
        from dspark_obs.process_engine import ProcessEngine, default_jobs

        jobs = default_jobs() if jobs is None else jobs
        if jobs <= 1:
            # One job, one core: this process, as each of N workers is (DuckDB, BLAS, Arrow on one thread).
            from dspark_obs.process_engine import one_core

            undo = one_core()
            if ctx is not None:   # the command's end restores it (a caller that runs several commands)
                ctx.call_on_close(undo)
            return None
        pool = ProcessEngine(jobs, preload=preload, warm=warm).start()
        if ctx is not None:
            ctx.call_on_close(pool.close)   # the workers end with the command, however it ends
        return pool
    if jobs is not None:
        fail("--jobs sizes the local engine; with --engine ray give --ray-workers (or the cluster's CPUs decide)")
    if address is not None and workers is not None:
        fail("--ray-workers sizes a local Ray; with --ray-address the cluster's CPUs decide: give one")
    try:
        return RayEngine(address=address, workers=workers).start()
    except RayUnavailable as exc:
        fail(str(exc))


def data_root(data: str) -> Union[str, Path]:
    """``--data`` as the store's root: an object-store URL as given, else an existing directory."""
    # at call time: the CLI imports this module to declare its options; each engine loads for its command
    from dspark_obs.store import is_url

    if is_url(data):
        return data
    path = Path(data)
    if not path.is_dir():
        fail(f"--data {data} is not a directory; collect a run first (dspark-obs demo or dspark-obs collect)")
    return path
