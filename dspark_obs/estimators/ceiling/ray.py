"""The ceiling estimator on Ray: one task per group of the run's chunks, the driver merges and commits.

Each task runs :func:`~dspark_obs.estimators.ceiling.io.estimate_chunks` — the local path's per-chunk
function — over its shard, writes its ``ceiling`` rows as staged part files
(invisible to readers) and returns a :class:`~dspark_obs.estimators.ceiling.partial.RunPartial`.  The
driver merges the partials (the summary's bootstrap included: weights are drawn
per request) and, only when every task succeeded, replaces the run's results
and commits the staged files.
"""

from __future__ import annotations

import secrets

import pyarrow as pa

from dspark_obs import sql as sqlmod
from dspark_obs.estimators.ceiling import io as ceiling_io
from dspark_obs.estimators.ceiling.partial import merge_partials
from dspark_obs.estimators.chunks import split_chunks

__all__ = ["run", "estimate_shard"]


def estimate_shard(root: str, plan: "ceiling_io.RunPlan", chunks: list, *, n_bootstrap: int, seed: int,
                   batch: str | None):
    """One task: estimate ``chunks`` of the run read from ``root``; stage the rows under ``batch``
    (None: return them)."""
    con, store = sqlmod.connection_and_store(root)
    tables = []
    sink = tables.append if batch is None else (lambda t: store.stage("ceiling", plan.run_id, t, batch))
    partial = ceiling_io.estimate_chunks(con, plan, chunks, store.root, n_bootstrap=n_bootstrap, seed=seed, sink=sink)
    return partial, tables


def run(engine, plan: "ceiling_io.RunPlan", store, *, chunk_rows: int, n_bootstrap: int, seed: int, write: bool,
        progress=None):
    """:func:`~dspark_obs.estimators.ceiling.io.run_local` with the chunks on ``engine``."""
    engine.start()
    batch = f"ceiling-{secrets.token_hex(6)}" if write else None
    root = str(store.root) if not hasattr(store, "url") else store.url
    calls = [(root, plan, group) for group in split_chunks(plan.rids, plan.counts, plan.chunks, engine.parallelism())]
    total, done = int(plan.counts.sum()), [0]

    def finished(result) -> None:
        done[0] += result[0].rows
        if progress is not None:
            progress(done[0], total)

    try:
        results = engine.map(_task, [(*c, n_bootstrap, seed, batch) for c in calls], done=finished)
        partial = merge_partials([p for p, _ in results])
        summary, validation, companion = ceiling_io.finish_estimate(plan, partial, n_bootstrap=n_bootstrap)
        if write:
            ceiling_io.replace_results(store, plan.run_id, batch, summary, validation)
            batch = None
    finally:
        if batch is not None:
            store.discard_staged("ceiling", plan.run_id, batch)
    table = None if write else pa.concat_tables([t for _, ts in results for t in ts]) if results else None
    return ceiling_io.result_of(plan, partial, summary, validation, companion, table=table,
                                store=store if write else None)


def _task(root, plan, chunks, n_bootstrap, seed, batch):
    return estimate_shard(root, plan, chunks, n_bootstrap=n_bootstrap, seed=seed, batch=batch)
