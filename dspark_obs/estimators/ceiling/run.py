"""One run's ceiling estimate, end to end: plan, then the chunks here or on an engine.

:func:`estimate_run` is the estimator's entry point (``dspark-obs estimate``);
the chunks run in this process (:func:`~dspark_obs.estimators.ceiling.io.run_local`)
or as tasks of an engine (:mod:`~dspark_obs.estimators.ceiling.ray`).
"""

from __future__ import annotations

from typing import Callable

import pyarrow as pa

from dspark_obs import sql as sqlmod
from dspark_obs.estimators import sampling
from dspark_obs.estimators.ceiling import ray as ceiling_ray
from dspark_obs.estimators.ceiling.estimate import Method
from dspark_obs.estimators.ceiling.fit import CeilingFit
from dspark_obs.estimators.ceiling.io import CeilingRun, plan_estimate, run_local
from dspark_obs.estimators.chunks import DEFAULT_CHUNK_ROWS, DEFAULT_FIT_ROWS

__all__ = ["estimate_run", "run_estimate"]


def run_estimate(con_or_store, run_id: str, *, companion, method, sglang_logprobs, n_bootstrap: int,
                 seed: int, write: bool, chunk_rows: int = DEFAULT_CHUNK_ROWS, fit_rows: int = DEFAULT_FIT_ROWS,
                 progress: Callable[[int, int], None] | None = None, temperature: float | None = None,
                 alpha: float = sampling.DEFAULT_ALPHA, engine=None, fit: CeilingFit | None = None) -> CeilingRun:
    """The estimate of one run, locally or (``engine``, a :class:`dspark_obs.ray_engine.RayEngine`) on Ray;
    with ``fit`` (from an earlier run of the same deployment) instead of fitting on this run."""
    con, store = sqlmod.connection_and_store(con_or_store)
    plan = plan_estimate(con, run_id, store.root, companion=companion, method=method, sglang_logprobs=sglang_logprobs,
                         chunk_rows=chunk_rows, fit_rows=fit_rows, temperature=temperature, alpha=alpha,
                         fit=not hasattr(engine, "pool"), given=fit)   # an engine with a pool fits on its workers
    if engine is not None and len(plan.chunks) < getattr(engine, "min_chunks", 0):
        engine = None   # a run of one chunk: this process, its one-pass figures
    if engine is not None:
        return ceiling_ray.run(engine, plan, store, chunk_rows=chunk_rows, n_bootstrap=n_bootstrap, seed=seed,
                               write=write, progress=progress)
    return run_local(con, plan, store, n_bootstrap=n_bootstrap, seed=seed, write=write, progress=progress)


def estimate_run(con_or_store, run_id: str, *, companion: str | None = None, method: Method = "default",
                 sglang_logprobs: pa.Table | None = None, n_bootstrap: int = 1000, seed: int = 0,
                 write: bool = True, chunk_rows: int | None = None, fit_rows: int | None = None,
                 progress=None, temperature: float | None = None, alpha: float | None = None,
                 engine=None, fit=None) -> CeilingRun:
    """Estimate the ceiling of every request-step of ``run_id`` and write the result tables.

    ``con_or_store`` is a connection from :func:`dspark_obs.sql.connect` or a
    :class:`~dspark_obs.store.Store`.  ``companion`` is the cap-accept run to
    validate against (default: the run recorded as this run's companion);
    a cap-accept or static run validates against its own steps, an emulator run
    also against ``emu_*``.  ``sglang_logprobs`` is
    :func:`~dspark_obs.estimators.ceiling.jsonl.logprobs_from_sglang_jsonl`'s
    table (exact ``a_k`` for the steps it covers).  With ``write=True`` the run's
    ``ceiling``, ``ceiling_summary`` and ``ceiling_validation`` partitions are
    replaced.  Raises ValueError / LookupError with the fix in the message.

    Memory follows ``chunk_rows``, not the run: requests are estimated a chunk of
    whole requests (about ``chunk_rows`` steps, default 150k) at a time, and the
    per-step results go to the store chunk by chunk.  Every per-step value is
    what one pass over the whole run gives, and so are the summary and its
    bootstrap (accumulated from per-request totals) and the validation (its rows
    but the equal-count bins are summed chunk by chunk, so their means may differ
    from one pass in the last digits).  One exception, for runs of more than ``fit_rows``
    steps (default 200k): the acceptance model behind ``mid`` (the temperature
    drafts, and the unverifiable tail of a step whose output ran out) and the
    stand-in ``a_k`` of ``method="sglang"`` where a confidence is missing is
    fitted on a sample of blocks of whole requests chosen by a hash of their rid
    (:func:`~dspark_obs.estimators.chunks.sample_requests`; the same sample for the
    same run), not on every verified draft.  The
    categories and greedy ``lo``/``mid``/``hi`` do not depend on the fit.
    ``progress(done_steps, total_steps)`` is called after each chunk.

    Sampling per request (:mod:`~dspark_obs.estimators.sampling`): the recorded
    temperature, else ``temperature`` (an override for requests that recorded
    none), else inferred from the committed tokens with false-greedy rate at
    most ``alpha``; the ``ceiling`` rows say which (``sampling_source``).

    ``engine`` (a :class:`dspark_obs.ray_engine.RayEngine`) runs the chunks as
    Ray tasks over shards of requests by rid hash: the same per-step rows, and the
    same summary and validation up to the order of float additions.

    ``fit`` (a :class:`~dspark_obs.estimators.ceiling.fit.CeilingFit`, e.g.
    from ``estimate --fit-out`` of an earlier run of the same deployment) is
    used instead of fitting on this run: the numbers the sidecar's live ceiling
    used.  The result's ``fit`` is the one used either way.
    """
    return run_estimate(con_or_store, run_id, companion=companion, method=method,
                        sglang_logprobs=sglang_logprobs, n_bootstrap=n_bootstrap, seed=seed, write=write,
                        chunk_rows=chunk_rows or DEFAULT_CHUNK_ROWS, fit_rows=fit_rows or DEFAULT_FIT_ROWS,
                        progress=progress, temperature=temperature,
                        alpha=sampling.DEFAULT_ALPHA if alpha is None else alpha, engine=engine, fit=fit)
