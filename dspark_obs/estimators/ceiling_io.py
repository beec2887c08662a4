"""The thin layer of the ceiling estimator: read a run from the views, compute, write results.

Reads ``runs``, ``step_reqs``, ``requests`` and ``tokens`` of one run through
DuckDB, turns them into arrays (requests become integer codes; list columns
become padded matrices), calls the pure functions, finds a truth to validate
against, and replaces the run's partitions of ``ceiling``, ``ceiling_summary``
and ``ceiling_validation``.  Use it through
:func:`dspark_obs.estimators.ceiling.estimate_run`.
"""

from __future__ import annotations

import secrets

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs import sql as sqlmod
from dspark_obs.estimators import ceiling_stats, pairing, sampling
from dspark_obs.estimators.ceiling import CeilingRun, drafter_explains_better, estimate_ceiling
from dspark_obs.estimators.ceiling_drafter import fit_drafter_map
from dspark_obs.estimators.ceiling_chunks import (ALL, DEFAULT_CHUNK_ROWS, DEFAULT_FIT_ROWS, Chunk, plan_chunks,
                                                  sample_requests)
from dspark_obs.estimators.ceiling_evidence import align_requests, padded_lists, token_index
from dspark_obs.estimators.ceiling_fit import CeilingFit
from dspark_obs.estimators.ceiling_prior import fit_acceptance_model, fit_binned_prior
from dspark_obs.estimators.ceiling_partial import (RunPartial, RunTotals, rid_positions,
                                                   workload_labels)
from dspark_obs.store import validate_run_id

__all__ = ["run_estimate", "plan_estimate", "estimate_chunks", "finish_estimate", "RunPlan", "RESULT_TABLES"]

RESULT_TABLES = ("ceiling", "ceiling_summary", "ceiling_validation")

_PLAN_SQL = """
SELECT rid, count(*) AS n FROM step_reqs WHERE run_id = $run GROUP BY rid ORDER BY rid NULLS LAST
"""
_STEPS_SQL = """
SELECT s.dp_rank, s.forward_ct, s.segment, s.rid, s.prefix_len, s.verify_len, s.correct_drafts,
       s.cap_trim, s.bonus_token, s.draft_tokens, s.confidence, s.emu_block_accept,
       s.emu_expected_given_window, q.workload, q.temperature, q.prompt_tokens,
       q.completion_tokens, q.finish_reason
FROM step_reqs AS s
LEFT JOIN (
    SELECT rid, any_value(workload) AS workload, any_value(temperature) AS temperature,
           any_value(prompt_tokens) AS prompt_tokens, any_value(completion_tokens) AS completion_tokens,
           any_value(finish_reason) AS finish_reason
    FROM requests WHERE run_id = $run AND {requests_rid} GROUP BY rid
) AS q ON s.rid = q.rid
WHERE s.run_id = $run AND {steps_rid}
ORDER BY s.rid, s.prefix_len, s.dp_rank, s.forward_ct
"""
_TOKENS_SQL = ("SELECT rid, pos, token_id, logprob, top_ids, top_logprobs FROM tokens "
               "WHERE run_id = $run AND {tokens_rid}")
_PAIRED_SQL = ("SELECT rid, dp_rank, forward_ct, true_block_accept FROM ({paired}) AS p "
               "WHERE p.same_drafts AND {paired_rid}")


def _fetch(con, sql_text: str, params: dict) -> pa.Table:
    return con.sql(sql_text, params=params).to_arrow_table()  # DuckDB 2: fetch fully


_open = sqlmod.connection_and_store


def _np(table: pa.Table, name: str, dtype, fill) -> np.ndarray:
    col = table.column(name)
    if np.issubdtype(np.dtype(dtype), np.floating):
        col = col.cast(pa.float64())
    if col.null_count:
        col = pc.fill_null(col, fill)
    return col.to_numpy().astype(dtype)


