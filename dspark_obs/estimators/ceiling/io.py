"""The run side of the ceiling estimator: plan a run's chunks, estimate them, write the results.

:mod:`~dspark_obs.estimators.ceiling.inputs` reads a chunk's arrays, the pure
functions estimate it, and the run's partitions of ``ceiling``,
``ceiling_summary`` and ``ceiling_validation`` are replaced once every chunk
succeeded.  The entry point is :func:`~dspark_obs.estimators.ceiling.run.estimate_run`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa

from dspark_obs import schema
from dspark_obs.estimators import pairing, sampling
from dspark_obs.estimators.ceiling import validation as ceiling_validation
from dspark_obs.estimators.ceiling.drafter import fit_drafter_parts
from dspark_obs.estimators.ceiling.estimate import drafter_explains_better_parts, estimate_ceiling
from dspark_obs.estimators.ceiling.fit import CeilingFit
from dspark_obs.estimators.ceiling.fit_parts import FitPart, LocalParts, Parts
from dspark_obs.estimators.ceiling.inputs import (
    ChunkInputs,
    InferredSampling,
    check_alignment_share,
    column_array,
    infer_sampling,
    load_inputs,
    run_gamma,
    run_meta,
    run_rids,
    sglang_arrays,
    truth_of,
)
from dspark_obs.estimators.ceiling.partial import RunPartial, RunTotals, rid_positions, workload_codes
from dspark_obs.estimators.ceiling.prior import fit_acceptance_parts, fit_binned_parts
from dspark_obs.estimators.ceiling.walk import CATEGORIES
from dspark_obs.estimators.run_requests import RunRequests
from dspark_obs.estimators.chunks import Chunk, plan_chunks, sample_parts, sample_requests
from dspark_obs.store import validate_run_id

__all__ = ["CeilingRun", "RunPlan", "plan_estimate", "fit_run", "load_fit_parts", "fit_parts_of", "estimate_chunks", "finish_estimate", "run_local", "result_of",
           "replace_results", "RESULT_TABLES"]

RESULT_TABLES = ("ceiling", "ceiling_summary", "ceiling_validation")


@dataclass
class CeilingRun:
    """What :func:`estimate_run` computed and wrote.

    ``ceiling`` is the per-step table; after a write it is read back from the
    store when first asked for (a large run's table is never held whole in memory
    while estimating), so use ``num_rows`` for its size.
    """

    run_id: str
    method: str
    gamma: int
    summary: pa.Table
    validation: pa.Table | None
    truth_source: str | None = None
    companion: str | None = None
    steps_with_truth: int = 0
    misaligned_requests: list[str] = field(default_factory=list)
    num_rows: int = 0
    sampling_counts: dict = field(default_factory=dict)   # (sampling, source) -> requests
    table: pa.Table | None = field(default=None, repr=False)   # held when not written
    store: object = field(default=None, repr=False)            # where it was written
    fit: object = field(default=None, repr=False)              # the CeilingFit used (estimate --fit-out)

    @property
    def ceiling(self) -> pa.Table:
        """The per-step ``ceiling`` rows (read back from the store on first use after a write)."""
        if self.table is None and self.store is not None:
            self.table = self.store.read("ceiling", self.run_id).drop_columns(["run_id"])
        return self.table


_CATEGORY_NAMES = pa.array(CATEGORIES, pa.string())
_KIND_NAMES, _SOURCE_NAMES = pa.array(sampling.KINDS, pa.string()), pa.array(sampling.SOURCES, pa.string())


def _ceiling_table(steps: pa.Table, est, x: "ChunkInputs", method: str) -> pa.Table:
    n = steps.num_rows
    window, correct = x.window, x.correct
    cols = {name: steps.column(name) for name in ("dp_rank", "forward_ct", "segment", "rid", "workload")}
    return pa.table({
        **cols, "temperature": pa.array(x.temperature.astype(np.float32), from_pandas=True),
        "sampling": _KIND_NAMES.take(pa.array(x.sampling)), "sampling_source": _SOURCE_NAMES.take(pa.array(x.sampling_source)),
        "prefix_len": steps.column("prefix_len"), "window": pa.array(window.astype(np.int16)), "correct_drafts": pa.array(correct.astype(np.int16)),
        "censored": pa.array(est.walk.censored), "category": _CATEGORY_NAMES.take(pa.array(est.walk.category)),
        "walked": pa.array(est.walk.n_walked.astype(np.int16)),
        "lo": pa.array(est.lo), "mid": pa.array(est.mid), "hi": pa.array(est.hi),
        "method": pa.repeat(pa.scalar(method, pa.string()), n),
        "survival_mid": pa.FixedSizeListArray.from_arrays(
            pa.array(est.survival.astype(np.float32).reshape(-1)), est.survival.shape[1]).cast(pa.list_(pa.float32())),
    })


def fit_run(parts: Parts, run_id: str, gamma: int) -> CeilingFit:
    """What the run's verified drafts teach, fitted once on the sample's parts and used on every chunk."""
    model = fit_acceptance_parts(parts, gamma)
    drafter = fit_drafter_parts(parts, gamma)
    use = drafter_explains_better_parts(parts, drafter, model)
    return CeilingFit(model, drafter, use, fit_binned_parts(parts, gamma), {"run_id": run_id, "gamma": gamma})


def _part_of(x: ChunkInputs) -> FitPart:
    ev = x.aligned.evidence
    return FitPart(x.conf, x.window, x.correct, x.greedy, ev.p_topk, ev.topk_state, ev.p_draft)


def load_fit_parts(con, plan: "RunPlan", parts: list, root) -> list[FitPart]:
    """The fitting sample's ``parts`` (:func:`~dspark_obs.estimators.chunks.sample_parts`) read from the
    store, as :mod:`~dspark_obs.estimators.ceiling.fit_parts` sums them: the rid-range parts of a whole
    run in one read spanning them (then cut by their steps); a sample's parts (their blocks' ranges) and a
    part of steps without a rid each on its own."""
    ranged = [p for p in parts if "chunk_lo" in p.params]
    out = []
    if ranged:
        span = Chunk(ranged[0].where, {**ranged[0].params, "chunk_hi": ranged[-1].params["chunk_hi"]},
                     rows=sum(p.rows for p in ranged))
        out += _cut(_part_of(_load(con, plan, span, root)), ranged, plan.run_id)
    return out + [_part_of(_load(con, plan, p, root)) for p in parts if "chunk_lo" not in p.params]


def _load(con, plan: "RunPlan", chunk: Chunk, root) -> ChunkInputs:
    return load_inputs(con, plan.run_id, root, chunk, plan.gamma, inferred=plan.inferred,
                       temperature=plan.temperature, mode=plan.mode, requests=plan.requests)[0]


def _cut(whole: FitPart, parts: list, run_id: str) -> list[FitPart]:
    """``whole`` (the steps of ``parts``, in order) cut into one :class:`FitPart` per part."""
    if len(parts) == 1:
        return [whole]
    bounds = np.cumsum([0] + [p.rows for p in parts])
    if bounds[-1] != len(whole.window):
        raise RuntimeError(f"run {run_id!r}: {len(whole.window)} steps read for the fit, {bounds[-1]} planned")
    return [whole.rows(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def fit_parts_of(plan: "RunPlan") -> list[Chunk]:
    """The run's fitting sample cut into parts (the same parts for every chunk size and engine)."""
    return sample_parts(plan.rids, plan.counts, plan.sample)


