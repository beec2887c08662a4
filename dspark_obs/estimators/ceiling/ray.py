"""The ceiling estimator on Ray: the fit and the chunks on the workers, the driver merges and commits.

On an engine with a pool of actors (:meth:`dspark_obs.ray_engine.RayEngine.pool`), each actor first
reads its share of the fitting sample — a contiguous group of the sample's parts (rid ranges of
about 25k sampled steps) — and keeps it; the driver runs the optimisers and each step asks
the actors for their parts' sums (:mod:`~dspark_obs.estimators.ceiling.fit_parts`), so the fit's
passes over the sample run in parallel and give the local path's numbers.  Then each actor runs
:func:`~dspark_obs.estimators.ceiling.io.estimate_chunks` — the local path's per-chunk function —
over its shard, writes its ``ceiling`` rows as staged part files (invisible to readers) and returns
a :class:`~dspark_obs.estimators.ceiling.partial.RunPartial`.  The driver merges the partials (the
summary's bootstrap included: weights are drawn per request); the censored steps that the validation's
equal-count bins need stay on the actors, which send only their ``mid`` and run order: the driver ranks
them, sends each piece's bins back and adds the actors' sums (``_bin_sums``).  Only when every task
succeeded does it replace the run's results and commit the staged files.  An engine without a pool gets a plan
fitted on the driver and only runs the chunks.
"""

from __future__ import annotations

import functools
import secrets
import threading

import pyarrow as pa

from dspark_obs import sql as sqlmod
from dspark_obs.process_engine import PickledOnce, one_core, unwrapped
from dspark_obs.estimators.ceiling import io as ceiling_io
from dspark_obs.estimators.ceiling import validation as ceiling_validation
from dspark_obs.estimators.ceiling.drafter import import_optimiser
from dspark_obs.estimators.ceiling.fit_parts import map_parts
from dspark_obs.estimators.ceiling.partial import merge_partials
from dspark_obs.estimators.chunks import dealt_groups, split_chunks

__all__ = ["run", "estimate_shard", "fit_on_pool"]


def estimate_shard(root: str, plan: "ceiling_io.RunPlan", chunks: list, *, n_bootstrap: int, seed: int,
                   batch: str | None, keep: str | None = None):
    """One task: estimate ``chunks`` of the run read from ``root``; stage the rows under ``batch``
    (None: return them).  With ``keep``, the censored steps the validation's bins need stay in this
    process (:func:`_bin_sums` adds them up once the driver has ranked them) and the partial carries only
    their ``mid`` and run order."""
    con, store = _worker_connection(root)
    tables = []
    sink = tables.append if batch is None else (lambda t: store.stage("ceiling", plan.run_id, t, batch))
    partial = ceiling_io.estimate_chunks(con, plan, chunks, store.root, n_bootstrap=n_bootstrap, seed=seed, sink=sink)
    if keep is not None:
        if partial.known:   # a worker without censored steps keeps nothing: its share of the bins is none
            _KEPT.setdefault(keep, {}).update((piece["piece"], piece) for piece in partial.known)
        partial.known = [{"mid": p["mid"], "order": p["order"], "piece": p["piece"]} for p in partial.known]
    return partial, tables


_KEPT: dict = {}   # keep -> {piece: censored steps of a chunk}, until the bins' sums are asked for


def _bin_sums(state, keep: str, codes: dict, n_bins: int) -> list:
    """This process's share of the validation's bins: the sums of the steps it kept, binned as the driver
    ranked the whole run's (``codes``: each piece's bins)."""
    pieces, codes = _KEPT.pop(keep, {}), unwrapped(codes)
    return [ceiling_validation.bin_sums(p["lo"], p["mid"], p["hi"], p["truth"], p["emu"], p["greedy"], codes[name], n_bins)
            for name, p in pieces.items() if name in codes]


class _PoolParts:
    """The fit's parts on the pool's actors, in chunk order."""

    def __init__(self, pool):
        self.pool = pool

    def map(self, fn, *args) -> list:
        return [r for per_actor in self.pool.apply(map_parts, fn, *args) for r in per_actor]