def _codes(values: pa.ChunkedArray, dictionary: pa.Array | None = None) -> tuple[np.ndarray, pa.Array]:
    """Integer codes of strings (``-1`` for null or not in ``dictionary``)."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if dictionary is None:
        enc = pc.dictionary_encode(values)
        dictionary = enc.dictionary
        idx = enc.indices
    else:
        idx = pc.index_in(values, value_set=dictionary)
    return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64), dictionary


def _run_meta(con, run_id: str) -> tuple[str, int | None]:
    """``(mode, gamma)`` from ``runs`` (mode from ``steps`` if the run has no row)."""
    rows = _fetch(con, "SELECT mode, gamma FROM runs WHERE run_id = $run", {"run": run_id}).to_pylist()
    mode, gamma = (rows[0]["mode"], rows[0]["gamma"]) if rows else (None, None)
    if not mode:
        found = con.sql("SELECT mode FROM steps WHERE run_id = $run AND mode <> '' LIMIT 1",
                        params={"run": run_id}).fetchall()
        mode = found[0][0] if found else "compact"
    return mode, gamma


def _truth(con, run_id: str, steps: pa.Table, mode: str, companion: str | None,
           chunk: Chunk = ALL) -> tuple[np.ndarray, str | None]:
    """Realised full-block acceptance per step (NaN unknown) and where it came from."""
    n = steps.num_rows
    if companion is not None:
        paired = _fetch(con, _PAIRED_SQL.format(paired=pairing.PAIRED_STEPS_SQL, paired_rid=chunk.on("p.rid")),
                        {"run": run_id, "companion": companion, **chunk.params})
        keys = pa.table({"rid": steps.column("rid"), "dp_rank": steps.column("dp_rank"),
                         "forward_ct": steps.column("forward_ct"), "row": pa.array(np.arange(n))})
        joined = keys.join(paired, ["rid", "dp_rank", "forward_ct"], join_type="inner")
        truth = np.full(n, np.nan)
        truth[joined.column("row").to_numpy()] = joined.column("true_block_accept").to_numpy().astype(np.float64)
        return truth, "companion"
    if mode in ("cap-accept", "static"):
        cap = _np(steps, "cap_trim", np.float64, 0) if mode == "cap-accept" else 0.0
        return _np(steps, "correct_drafts", np.float64, 0) + cap, mode
    emu = steps.column("emu_block_accept")
    if emu.null_count < n:
        return _np(steps, "emu_block_accept", np.float64, np.nan), "emulator"
    return np.full(n, np.nan), None


def _plan(con, run_id: str, root) -> tuple[list, np.ndarray]:
    """The run's distinct rids in the database's order (None last) and their steps."""
    plan = _fetch(con, _PLAN_SQL, {"run": run_id})
    if plan.num_rows == 0:
        known = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM step_reqs ORDER BY 1").fetchall()]
        raise LookupError(f"run {run_id!r} has no step_reqs in {root}; runs with steps: "
                          f"{', '.join(known) or 'none (collect one: dspark-obs demo or dspark-obs collect)'}")
    return plan.column("rid").to_pylist(), plan.column("n").to_numpy().astype(np.int64)


def _run_gamma(con, run_id: str, gamma: int | None) -> int:
    if gamma:
        return int(gamma)
    found = con.sql("SELECT max(len(draft_tokens)) FROM step_reqs WHERE run_id = $run",
                    params={"run": run_id}).fetchall()
    return int(found[0][0] or 0)


def _load_steps(con, run_id: str, root, chunk: Chunk = ALL, *, gamma: int | None = None) -> tuple[pa.Table, str, int]:
    """One chunk's steps (default: the whole run) ordered by rid, anchor, rank and step."""
    steps = _fetch(con, _STEPS_SQL.format(requests_rid=chunk.on("rid"), steps_rid=chunk.on("s.rid")),
                   {"run": run_id, **chunk.params})
    if steps.num_rows == 0 and chunk.where == "TRUE":
        _plan(con, run_id, root)  # raises LookupError with the runs that have steps
    mode, run_gamma = _run_meta(con, run_id)
    gamma = gamma or _run_gamma(con, run_id, run_gamma)
    lengths = pc.list_value_length(steps.column("draft_tokens")).to_numpy(zero_copy_only=False)
    if (lengths != gamma).any():
        raise ValueError(f"run {run_id!r}: draft_tokens hold {sorted(set(lengths.tolist()))} tokens, "
                         f"expected gamma={gamma} (runs.gamma); re-collect the run or fix runs.gamma")
    return steps, mode, gamma


@dataclass
class _Aligned:
    """Evidence of one chunk and what the alignment check found."""

    evidence: object
    misaligned: list[str]
    natural_end: np.ndarray
    code: np.ndarray          # request code per step (-1: no rid), in rid order within the chunk
    rids: pa.Array            # the chunk's rids, by code
    misaligned_codes: np.ndarray
    n_requests: int
    bad_steps: int
    checked_steps: int


