"""``--jobs N``: the estimators' shards on N processes of this machine, through the Ray engine's path.

:class:`ProcessEngine` has :class:`~dspark_obs.ray_engine.RayEngine`'s interface
(``start``, ``parallelism``, ``map``, ``pool``), so ``estimate``, ``calibrate`` and
``report`` deal a run's chunks to N groups in turn
(:func:`~dspark_obs.estimators.chunks.dealt_groups`), run the local per-chunk function
on each and merge the partial results exactly as on Ray (bootstrap weights are
drawn per request, so the split does not change a CI).  Its workers are long-lived
processes, each on its own pipe, so that like Ray's actors they can keep what they
read between calls (:meth:`ProcessEngine.pool`): the ceiling's fit runs on them,
each worker holding its part of the fitting sample, instead of on the command's
process while the workers wait (a process-pool executor cannot send a call to the
worker that holds the data, hence no ``concurrent.futures``).

The workers fork in :meth:`ProcessEngine.start`, before the command opens DuckDB,
after importing the modules the tasks run, so a worker starts with nothing to
import; a process that has already opened a DuckDB database through the package
(:func:`dspark_obs.sql.open_database`: a library caller, a test session) spawns them
instead — a forked child would inherit the database's threads mid-flight.  (Until
2026-12-06 the test was whether DuckDB was *imported*, which every command does
first: the commands' workers were always spawned, each importing the package again,
and the first task waited ~0.6 s for it.)  Once up, each worker runs the command's ``warm`` calls
(the estimator's compiled code, ~0.5 s to load in a process) while the command plans; their replies are
dropped.  A run that fits in one chunk gains nothing from processes
and runs in this one (``min_chunks``), where it gets the one-pass figures.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import os
import pickle
import sys
import traceback
import types
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Callable

import pyarrow as pa

from dspark_obs import sql

__all__ = ["ProcessEngine", "WorkerPool", "PickledOnce", "unwrapped", "default_jobs", "one_core"]


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def one_core() -> Callable[[], None]:
    """This process on one core, as a ``--jobs`` worker, a Ray task and ``--jobs 1`` run: DuckDB connections
    it opens from now on, BLAS and Arrow's pool each on one thread.  Returns what undoes it.

    A second thread per process only oversubscribes the cores its siblings hold (calibrate's bootstrap
    products kept 1.35 cores busy in one process through OpenBLAS alone).
    """
    from threadpoolctl import threadpool_limits  # at call time: it inspects the loaded BLAS libraries

    threads, arrow = sql.WORKER_THREADS, pa.cpu_count()
    sql.WORKER_THREADS = 1
    pa.set_cpu_count(1)
    blas = threadpool_limits(limits=1, user_api="blas")

    def undo() -> None:
        sql.WORKER_THREADS = threads
        pa.set_cpu_count(arrow)
        blas.restore_original_limits()

    return undo


class PickledOnce:
    """An argument of every worker's call (a run's plan: tens of MB), pickled once however many get it; each
    worker unpickles the value itself."""

    def __init__(self, value) -> None:
        self.value, self._pickled = value, None

    def __reduce__(self):
        if self._pickled is None:
            self._pickled = pickle.dumps(self.value, protocol=pickle.HIGHEST_PROTOCOL)
        return pickle.loads, (self._pickled,)


def unwrapped(value):
    """``value``, or what it holds if it is a :class:`PickledOnce` that reached its task unpickled (an engine
    that runs the calls in its own process)."""
    return value.value if isinstance(value, PickledOnce) else value


def _serve(conn) -> None:
    """A worker: run each ``(kind, fn, args)`` it is sent and send back ``(ok, value, traceback)``.

    ``load`` keeps ``fn(*args)`` as the worker's state, ``apply`` runs ``fn(state, *args)``, ``call``
    runs ``fn(*args)``; ``None`` (or the command's end) stops it.  It takes one core (:func:`one_core`): its
    siblings have the others.
    """
    one_core()
    state = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        kind, fn, args = message
        try:
            if kind == "load":
                state, value = fn(*args), None
            else:
                value = fn(state, *args) if kind == "apply" else fn(*args)
            reply = (True, value, "")
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller, with its traceback
            reply = (False, exc, traceback.format_exc())
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - a value or an error that does not pickle
            conn.send((False, RuntimeError(f"the worker's reply could not be sent back: {exc!r}"),
                       traceback.format_exc()))


class _Worker:
    """One worker process and the command's end of its pipe."""

    def __init__(self, context) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.unanswered = 0   # calls sent with no one waiting for their reply (warm-ups)

    def send(self, kind: str, fn: Callable, args: tuple) -> None:
        self.conn.send((kind, fn, args))

    def send_unawaited(self, fn: Callable) -> None:
        """Run ``fn()`` before the next call; its reply (or its error) is dropped when that call's comes."""
        self.send("call", fn, ())
        self.unanswered += 1

    def drop_reply(self) -> None:
        """Receive the reply of an unawaited call, and drop it."""
        self.conn.recv()
        self.unanswered -= 1

    def result(self):
        """The reply to the last message sent; the worker's error raised here, its traceback as a note."""
        try:
            while self.unanswered:
                self.drop_reply()
            ok, value, trace = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            raise ChildProcessError(f"worker process {self.process.pid} died (exit code {self.process.exitcode}); "
                                    "out of memory? try fewer --jobs") from None
        if not ok:
            if trace and isinstance(value, BaseException):
                value.add_note(f"in worker process {self.process.pid}:\n{trace}")
            raise value
        return value

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        self.conn.close()


def _each(workers: list[_Worker], kind: str, fn: Callable, calls: list[tuple]) -> list:
    """Worker ``i`` runs ``calls[i]``; the replies in order (every worker is waited for, even after an error)."""
    for w, call in zip(workers, calls):
        w.send(kind, fn, call)
    results, error = [], None
    for w in workers[:len(calls)]:
        try:
            results.append(w.result())
        except BaseException as exc:  # noqa: BLE001 - raised once every worker has answered
            error = error or exc
    if error is not None:
        raise error
    return results


def _dispatch(workers: list[_Worker], fn: Callable, calls: list[tuple], done: Callable | None) -> list:
    """``[fn(*call) for call in calls]``, each call to the next free worker; results in call order."""
    results: list = [None] * len(calls)
    todo = iter(enumerate(calls))
    busy: dict = {}
    error = None

    def give(w: _Worker) -> None:
        for i, call in todo:
            w.send("call", fn, call)
            busy[w.conn] = (w, i)
            return

    for w in workers:
        give(w)
    while busy:
        for conn in wait(list(busy)):
            w, i = busy[conn]
            if w.unanswered:   # a warm-up's reply: the call's is still to come
                try:
                    w.drop_reply()
                except (EOFError, OSError):
                    pass   # the worker died: result() below says so
                else:
                    continue
            del busy[conn]
            try:
                results[i] = w.result()
            except BaseException as exc:  # noqa: BLE001 - the running calls finish before it is raised
                error = error or exc
                continue
            if error is None:
                if done is not None:
                    done(results[i])
                give(w)
    if error is not None:
        raise error
    return results


class WorkerPool:
    """The engine's workers as holders of data (:class:`~dspark_obs.ray_engine.RayPool`'s interface): a fit's
    parts stay on the worker that read them, and each optimiser step sends coefficients out and gets sums
    back (:meth:`apply`)."""

    def __init__(self, workers: list[_Worker]) -> None:
        self.workers = workers

    def __len__(self) -> int:
        return len(self.workers)

    def load(self, fn: Callable, calls: list[tuple]) -> None:
        """Worker ``i`` keeps ``fn(*calls[i])`` (one call per worker)."""
        if len(calls) != len(self.workers):
            raise ValueError(f"{len(calls)} calls for {len(self.workers)} workers: give one per worker")
        _each(self.workers, "load", fn, calls)

    def apply(self, fn: Callable, *args) -> list:
        """``[fn(state, *args) for each worker's state]``, in worker order."""
        return _each(self.workers, "apply", fn, [args] * len(self.workers))

    def map(self, fn: Callable, calls: list[tuple], *, done: Callable[[object], None] | None = None) -> list:
        """:meth:`ProcessEngine.map` on these workers."""
        return _dispatch(self.workers, fn, calls, done)

    def close(self) -> None:
        """Drop what the workers hold; the workers stay the engine's."""
        _each(self.workers, "load", _nothing, [()] * len(self.workers))


def _nothing() -> None:
    return None


@dataclass
class ProcessEngine:
    """``jobs`` worker processes on this machine; ``preload``: modules imported before they fork."""

    jobs: int
    preload: tuple = ()
    warm: tuple = ()                # "module:function"s each worker runs once it is up, while the command goes on
    min_chunks: int = 2             # runs of fewer chunks stay in this process (their one-pass figures)
    start_method: str | None = None  # how its workers started: fork (modules loaded) or spawn
    _workers: list | None = field(default=None, repr=False)

    def start(self) -> "ProcessEngine":
        if self._workers is not None:
            return self
        # Fork (workers that start with the modules loaded) only before this process has opened a DuckDB
        # database, whose threads a forked child would inherit mid-flight; else spawn fresh interpreters.
        # (Importing DuckDB starts no thread: the commands import it before they start their workers.)
        fork = "fork" in multiprocessing.get_all_start_methods() and not sql.database_opened()
        self.start_method = "fork" if fork else "spawn"
        for name in self.preload if fork else ():
            importlib.import_module(name)
        context = multiprocessing.get_context("fork" if fork else "spawn")
        main = sys.modules.get("__main__")
        if not fork:  # a spawned worker re-runs the caller's __main__ (e.g. a Streamlit script): give it none
            sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            workers = [_Worker(context) for _ in range(self.jobs)]
        finally:
            if main is not None:
                sys.modules["__main__"] = main
        self._workers = workers
        _each(workers, "call", os.getpid, [()] * len(workers))   # every worker up before the command goes on
        for name in self.warm:
            module, function = name.split(":")
            for w in workers:
                w.send_unawaited(getattr(importlib.import_module(module), function))
        atexit.register(self.close)   # the workers end (and are waited for) with the command
        return self

    def parallelism(self) -> int:
        return self.jobs

    def map(self, fn: Callable, calls: list[tuple], *, done: Callable[[object], None] | None = None) -> list:
        """``[fn(*call) for call in calls]`` on the workers, results in call order; ``done(result)`` as each ends."""
        return _dispatch(self.start()._workers, fn, calls, done)

    def pool(self, size: int | None = None, *, init: Callable[[], None] | None = None) -> WorkerPool:
        """The first ``size`` workers (default: all) as a :class:`WorkerPool`; ``init()`` runs in each."""
        workers = self.start()._workers[:size or self.jobs]
        if init is not None:
            _each(workers, "call", init, [()] * len(workers))
        return WorkerPool(workers)

    def close(self) -> None:
        workers, self._workers = self._workers, None
        for w in workers or ():
            w.stop()

    def __del__(self) -> None:
        workers = self.__dict__.get("_workers")
        for w in workers or ():
            if w.process.is_alive():
                w.process.terminate()