def fit_on_pool(pool, root: str, plan: "ceiling_io.RunPlan"):
    """The run's :class:`~dspark_obs.estimators.ceiling.fit.CeilingFit`, its sample held by ``pool``'s actors."""
    groups = split_chunks(plan.rids, plan.counts, ceiling_io.fit_parts_of(plan), len(pool), recut=False)
    groups += [[] for _ in range(len(pool) - len(groups))]
    # This process waits while the actors read the sample: it imports the optimiser then, off the critical path.
    threading.Thread(target=import_optimiser, name="import-optimiser", daemon=True).start()
    shared = PickledOnce(plan)
    pool.load(_load_parts, [(root, shared, group) for group in groups])
    try:
        return ceiling_io.fit_run(_PoolParts(pool), plan.run_id, plan.gamma)
    finally:
        pool.load(_forget, [() for _ in groups])


def run(engine, plan: "ceiling_io.RunPlan", store, *, chunk_rows: int, n_bootstrap: int, seed: int, write: bool,
        progress=None):
    """:func:`~dspark_obs.estimators.ceiling.io.run_local` with the fit and the chunks on ``engine``."""
    engine.start()
    batch = f"ceiling-{secrets.token_hex(6)}" if write else None
    root = str(store.root) if not hasattr(store, "url") else store.url
    pool = engine.pool(init=_one_core) if hasattr(engine, "pool") else None
    calls = [(root, group) for group in dealt_groups(plan.rids, plan.counts, plan.chunks, engine.parallelism())]
    total, done = int(plan.counts.sum()), [0]

    def finished(result) -> None:
        done[0] += result[0].rows
        if progress is not None:
            progress(done[0], total)

    try:
        if plan.model is None:
            plan.model = fit_on_pool(pool, root, plan)
        shared = PickledOnce(plan)   # with its fit
        keep = secrets.token_hex(6) if pool is not None else None   # the bins' steps stay on the pool
        results = (pool or engine).map(_task, [(root, shared, group, n_bootstrap, seed, batch, keep)
                                               for root, group in calls], done=finished)
        partial = merge_partials([p for p, _ in results])
        if keep is not None and partial.known:
            codes, n_bins = partial.bin_codes()
            shares = [b for per_worker in pool.apply(_bin_sums, keep, PickledOnce(codes), n_bins) for b in per_worker]
            partial.bins = sum(shares[1:], shares[0]) if shares else ceiling_validation.no_bin_sums()
        summary, validation, companion = ceiling_io.finish_estimate(plan, partial, n_bootstrap=n_bootstrap)
        if write:
            ceiling_io.replace_results(store, plan.run_id, batch, summary, validation)
            batch = None
    finally:
        if pool is not None:
            pool.close()
        if batch is not None:
            store.discard_staged("ceiling", plan.run_id, batch)
    table = None if write else pa.concat_tables([t for _, ts in results for t in ts]) if results else None
    return ceiling_io.result_of(plan, partial, summary, validation, companion, table=table,
                                store=store if write else None)


def _one_core() -> None:
    """An actor takes one CPU, as a ``--jobs`` worker does."""
    one_core()


def _load_parts(root: str, plan: "ceiling_io.RunPlan", chunks: list) -> list:
    con, store = _worker_connection(root)
    return ceiling_io.load_fit_parts(con, unwrapped(plan), chunks, store.root)


def _worker_connection(root: str):
    """``(connection, Store)`` of ``root`` for a task: one connection per worker process, opened by its first
    task (0.1 CPU s) and refreshed for each later one (the fit's parts, then the chunks)."""
    return sqlmod.connection_and_store(_connection(root))


@functools.lru_cache(maxsize=1)
def _connection(root: str):
    return sqlmod.connect(root)


def _forget() -> None:
    return None


def _task(root, plan, chunks, n_bootstrap, seed, batch, keep):
    return estimate_shard(root, unwrapped(plan), chunks, n_bootstrap=n_bootstrap, seed=seed, batch=batch, keep=keep)