def fits_on_one_chunk(plan: "RunPlan") -> bool:
    """A run of one chunk whose sample is every request: fitted on the chunk itself, as one pass would."""
    return len(plan.chunks) == 1 and plan.sample.where == "TRUE"


def _fit_on_chunk(x: ChunkInputs, plan: "RunPlan", gamma: int) -> CeilingFit:
    """The fit of a run of one chunk on that chunk's inputs: its steps cut into the sample's parts."""
    return fit_run(LocalParts(_cut(_part_of(x), fit_parts_of(plan), plan.run_id)), plan.run_id, gamma)


def _check_fit(fit: CeilingFit, run_id: str, gamma: int) -> CeilingFit:
    if fit.gamma != gamma:
        raise ValueError(f"the ceiling fit is for gamma={fit.gamma} (run {fit.meta.get('run_id')!r}), run "
                         f"{run_id!r} has gamma={gamma}: fit one on a run of this deployment")
    return fit


@dataclass
class RunPlan:
    """What every chunk of a run needs, decided once by the driver (picklable, so workers get it)."""

    run_id: str
    rids: list                 # the run's rids as the database sorts them, None last
    counts: np.ndarray         # their steps
    chunks: list               # the local path's chunks (contiguous rid ranges)
    sample: Chunk              # requests the models are fitted on
    mode: str
    gamma: int
    companion: str | None
    method: str
    inferred: InferredSampling
    sglang_logprobs: pa.Table | None
    temperature: float | None
    model: CeilingFit | None = None   # None: fitted on the only chunk, as one pass would
    requests: RunRequests | None = None   # the run's requests, looked up by every chunk