def _check_alignment_share(run_id: str, bad: int, checked: int) -> None:
    if checked and bad > 0.5 * checked:
        raise ValueError(f"run {run_id!r}: {bad} of {checked} steps commit tokens that "
                         "differ from the tokens table at their positions; requests.prompt_tokens must be the "
                         "prompt length (output position = prefix_len - prompt_tokens + 1), and tokens must "
                         "come from the same run — re-collect with the driver (dspark-obs collect --workload)")


def _aligned_evidence(con, run_id: str, steps: pa.Table, drafts: np.ndarray, correct: np.ndarray,
                      chunk: Chunk = ALL) -> _Aligned:
    """Evidence per drafted position, the requests whose tokens do not line up, and natural ends.

    Output position of ``d_1`` = ``prefix_len - prompt_tokens + 1``; a missing
    ``prompt_tokens`` is the request's smallest ``prefix_len`` (its first decode
    step, when recorded).  A request whose committed tokens disagree with the
    tokens table on more than 20% of its steps is walked without tokens.  Every
    decision is per request, so a chunk of whole requests gets what the whole
    run would; only the run-wide share of disagreeing steps (more than half: a
    wrong ``prompt_tokens``) is checked by the caller over all chunks.
    """
    code, rids = _codes(steps.column("rid"))
    n_req = len(rids)
    slot = np.where(code < 0, n_req, code)      # per-request arrays keep a spare slot for no rid
    prefix = _np(steps, "prefix_len", np.int64, 0)
    first_seen = np.full(n_req + 1, np.iinfo(np.int64).max)
    np.minimum.at(first_seen, slot, prefix)
    prompt = _np(steps, "prompt_tokens", np.float64, np.nan)
    first_pos = prefix - np.where(np.isnan(prompt), first_seen[slot], prompt).astype(np.int64) + 1

    tokens = _fetch(con, _TOKENS_SQL.format(tokens_rid=chunk.on("rid")), {"run": run_id, **chunk.params})
    tcode, _ = _codes(tokens.column("rid"), rids)
    tokens, tcode = tokens.filter(pa.array(tcode >= 0)), tcode[tcode >= 0]
    index = token_index(tcode, _np(tokens, "pos", np.int64, -1), _np(tokens, "token_id", np.int64, -1),
                        logprob=_np(tokens, "logprob", np.float64, np.nan),
                        top_ids=padded_lists(tokens.column("top_ids"), fill=-1),
                        top_logprobs=padded_lists(tokens.column("top_logprobs"), fill=np.nan))
    del tokens
    completion = _np(steps, "completion_tokens", np.int64, -1)
    stop = pc.fill_null(pc.equal(steps.column("finish_reason"), "stop"), False).to_numpy(zero_copy_only=False)
    al = align_requests(index, code, n_req, first_pos, drafts, correct, _np(steps, "bonus_token", np.int64, -1),
                        token_counts=np.bincount(tcode, minlength=n_req + 1)[slot], completion=completion, stop=stop)
    bad_codes = np.flatnonzero(al.misaligned[:-1])
    names = np.asarray(rids.to_pylist(), dtype=object)[bad_codes]
    return _Aligned(al.evidence, [str(r) for r in names], al.natural_end, code, rids, bad_codes, n_req,
                    al.bad_steps, al.checked_steps)


def _sglang_arrays(steps: pa.Table, logprobs: pa.Table | None, gamma: int):
    """``(q_draft, p_draft)`` [n, gamma] probabilities from the JSONL table, NaN where it says nothing."""
    if logprobs is None or logprobs.num_rows == 0:
        return None, None
    n = steps.num_rows
    keys = pa.table({"rid": steps.column("rid"), "forward_ct": steps.column("forward_ct"),
                     "row": pa.array(np.arange(n))})
    jkeys = pa.table({"rid": logprobs.column("rid"), "forward_ct": logprobs.column("forward_ct"),
                      "jrow": pa.array(np.arange(logprobs.num_rows))})
    joined = keys.join(jkeys, ["rid", "forward_ct"], join_type="inner")  # list columns cannot ride a join
    taken = logprobs.take(joined.column("jrow"))
    out = []
    for col in ("q_logprob", "p_logprob"):
        vals = padded_lists(taken.column(col), fill=np.nan, dtype=np.float64)
        if taken.num_rows and vals.shape[1] != gamma:
            raise ValueError(f"SGLang JSONL lists hold {vals.shape[1]} offsets, the run's gamma is {gamma}; "
                             "pass the JSONL of this run's server")
        arr = np.full((n, gamma), np.nan)
        arr[joined.column("row").to_numpy()] = np.exp(vals) if taken.num_rows else np.nan
        out.append(arr)
    return out[0], out[1]


