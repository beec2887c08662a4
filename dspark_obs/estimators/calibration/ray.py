"""Calibration on Ray: each task sums a group of the run's chunks; the driver merges the sums.

The driver keeps what needs every step at once (the sample behind AUROC and the
bin edges, :class:`~dspark_obs.estimators.calibration.chunks.SampleEdges`); each task gets the edges and
runs :func:`~dspark_obs.estimators.calibration.chunks.accumulate_chunks` — the local path's per-chunk
function — over its shard, returning per (workload, position) sums and their
bootstrap reweightings, which add.
"""

from __future__ import annotations

from dspark_obs import sql as sqlmod
from dspark_obs.process_engine import one_core
from dspark_obs.estimators.calibration import chunks
from dspark_obs.estimators.chunks import dealt_groups

__all__ = ["accumulate"]


def accumulate(engine, con, reads: "chunks.RunReads", *, specs: dict, edges: dict, n_bootstrap: int, seed: int,
               progress=None, total: int = 0):
    """:func:`~dspark_obs.estimators.calibration.chunks.accumulate_chunks` over the whole run, a task per shard."""
    engine.start()
    root = str(sqlmod.root_of(con))
    plan = next(iter(reads.plans.values()))
    groups = dealt_groups(plan.step_rids, plan.step_rows, plan.chunks, engine.parallelism())
    calls = [(root, reads, group, specs, edges, n_bootstrap, seed, sum(c.rows for c in group)) for group in groups]
    done = [0]

    def finished(result) -> None:
        done[0] += result[1]
        if progress is not None:
            progress(done[0], total)

    return chunks.merge_cells([sums for sums, _ in engine.map(_task, calls, done=finished)])


def _task(root, reads, shard_chunks, specs, edges, n_bootstrap, seed, rows):
    one_core()   # a task takes one CPU (num_cpus=1), as a --jobs worker does
    sums = chunks.accumulate_chunks(sqlmod.connect(root), reads, shard_chunks, specs=specs, edges=edges,
                                    n_bootstrap=n_bootstrap, seed=seed)
    return sums, rows