def plan_estimate(con, run_id: str, root, *, companion, method, sglang_logprobs, chunk_rows: int, fit_rows: int,
                  temperature: float | None, alpha: float, fit: bool = True,
                  given: CeilingFit | None = None) -> RunPlan:
    """Plan the run's chunks and, with ``fit``, fit the models on the sample's parts here (a run of one
    chunk is fitted on that chunk as it is estimated; an engine that holds the parts on its workers fits
    there: ``fit=False``).  ``given`` (a fit of an earlier run of the same deployment) is used instead."""
    validate_run_id(run_id)
    rids, counts = run_rids(con, run_id, root)
    chunks = plan_chunks(rids, counts, chunk_rows=chunk_rows)
    sample = sample_requests(rids, counts, max_rows=fit_rows)
    mode, gamma = run_meta(con, run_id)
    gamma = run_gamma(con, run_id, gamma)
    if companion is None and mode == "compact":
        companion = pairing.companion_of(con, run_id)
    plan = RunPlan(run_id, rids, counts, chunks, sample, mode, gamma, companion, method,
                   infer_sampling(con, run_id, alpha), sglang_logprobs, temperature,
                   requests=RunRequests.read(con, run_id))
    if given is not None:
        plan.model = _check_fit(given, run_id, gamma)
    elif fit and not fits_on_one_chunk(plan):
        plan.model = fit_run(LocalParts(load_fit_parts(con, plan, fit_parts_of(plan), root)), run_id, gamma)
    return plan


def estimate_chunks(con, plan: RunPlan, chunks: list, root, *, n_bootstrap: int, seed: int,
                    sink: Callable[[pa.Table], None], progress: Callable[[int], None] | None = None) -> RunPartial:
    """Estimate ``chunks`` of the run: each chunk's ``ceiling`` rows go to ``sink``; returns their
    :class:`RunPartial`.  The one per-chunk path, for the local loop and for every worker."""
    acc = RunTotals(rid_positions(plan.rids))
    model = plan.model
    for chunk in chunks:
        x, mode, gamma = load_inputs(con, plan.run_id, root, chunk, plan.gamma, inferred=plan.inferred,
                                 temperature=plan.temperature, mode=plan.mode, requests=plan.requests)
        if model is None:  # kept on the plan: the result carries the fit it used (estimate --fit-out)
            model = plan.model = _fit_on_chunk(x, plan, gamma)
        part = _estimate_chunk(con, plan.run_id, x, chunk, mode=mode, gamma=gamma, method=plan.method, model=model,
                               companion=plan.companion, sglang_logprobs=plan.sglang_logprobs)
        acc.add(x, part)
        sink(part.ceiling)
        if progress is not None:
            progress(x.steps.num_rows)
        del x, part
    return acc.finish(n_bootstrap=n_bootstrap, seed=seed)


def finish_estimate(plan: RunPlan, partial: RunPartial, *, n_bootstrap: int) -> tuple[pa.Table, pa.Table | None, str | None]:
    """``(ceiling_summary, ceiling_validation or None, companion validated against)`` of the run's partial."""
    check_alignment_share(plan.run_id, partial.bad, partial.checked)
    summary = pa.Table.from_pylist([{**r, "method": plan.method} for r in partial.summary_rows(n_bootstrap)],
                                   schema=_file_schema("ceiling_summary"))
    rows = partial.validation_rows()
    companion = plan.companion if partial.source == "companion" else None
    validation = pa.Table.from_pylist(
        [{**r, "method": plan.method, "truth_source": partial.source, "companion_run": companion} for r in rows],
        schema=_file_schema("ceiling_validation")) if rows else None
    return summary, validation, companion


def result_of(plan: RunPlan, partial: RunPartial, summary, validation, companion, *, table=None,
              store=None) -> CeilingRun:
    return CeilingRun(run_id=plan.run_id, method=plan.method, gamma=plan.gamma, summary=summary,
                      validation=validation, truth_source=partial.source, companion=companion,
                      steps_with_truth=(partial.all_sums or {}).get("n", 0),
                      misaligned_requests=partial.misaligned_rids(), num_rows=int(plan.counts.sum()), table=table,
                      sampling_counts=dict(sorted(partial.sampling.items())), store=store, fit=plan.model)