def _ceiling_table(steps: pa.Table, est, x: "_Inputs", method: str) -> pa.Table:
    n = steps.num_rows
    window, correct = x.window, x.correct
    cols = {name: steps.column(name) for name in ("dp_rank", "forward_ct", "segment", "rid", "workload")}
    return pa.table({
        **cols, "temperature": pa.array(x.temperature.astype(np.float32), from_pandas=True),
        "sampling": pa.array(x.sampling.astype(str)), "sampling_source": pa.array(x.sampling_source.astype(str)),
        "prefix_len": steps.column("prefix_len"), "window": pa.array(window.astype(np.int16)), "correct_drafts": pa.array(correct.astype(np.int16)),
        "censored": pa.array(est.walk.censored), "category": pa.array(est.category.astype(str)),
        "walked": pa.array(est.walk.n_walked.astype(np.int16)),
        "lo": pa.array(est.lo), "mid": pa.array(est.mid), "hi": pa.array(est.hi),
        "method": pa.array([method] * n, pa.string()),
        "survival_mid": pa.FixedSizeListArray.from_arrays(
            pa.array(est.survival.astype(np.float32).reshape(-1)), est.survival.shape[1]).cast(pa.list_(pa.float32())),
    })


@dataclass
class _Inputs:
    """One chunk's arrays, as :func:`estimate_ceiling` takes them."""

    steps: pa.Table
    drafts: np.ndarray
    conf: np.ndarray
    window: np.ndarray
    correct: np.ndarray
    greedy: np.ndarray
    aligned: _Aligned
    temperature: np.ndarray        # [n] recorded, else overridden temperature (NaN unknown)
    sampling: np.ndarray           # [n] greedy | sampled | unknown
    sampling_source: np.ndarray    # [n] recorded | override | inferred | unknown


@dataclass(frozen=True)
class _Inferred:
    """The run's stated and inferred sampling per rid (read once for the whole run)."""

    rids: pa.Array             # rids with token evidence
    kinds: np.ndarray          # their inferred sampling
    override_rids: pa.Array    # rids of stored per-request overrides (ingest --workload-map)
    override_temps: np.ndarray
    run_override: float | None  # stored run-wide override (ingest --temperature)


_OVERRIDES_SQL = "SELECT rid, temperature FROM sampling_overrides WHERE run_id = $run ORDER BY rid NULLS LAST"


def _infer_sampling(con, run_id: str, alpha: float) -> _Inferred:
    evidence = _fetch(con, sampling.TOKEN_EVIDENCE_SQL, {"run": run_id})
    log_p = _np(evidence, "log_p_top1", np.float64, 0.0)
    kinds = sampling.infer_greedy(_np(evidence, "n_topk", np.int64, 0), _np(evidence, "n_top1", np.int64, 0),
                                  log_p, alpha=alpha)
    stated = _fetch(con, _OVERRIDES_SQL, {"run": run_id})
    per_rid = stated.filter(pc.is_valid(stated.column("rid")))
    run_wide = stated.filter(pc.is_null(stated.column("rid"))).column("temperature").to_pylist()
    return _Inferred(evidence.column("rid").combine_chunks(), sampling.pool_run(kinds, log_p, alpha=alpha),
                     per_rid.column("rid").combine_chunks(), _np(per_rid, "temperature", np.float64, np.nan),
                     float(run_wide[-1]) if run_wide else None)


def _sampling(steps: pa.Table, inferred: _Inferred, temperature: float | None) -> tuple[np.ndarray, ...]:
    """Per step: the temperature known (recorded, else stated), the sampling and its source.

    Stated, in order: the request's own override (an ingest map), ``temperature``
    (``estimate --temperature``), the run's stored ``ingest --temperature``.
    """
    recorded = _np(steps, "temperature", np.float64, np.nan)
    fallback = temperature if temperature is not None else inferred.run_override
    override = np.full(steps.num_rows, np.nan if fallback is None else float(fallback))
    ocode, _ = _codes(steps.column("rid"), inferred.override_rids)
    override = np.where(ocode >= 0, np.append(inferred.override_temps, np.nan)[ocode], override)
    code, _ = _codes(steps.column("rid"), inferred.rids)
    inferred = np.where(code >= 0, np.append(inferred.kinds, sampling.UNKNOWN)[code], sampling.UNKNOWN)
    kind, source = sampling.resolve_sampling(recorded, override, inferred)
    return np.where(np.isnan(recorded), override, recorded), kind, source


