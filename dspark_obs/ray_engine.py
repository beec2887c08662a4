"""``--engine ray``: the estimators' chunks as Ray tasks, no scheduler of our own.

The driver plans a run (its requests, the fitted models), deals its chunks — the
local path's contiguous rid ranges — in turn to one group per task
(:func:`~dspark_obs.estimators.chunks.dealt_groups`), and maps one task per group.  Each task runs the very per-chunk function of the
local path over its shard, reads the store itself (a local path every worker
sees, or an ``s3://`` URL) and returns small sufficient statistics; the driver
merges them and commits the result files.  Ray is an optional extra::

    pip install 'dspark-obs[ray]'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["RayEngine", "RayPool", "RayUnavailable", "INSTALL_HINT", "ENGINES"]

INSTALL_HINT = "pip install 'dspark-obs[ray]'"
ENGINES = ("local", "ray")


class RayUnavailable(RuntimeError):
    """``--engine ray`` without Ray installed, or a cluster that cannot be reached."""


def _ray():
    try:
        # at call time: ray is the optional [ray] extra
        import ray
    except ImportError:
        raise RayUnavailable(f"--engine ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


@dataclass
class RayEngine:
    """Where the tasks run: a cluster at ``address`` (``ray://host:10001`` or ``host:6379``), else a
    local Ray started for this process with ``workers`` CPUs (default: all)."""

    address: str | None = None
    workers: int | None = None
    tasks: int | None = None       # shards per run; default: the cluster's CPUs

    def start(self) -> "RayEngine":
        ray = _ray()
        if ray.is_initialized():
            return self
        kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        try:
            if self.address:
                ray.init(address=self.address, **kwargs)
            else:
                ray.init(num_cpus=self.workers, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = self.address or "a local Ray"
            raise RayUnavailable(f"cannot start or reach {where}: {exc}; check --ray-address "
                                 "(e.g. ray://head:10001, or the address `ray start --head` printed)") from None
        return self

    def parallelism(self) -> int:
        """Shards per run: ``tasks``, else the CPUs of the cluster."""
        if self.tasks:
            return int(self.tasks)
        return max(1, int(_ray().cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable, calls: list[tuple], *, done: Callable[[object], None] | None = None) -> list:
        """``[fn(*call) for call in calls]`` as Ray tasks, results in call order; ``done(result)`` as each ends."""
        ray = self.start() and _ray()
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        return _gather(ray, [remote.remote(*call) for call in calls], done)

    def pool(self, size: int | None = None, *, init: Callable[[], None] | None = None) -> "RayPool":
        """``size`` Ray actors (default: :meth:`parallelism`), one CPU each, that keep what they loaded
        between calls; ``init()`` runs in each as it starts."""
        ray = self.start() and _ray()
        return RayPool(ray, size or self.parallelism(), init)


def _gather(ray, refs: list, done: Callable[[object], None] | None) -> list:
    results, pending = {}, list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            results[ref] = ray.get(ref)
            if done is not None:
                done(results[ref])
    return [results[ref] for ref in refs]


class _Holder:
    """A Ray actor's state: what ``load`` returned, passed to every ``apply``."""

    def __init__(self, init: Callable[[], None] | None):
        self.state = None
        if init is not None:
            init()

    def load(self, fn: Callable, *args) -> None:
        self.state = fn(*args)

    def apply(self, fn: Callable, *args):
        return fn(self.state, *args)

    def call(self, fn: Callable, *args):
        return fn(*args)


class RayPool:
    """Actors that hold data between calls: a fit's parts stay on the worker that read them, and each
    optimiser step sends coefficients out and gets sums back (:meth:`apply`)."""

    def __init__(self, ray, size: int, init: Callable[[], None] | None):
        self._ray = ray
        holder = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_Holder)
        self.actors = [holder.remote(init) for _ in range(size)]

    def __len__(self) -> int:
        return len(self.actors)

    def load(self, fn: Callable, calls: list[tuple]) -> None:
        """Actor ``i`` keeps ``fn(*calls[i])`` (one call per actor)."""
        if len(calls) != len(self.actors):
            raise ValueError(f"{len(calls)} calls for {len(self.actors)} actors: give one per actor")
        self._ray.get([a.load.remote(fn, *call) for a, call in zip(self.actors, calls)])

    def apply(self, fn: Callable, *args) -> list:
        """``[fn(state, *args) for each actor's state]``, in actor order."""
        return self._ray.get([a.apply.remote(fn, *args) for a in self.actors])

    def map(self, fn: Callable, calls: list[tuple], *, done: Callable[[object], None] | None = None) -> list:
        """:meth:`RayEngine.map` on the actors (call ``i`` on actor ``i`` modulo their number)."""
        refs = [self.actors[i % len(self.actors)].call.remote(fn, *call) for i, call in enumerate(calls)]
        return _gather(self._ray, refs, done)

    def close(self) -> None:
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []
