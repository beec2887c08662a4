"""``--jobs N``: the estimators' shards on N processes of this machine, through the Ray engine's path.

:class:`ProcessEngine` has :class:`~dspark_obs.ray_engine.RayEngine`'s interface
(``start``, ``parallelism``, ``map``), so ``estimate``, ``calibrate`` and
``report`` split a run's chunks into contiguous groups
(:func:`~dspark_obs.estimators.chunks.split_chunks`), run the local per-chunk function
on each and merge the partial results exactly as on Ray (bootstrap weights are
drawn per request, so the split does not change a CI).  The pool forks its
workers in :meth:`ProcessEngine.start`, before the command opens DuckDB, after
importing the modules the tasks run, so a worker starts with nothing to import;
a process that has already loaded DuckDB (a library caller, a test session)
spawns them instead — a forked child would inherit the database's threads
mid-flight.  A run that
fits in one chunk gains nothing from processes and runs in this one
(``min_chunks``), where it gets the one-pass figures.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import os
import sys
import types
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable

from dspark_obs import sql

__all__ = ["ProcessEngine", "default_jobs"]


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _ready() -> int:
    return os.getpid()


def _worker_init() -> None:
    """A worker's DuckDB takes one core: its siblings have the others."""

    sql.WORKER_THREADS = 1


@dataclass
class ProcessEngine:
    """``jobs`` worker processes on this machine; ``preload``: modules imported before they fork."""

    jobs: int
    preload: tuple = ()
    min_chunks: int = 2             # runs of fewer chunks stay in this process (their one-pass figures)
    _pool: ProcessPoolExecutor | None = field(default=None, repr=False)

    def start(self) -> "ProcessEngine":
        if self._pool is not None:
            return self
        # Fork (workers that start with the modules loaded) only before this process has used DuckDB, whose
        # threads a forked child would inherit mid-flight; else spawn fresh interpreters.
        fork = "fork" in multiprocessing.get_all_start_methods() and "duckdb" not in sys.modules
        for name in self.preload if fork else ():
            importlib.import_module(name)
        context = multiprocessing.get_context("fork" if fork else "spawn")
        main = sys.modules.get("__main__")
        if not fork:  # a spawned worker re-runs the caller's __main__ (e.g. a Streamlit script): give it none
            sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=context, initializer=_worker_init)
            futures = [self._pool.submit(_ready) for _ in range(self.jobs)]   # start every worker now
        finally:
            if main is not None:
                sys.modules["__main__"] = main
        for f in futures:
            f.result()
        atexit.register(self.close)   # the workers end (and are waited for) with the command
        return self

    def parallelism(self) -> int:
        return self.jobs

    def map(self, fn: Callable, calls: list[tuple], *, done: Callable[[object], None] | None = None) -> list:
        """``[fn(*call) for call in calls]`` on the workers, results in call order; ``done(result)`` as each ends."""
        pool = self.start()._pool
        futures = [pool.submit(fn, *call) for call in calls]
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    result = f.result()
                    if done is not None:
                        done(result)
        except BaseException:
            for f in pending:
                f.cancel()
            raise
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __del__(self) -> None:
        pool = self.__dict__.get("_pool")
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