def _inputs(con, run_id: str, root, chunk: Chunk, gamma: int | None, *, inferred: _Inferred,
            temperature: float | None = None) -> tuple[_Inputs, str, int]:
    steps, mode, gamma = _load_steps(con, run_id, root, chunk, gamma=gamma)
    drafts = padded_lists(steps.column("draft_tokens"), fill=-1, dtype=np.int64)
    if drafts.shape[1] != gamma:  # an empty chunk
        drafts = np.zeros((steps.num_rows, gamma), np.int64)
    conf = padded_lists(steps.column("confidence"), fill=np.nan, dtype=np.float64)
    if conf.shape[1] != gamma:
        conf = np.full((steps.num_rows, gamma), np.nan)
    window = _np(steps, "verify_len", np.int64, 1) - 1
    correct = _np(steps, "correct_drafts", np.int64, 0)
    temp, kind, source = _sampling(steps, inferred, temperature)
    greedy = kind == sampling.GREEDY   # unknown sampling: the sampled rule
    aligned = _aligned_evidence(con, run_id, steps, drafts, correct, chunk)
    return _Inputs(steps, drafts, conf, window, correct, greedy, aligned, temp, kind, source), mode, gamma


def _fit(x: _Inputs, run_id: str, gamma: int) -> CeilingFit:
    """What the run's verified drafts teach, fitted once and used on every chunk."""
    ev = x.aligned.evidence
    model = fit_acceptance_model(x.conf, x.window, x.correct, x.greedy, p_topk=ev.p_topk, topk_state=ev.topk_state)
    drafter = fit_drafter_map(x.conf, ev.p_draft, ev.topk_state, x.window, x.correct, ~x.greedy)
    use = drafter_explains_better(drafter, model, x.conf, ev.p_draft, ev, x.window, x.correct, ~x.greedy)
    return CeilingFit(model, drafter, use, fit_binned_prior(x.conf, x.window, x.correct, ~x.greedy),
                      {"run_id": run_id, "gamma": gamma})


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
    inferred: _Inferred
    sglang_logprobs: pa.Table | None
    temperature: float | None
    model: CeilingFit | None = None   # None: fitted on the only chunk, as one pass would


def plan_estimate(con, run_id: str, root, *, companion, method, sglang_logprobs, chunk_rows: int, fit_rows: int,
                  temperature: float | None, alpha: float, fit: bool = False,
                  given: CeilingFit | None = None) -> RunPlan:
    """Plan the run's chunks and fit the models on the sample (unless the run is one chunk and not ``fit``).

    ``given`` (a fit of an earlier run of the same deployment) is used instead of fitting."""
    validate_run_id(run_id)
    rids, counts = _plan(con, run_id, root)
    chunks = plan_chunks(rids, counts, chunk_rows=chunk_rows)
    sample = sample_requests(rids, counts, max_rows=fit_rows)
    mode, gamma = _run_meta(con, run_id)
    gamma = _run_gamma(con, run_id, gamma)
    if companion is None and mode == "compact":
        companion = pairing.companion_of(con, run_id)
    plan = RunPlan(run_id, rids, counts, chunks, sample, mode, gamma, companion, method,
                   _infer_sampling(con, run_id, alpha), sglang_logprobs, temperature)
    if given is not None:
        plan.model = _check_fit(given, run_id, gamma)
    elif fit or not (len(chunks) == 1 and sample.where == "TRUE"):  # else: fitted on the only chunk
        fit_inputs, _, _ = _inputs(con, run_id, root, sample, gamma, inferred=plan.inferred, temperature=temperature)
        plan.model = _fit(fit_inputs, run_id, gamma)
    return plan


