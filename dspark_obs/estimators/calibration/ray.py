"""Calibration on Ray: each task sums a shard of the run's requests; the driver merges the sums.

The driver keeps what needs every step at once (the sample behind AUROC and the
bin edges, :class:`~dspark_obs.estimators.calibration.chunks.SampleEdges`); each task gets the edges and
runs :func:`~dspark_obs.estimators.calibration.chunks.accumulate_chunks` — the local path's per-chunk
function — over its shard, returning per (workload, position) sums and their
bootstrap reweightings, which add.
"""

from __future__ import annotations

from dspark_obs import sql as sqlmod
from dspark_obs.estimators.calibration import chunks
from dspark_obs.estimators.chunks import plan_chunks, shard_requests

__all__ = ["accumulate"]


def accumulate(engine, con, plan: "chunks.RunPlan", run_id: str, *, labels: str, specs: dict,
               edges: "chunks.BinEdges", n_bootstrap: int, seed: int, progress=None, total: int = 0):
    """:func:`~dspark_obs.estimators.calibration.chunks.accumulate_chunks` over the whole run, a task per shard."""
    engine.start()
    root = str(sqlmod.root_of(con))
    chunk_rows = max(c.rows for c in plan.chunks) if plan.chunks else 1
    shards = [s for s in shard_requests(plan.step_rids, plan.step_rows, engine.parallelism()) if s[0]]
    calls = [(root, plan, run_id, plan_chunks(rids, rows, chunk_rows=max(1, chunk_rows), listed=True), labels,
              specs, edges, n_bootstrap, seed, int(rows.sum())) for rids, rows in shards]
    done = [0]

    def finished(result) -> None:
        done[0] += result[2]
        if progress is not None:
            progress(done[0], total)

    return chunks.merge_cells([(c, n) for c, n, _ in engine.map(_task, calls, done=finished)])


def _task(root, plan, run_id, shard_chunks, labels, specs, edges, n_bootstrap, seed, rows):
    cells, counts = chunks.accumulate_chunks(sqlmod.connect(root), plan, run_id, shard_chunks, labels=labels,
                                             specs=specs, edges=edges, n_bootstrap=n_bootstrap, seed=seed)
    return cells, counts, rows