def run_local(con, plan: RunPlan, store, *, n_bootstrap: int, seed: int, write: bool,
              progress: Callable[[int, int], None] | None = None) -> CeilingRun:
    """The planned run estimated chunk by chunk in this process (the ``ceiling`` rows staged as they come)."""
    run_id = plan.run_id
    total, done = int(plan.counts.sum()), [0]

    def advance(rows: int) -> None:
        done[0] += rows
        if progress is not None:
            progress(done[0], total)

    # Each chunk's rows go straight to the store as staged part files (invisible to readers), committed
    # with a rename once the whole run succeeded: a failure leaves the old results as they were.
    batch, tables = f"ceiling-{secrets.token_hex(6)}" if write else None, []
    sink = tables.append if batch is None else (lambda t: store.stage("ceiling", run_id, t, batch))
    try:
        partial = estimate_chunks(con, plan, plan.chunks, store.root, n_bootstrap=n_bootstrap, seed=seed,
                                  sink=sink, progress=advance)
        summary, validation, companion = finish_estimate(plan, partial, n_bootstrap=n_bootstrap)
        if write:
            replace_results(store, run_id, batch, summary, validation)
            batch = None
    finally:
        if batch is not None:
            store.discard_staged("ceiling", run_id, batch)
    ceiling = pa.concat_tables(tables) if tables else None
    return result_of(plan, partial, summary, validation, companion, table=ceiling, store=store if write else None)


def replace_results(store, run_id: str, ceiling_parts, summary: pa.Table, validation: pa.Table | None) -> None:
    """Drop the run's old result partitions and write the new ones (``ceiling_parts``: tables, or a
    staged batch name the workers wrote to)."""
    for table in RESULT_TABLES:
        store.drop_run(table, run_id)
    if isinstance(ceiling_parts, str):
        store.commit_staged("ceiling", run_id, ceiling_parts)
    else:
        for part in ceiling_parts:
            store.write("ceiling", run_id, part)
    store.write("ceiling_summary", run_id, summary)
    if validation is not None:
        store.write("ceiling_validation", run_id, validation)


@dataclass
class _ChunkResult:
    ceiling: pa.Table
    workload: tuple            # (each step's code, the names)
    summary_columns: dict
    known_sums: dict           # validation sums over every step with a truth
    group_sums: dict           # validation sums of the censored steps with a truth, per group but the bins
    censored_known: dict       # per-step columns of the censored steps with a truth, for the validation
    censored_rows: np.ndarray  # which steps those are
    source: str | None


def _estimate_chunk(con, run_id: str, x: ChunkInputs, chunk: Chunk, *, mode: str, gamma: int, method: str,
                    model: CeilingFit, companion: str | None, sglang_logprobs) -> _ChunkResult:
    q_draft, p_draft = sglang_arrays(x.steps, sglang_logprobs, gamma)
    est = estimate_ceiling(x.drafts, x.window, x.correct, x.aligned.evidence, greedy=x.greedy,
                           natural_end=x.aligned.natural_end, confidence=x.conf, q_draft=q_draft, p_draft=p_draft,
                           method=method, model=model.acceptance, drafter=model.drafter,
                           use_drafter=model.use_drafter, binned_prior=model.binned)
    ceiling = _ceiling_table(x.steps, est, x, method)
    workload_names, workload_code = workload_codes(x.steps)
    truth, source = truth_of(con, run_id, x.steps, mode, companion, chunk)
    censored = est.walk.censored
    emu = np.where(censored, column_array(x.steps, "emu_expected_given_window", np.float64, np.nan), np.nan)
    known = ~np.isnan(truth) | ~np.isnan(emu)
    base = censored & known
    # Truths count drafts and the emulator's expectation is stored as float32: both are exact in float32.
    kept = {"lo": est.lo[base], "mid": est.mid[base], "hi": est.hi[base], "truth": truth[base].astype(np.float32),
            "emu": emu[base].astype(np.float32), "greedy": x.greedy[base]}
    # The validation's groups by label are summed here, where the chunk is estimated (on a worker with --jobs);
    # only the bins, which rank the whole run's steps, need the kept steps.
    groups = ceiling_validation.label_group_sums(**kept, category=est.walk.category[base], category_names=CATEGORIES,
                                      workload=workload_code[base], workload_names=workload_names)
    return _ChunkResult(ceiling, (workload_code, workload_names), {"censored": censored, "lo": est.lo, "mid": est.mid, "hi": est.hi},
                        ceiling_validation.stat_sums(est.lo, est.mid, est.hi, truth, emu, known, x.greedy), groups, kept,
                        base, source)


def _file_schema(table: str) -> pa.Schema:
    return schema.TABLES[table]