def estimate_chunks(con, plan: RunPlan, chunks: list, root, *, n_bootstrap: int, seed: int,
                    sink: Callable[[pa.Table], None], progress: Callable[[int], None] | None = None) -> RunPartial:
    """Estimate ``chunks`` of the run: each chunk's ``ceiling`` rows go to ``sink``; returns their
    :class:`RunPartial`.  The one per-chunk path, for the local loop and for every worker."""
    acc = RunTotals(rid_positions(plan.rids))
    model = plan.model
    for chunk in chunks:
        x, mode, gamma = _inputs(con, plan.run_id, root, chunk, plan.gamma, inferred=plan.inferred,
                                 temperature=plan.temperature)
        if model is None:  # kept on the plan: the result carries the fit it used (estimate --fit-out)
            model = plan.model = _fit(x, plan.run_id, gamma)
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
    _check_alignment_share(plan.run_id, partial.bad, partial.checked)
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


def run_estimate(con_or_store, run_id: str, *, companion, method, sglang_logprobs, n_bootstrap: int,
                 seed: int, write: bool, chunk_rows: int = DEFAULT_CHUNK_ROWS, fit_rows: int = DEFAULT_FIT_ROWS,
                 progress: Callable[[int, int], None] | None = None, temperature: float | None = None,
                 alpha: float = sampling.DEFAULT_ALPHA, engine=None, fit: CeilingFit | None = None) -> CeilingRun:
    """The estimate of one run, locally or (``engine``, a :class:`dspark_obs.ray_engine.RayEngine`) on Ray;
    with ``fit`` (from an earlier run of the same deployment) instead of fitting on this run."""
    con, store = _open(con_or_store)
    plan = plan_estimate(con, run_id, store.root, companion=companion, method=method, sglang_logprobs=sglang_logprobs,
                         chunk_rows=chunk_rows, fit_rows=fit_rows, temperature=temperature, alpha=alpha,
                         fit=engine is not None and getattr(engine, "min_chunks", 0) <= 1, given=fit)
    if engine is not None and len(plan.chunks) < getattr(engine, "min_chunks", 0):
        engine = None   # a run of one chunk: this process, its one-pass figures
    if engine is not None:
        from dspark_obs.estimators import ceiling_ray

        return ceiling_ray.run(engine, plan, store, chunk_rows=chunk_rows, n_bootstrap=n_bootstrap, seed=seed,
                               write=write, progress=progress)
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
    workload: np.ndarray
    summary_columns: dict
    known_sums: dict           # validation sums over every step with a truth
    censored_known: dict       # per-step columns of the censored steps with a truth, for the validation
    censored_rows: np.ndarray  # which steps those are
    source: str | None


def _estimate_chunk(con, run_id: str, x: _Inputs, chunk: Chunk, *, mode: str, gamma: int, method: str,
                    model: CeilingFit, companion: str | None, sglang_logprobs) -> _ChunkResult:
    q_draft, p_draft = _sglang_arrays(x.steps, sglang_logprobs, gamma)
    est = estimate_ceiling(x.drafts, x.window, x.correct, x.aligned.evidence, greedy=x.greedy,
                           natural_end=x.aligned.natural_end, confidence=x.conf, q_draft=q_draft, p_draft=p_draft,
                           method=method, model=model.acceptance, drafter=model.drafter,
                           use_drafter=model.use_drafter, binned_prior=model.binned)
    ceiling = _ceiling_table(x.steps, est, x, method)
    workload = workload_labels(x.steps)
    truth, source = _truth(con, run_id, x.steps, mode, companion, chunk)
    censored = est.walk.censored
    emu = np.where(censored, _np(x.steps, "emu_expected_given_window", np.float64, np.nan), np.nan)
    known = ~np.isnan(truth) | ~np.isnan(emu)
    base = censored & known
    # Truths count drafts and the emulator's expectation is stored as float32: both are exact in float32.
    kept = {"lo": est.lo[base], "mid": est.mid[base], "hi": est.hi[base], "truth": truth[base].astype(np.float32),
            "emu": emu[base].astype(np.float32), "category": est.walk.category[base],
            "workload": workload[base], "greedy": x.greedy[base]}
    return _ChunkResult(ceiling, workload, {"censored": censored, "lo": est.lo, "mid": est.mid, "hi": est.hi},
                        ceiling_stats.stat_sums(est.lo, est.mid, est.hi, truth, emu, known, x.greedy), kept, base,
                        source)


def _file_schema(table: str) -> pa.Schema:
    from dspark_obs import schema

    return schema.TABLES[table]
