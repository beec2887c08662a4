"""``--engine ray``: the estimators' chunks as Ray tasks, no scheduler of our own.

The driver plans a run (its requests, the fitted models), splits its chunks — the
local path's contiguous rid ranges — into one contiguous group per task
(:func:`~dspark_obs.estimators.chunks.split_chunks`), and maps one task per group.  Each task runs the very per-chunk function of the
local path over its shard, reads the store itself (a local path every worker
sees, or an ``s3://`` URL) and returns small sufficient statistics; the driver
merges them and commits the result files.  Ray is an optional extra::

    pip install 'dspark-obs[ray]'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["RayEngine", "RayUnavailable", "INSTALL_HINT", "ENGINES"]

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
        refs = [remote.remote(*call) for call in calls]
        results, pending = {}, list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                results[ref] = ray.get(ref)
                if done is not None:
                    done(results[ref])
        return [results[ref] for ref in refs]
