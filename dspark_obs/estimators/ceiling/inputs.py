"""The read side of the ceiling estimator: one run's (or chunk's) arrays from the views.

Reads ``runs``, ``step_reqs``, ``requests``, ``tokens`` and ``sampling_overrides``
of one run through DuckDB and turns them into the arrays
:func:`~dspark_obs.estimators.ceiling.estimate.estimate_ceiling` takes (requests
become integer codes; list columns become padded matrices), with each request's
sampling and token alignment decided.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs.acceptance import mode_block_accept
from dspark_obs.estimators import pairing, sampling
from dspark_obs.estimators.ceiling.evidence import align_requests, padded_lists, token_index, used_cells
from dspark_obs.estimators.chunks import ALL, Chunk
from dspark_obs.estimators.row_order import order_of, rid_ranks
from dspark_obs.estimators.run_requests import RunRequests

__all__ = ["fetch", "column_array", "codes", "run_meta", "truth_of", "run_rids", "run_gamma", "STEP_ORDER",
           "in_step_order", "load_steps",
           "AlignedChunk", "check_alignment_share", "aligned_evidence", "sglang_arrays", "ChunkInputs",
           "InferredSampling", "infer_sampling", "load_inputs"]

_PLAN_SQL = """
SELECT rid, count(*) AS n FROM step_reqs WHERE run_id = $run GROUP BY rid ORDER BY rid NULLS LAST
"""
_STEPS_SQL = """
SELECT s.dp_rank, s.forward_ct, s.segment, s.rid, s.prefix_len, s.verify_len, s.correct_drafts,
       s.cap_trim, s.bonus_token, s.draft_tokens, s.confidence, s.emu_block_accept,
       s.emu_expected_given_window
FROM {step_reqs} AS s
WHERE s.run_id = $run AND {steps_rid}
"""
STEP_ORDER = ("rid", "prefix_len", "dp_rank", "forward_ct")
"""The order of a chunk's steps: by request, anchor, rank and step (a request's walk reads them in turn)."""
_TOKENS_SQL = ("SELECT rid, pos, token_id, logprob, top_ids, top_logprobs FROM {tokens} "
               "WHERE run_id = $run AND {tokens_rid}")
_PAIRED_SQL = ("SELECT rid, dp_rank, forward_ct, true_block_accept FROM ({paired}) AS p "
               "WHERE p.same_drafts AND {paired_rid}")


def fetch(con, sql_text: str, params: dict) -> pa.Table:
    return con.sql(sql_text, params=params).to_arrow_table()  # DuckDB 2: fetch fully


def column_array(table: pa.Table, name: str, dtype, fill) -> np.ndarray:
    col = table.column(name)
    if np.issubdtype(np.dtype(dtype), np.floating):
        col = col.cast(pa.float64())
    if col.null_count:
        col = pc.fill_null(col, fill)
    return col.to_numpy().astype(dtype)


def codes(values: pa.ChunkedArray, dictionary: pa.Array | None = None) -> tuple[np.ndarray, pa.Array]:
    """Integer codes of strings (``-1`` for null or not in ``dictionary``; without one, the values' own, in
    order of first appearance).

    A chunk's steps come sorted by rid and its tokens clustered by it, so equal values run together: the
    first value of each run is looked up, and its code repeated (a comparison of neighbours, where the
    lookup hashed every value: 10.1 against 6.4 ms for a chunk's 770k tokens).
    """
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    n = len(values)
    if n > 1:
        change = np.ones(n, dtype=bool)
        change[1:] = pc.fill_null(pc.not_equal(values.slice(1), values.slice(0, n - 1)), True
                                  ).to_numpy(zero_copy_only=False)
        heads = np.flatnonzero(change)
        if heads.size * 4 <= n:
            head_codes, dictionary = _looked_up(values.take(pa.array(heads)), dictionary)
            return np.repeat(head_codes, np.diff(np.append(heads, n))), dictionary
    return _looked_up(values, dictionary)


def _looked_up(values: pa.Array, dictionary: pa.Array | None) -> tuple[np.ndarray, pa.Array]:
    """:func:`codes` by hashing every value (the heads of runs, or values that rarely repeat in a row)."""
    if dictionary is None:
        enc = pc.dictionary_encode(values)
        dictionary = enc.dictionary
        idx = enc.indices
    else:
        idx = pc.index_in(values, value_set=dictionary)
    return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64), dictionary


def run_meta(con, run_id: str) -> tuple[str, int | None]:
    """``(mode, gamma)`` from ``runs`` (mode from ``steps`` if the run has no row)."""
    rows = fetch(con, "SELECT mode, gamma FROM runs WHERE run_id = $run", {"run": run_id}).to_pylist()
    mode, gamma = (rows[0]["mode"], rows[0]["gamma"]) if rows else (None, None)
    if not mode:
        found = con.sql("SELECT mode FROM steps WHERE run_id = $run AND mode <> '' LIMIT 1",
                        params={"run": run_id}).fetchall()
        mode = found[0][0] if found else "compact"
    return mode, gamma


def truth_of(con, run_id: str, steps: pa.Table, mode: str, companion: str | None,
           chunk: Chunk = ALL) -> tuple[np.ndarray, str | None]:
    """Realised full-block acceptance per step (NaN unknown) and where it came from."""
    n = steps.num_rows
    if companion is not None:
        paired = fetch(con, _PAIRED_SQL.format(paired=pairing.PAIRED_STEPS_SQL, paired_rid=chunk.on("p.rid")),
                        {"run": run_id, "companion": companion, **chunk.params})
        keys = pa.table({"rid": steps.column("rid"), "dp_rank": steps.column("dp_rank"),
                         "forward_ct": steps.column("forward_ct"), "row": pa.array(np.arange(n))})
        joined = keys.join(paired, ["rid", "dp_rank", "forward_ct"], join_type="inner")
        truth = np.full(n, np.nan)
        truth[joined.column("row").to_numpy()] = joined.column("true_block_accept").to_numpy().astype(np.float64)
        return truth, "companion"
    shown = mode_block_accept(mode, column_array(steps, "correct_drafts", np.float64, 0),
                              column_array(steps, "cap_trim", np.float64, 0))
    if shown is not None:
        return shown, mode
    emu = steps.column("emu_block_accept")
    if emu.null_count < n:
        return column_array(steps, "emu_block_accept", np.float64, np.nan), "emulator"
    return np.full(n, np.nan), None


def run_rids(con, run_id: str, root) -> tuple[list, np.ndarray]:
    """The run's distinct rids in the database's order (None last) and their steps."""
    plan = fetch(con, _PLAN_SQL, {"run": run_id})
    if plan.num_rows == 0:
        known = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM step_reqs ORDER BY 1").fetchall()]
        raise LookupError(f"run {run_id!r} has no step_reqs in {root}; runs with steps: "
                          f"{', '.join(known) or 'none (collect one: dspark-obs demo or dspark-obs collect)'}")
    return plan.column("rid").to_pylist(), plan.column("n").to_numpy().astype(np.int64)


def run_gamma(con, run_id: str, gamma: int | None) -> int:
    if gamma:
        return int(gamma)
    found = con.sql("SELECT max(len(draft_tokens)) FROM step_reqs WHERE run_id = $run",
                    params={"run": run_id}).fetchall()
    return int(found[0][0] or 0)


def in_step_order(steps: pa.Table) -> pa.Table:
    """``steps`` sorted by :data:`STEP_ORDER` (rids as the database sorts them, null last); a scan of part
    files clustered by request mostly comes sorted already, and is then returned as it is."""
    if steps.num_rows < 2:
        return steps
    keys = [rid_ranks(steps.column("rid"))] + [column_array(steps, name, np.int64, 0) for name in STEP_ORDER[1:]]
    order = order_of(keys)
    return steps if order is None else steps.take(order)


def load_steps(con, run_id: str, root, chunk: Chunk = ALL, *, gamma: int | None = None, mode: str | None = None,
               requests: RunRequests | None = None) -> tuple[pa.Table, str, int]:
    """One chunk's steps (default: the whole run) in :data:`STEP_ORDER`, with their request's columns
    (``requests``: the run's, read once; default: the chunk's, read here)."""
    froms, files = chunk.sources(con, run_id, "step_reqs")
    steps = fetch(con, _STEPS_SQL.format(steps_rid=chunk.on("s.rid"), **froms), {"run": run_id, **chunk.params, **files})
    if steps.num_rows == 0 and chunk.where == "TRUE":
        run_rids(con, run_id, root)  # raises LookupError with the runs that have steps
    steps = in_step_order(steps)
    per_step = (requests or RunRequests.read(con, run_id, chunk)).per_step(steps.column("rid"))
    for name in per_step.column_names:
        steps = steps.append_column(name, per_step.column(name))
    if mode is None or not gamma:
        recorded_mode, recorded_gamma = run_meta(con, run_id)
        mode = mode or recorded_mode
        gamma = gamma or run_gamma(con, run_id, recorded_gamma)
    lengths = pc.list_value_length(steps.column("draft_tokens")).to_numpy(zero_copy_only=False)
    if (lengths != gamma).any():
        raise ValueError(f"run {run_id!r}: draft_tokens hold {sorted(set(lengths.tolist()))} tokens, "
                         f"expected gamma={gamma} (runs.gamma); re-collect the run or fix runs.gamma")
    return steps, mode, gamma


@dataclass
class AlignedChunk:
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


def check_alignment_share(run_id: str, bad: int, checked: int) -> None:
    if checked and bad > 0.5 * checked:
        raise ValueError(f"run {run_id!r}: {bad} of {checked} steps commit tokens that "
                         "differ from the tokens table at their positions; requests.prompt_tokens must be the "
                         "prompt length (output position = prefix_len - prompt_tokens + 1), and tokens must "
                         "come from the same run — re-collect with the driver (dspark-obs collect --workload)")


def aligned_evidence(con, run_id: str, steps: pa.Table, drafts: np.ndarray, correct: np.ndarray,
                      chunk: Chunk = ALL, cells: np.ndarray | None = None) -> AlignedChunk:
    """Evidence per drafted position, the requests whose tokens do not line up, and natural ends.

    Output position of ``d_1`` = ``prefix_len - prompt_tokens + 1``; a missing
    ``prompt_tokens`` is the request's smallest ``prefix_len`` (its first decode
    step, when recorded).  A request whose committed tokens disagree with the
    tokens table on more than 20% of its steps is walked without tokens.  Every
    decision is per request, so a chunk of whole requests gets what the whole
    run would; only the run-wide share of disagreeing steps (more than half: a
    wrong ``prompt_tokens``) is checked by the caller over all chunks.
    """
    code, rids = codes(steps.column("rid"))
    n_req = len(rids)
    slot = np.where(code < 0, n_req, code)      # per-request arrays keep a spare slot for no rid
    prefix = column_array(steps, "prefix_len", np.int64, 0)
    first_seen = np.full(n_req + 1, np.iinfo(np.int64).max)
    np.minimum.at(first_seen, slot, prefix)
    prompt = column_array(steps, "prompt_tokens", np.float64, np.nan)
    first_pos = prefix - np.where(np.isnan(prompt), first_seen[slot], prompt).astype(np.int64) + 1

    froms, files = chunk.sources(con, run_id, "tokens")
    tokens = fetch(con, _TOKENS_SQL.format(tokens_rid=chunk.on("rid"), **froms), {"run": run_id, **chunk.params, **files})
    tcode, _ = codes(tokens.column("rid"), rids)
    if (tcode < 0).any():  # tokens of requests without steps here (a copy of their top-k lists: only then)
        tokens, tcode = tokens.filter(pa.array(tcode >= 0)), tcode[tcode >= 0]
    index = token_index(tcode, column_array(tokens, "pos", np.int64, -1), column_array(tokens, "token_id", np.int64, -1),
                        logprob=column_array(tokens, "logprob", np.float64, np.nan),
                        top_ids=padded_lists(tokens.column("top_ids"), fill=-1),
                        top_logprobs=padded_lists(tokens.column("top_logprobs"), fill=np.nan))
    del tokens
    completion = column_array(steps, "completion_tokens", np.int64, -1)
    stop = pc.fill_null(pc.equal(steps.column("finish_reason"), "stop"), False).to_numpy(zero_copy_only=False)
    al = align_requests(index, code, n_req, first_pos, drafts, correct, column_array(steps, "bonus_token", np.int64, -1),
                        token_counts=np.bincount(tcode, minlength=n_req + 1)[slot], completion=completion, stop=stop,
                        cells=cells)
    bad_codes = np.flatnonzero(al.misaligned[:-1])
    names = np.asarray(rids.to_pylist(), dtype=object)[bad_codes]
    return AlignedChunk(al.evidence, [str(r) for r in names], al.natural_end, code, rids, bad_codes, n_req,
                    al.bad_steps, al.checked_steps)


def sglang_arrays(steps: pa.Table, logprobs: pa.Table | None, gamma: int):
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


@dataclass
class ChunkInputs:
    """One chunk's arrays, as :func:`estimate_ceiling` takes them."""

    steps: pa.Table
    drafts: np.ndarray
    conf: np.ndarray
    window: np.ndarray
    correct: np.ndarray
    greedy: np.ndarray
    aligned: AlignedChunk
    temperature: np.ndarray        # [n] recorded, else overridden temperature (NaN unknown)
    sampling: np.ndarray           # [n] int8: greedy | sampled | unknown, as codes in sampling.KINDS
    sampling_source: np.ndarray    # [n] int8: recorded | override | inferred | unknown, codes in sampling.SOURCES


@dataclass(frozen=True)
class InferredSampling:
    """The run's stated and inferred sampling per rid (read once for the whole run)."""

    rids: pa.Array             # rids with token evidence
    kinds: np.ndarray          # their inferred sampling, as codes in sampling.KINDS
    override_rids: pa.Array    # rids of stored per-request overrides (ingest --workload-map)
    override_temps: np.ndarray
    run_override: float | None  # stored run-wide override (ingest --temperature)


_OVERRIDES_SQL = "SELECT rid, temperature FROM sampling_overrides WHERE run_id = $run ORDER BY rid NULLS LAST"


_UNRECORDED_SQL = """
SELECT count(*) FROM (SELECT DISTINCT rid FROM step_reqs WHERE run_id = $run AND rid IS NOT NULL) AS s
WHERE s.rid NOT IN (SELECT rid FROM requests WHERE run_id = $run AND rid IS NOT NULL AND temperature IS NOT NULL)
"""
_NO_EVIDENCE = pa.table({"rid": pa.array([], pa.string()), "n_topk": pa.array([], pa.int64()),
                         "n_top1": pa.array([], pa.int64()), "log_p_top1": pa.array([], pa.float64())})


def infer_sampling(con, run_id: str, alpha: float) -> InferredSampling:
    """The run's sampling evidence; its tokens' top-k are read (a pass over the run's tokens) only when
    some request recorded no temperature: a recorded one decides, whatever the tokens say."""
    unrecorded = con.sql(_UNRECORDED_SQL, params={"run": run_id}).fetchall()[0][0]
    evidence = fetch(con, sampling.TOKEN_EVIDENCE_SQL, {"run": run_id}) if unrecorded else _NO_EVIDENCE
    log_p = column_array(evidence, "log_p_top1", np.float64, 0.0)
    kinds = sampling.infer_greedy(column_array(evidence, "n_topk", np.int64, 0), column_array(evidence, "n_top1", np.int64, 0),
                                  log_p, alpha=alpha)
    stated = fetch(con, _OVERRIDES_SQL, {"run": run_id})
    per_rid = stated.filter(pc.is_valid(stated.column("rid")))
    run_wide = stated.filter(pc.is_null(stated.column("rid"))).column("temperature").to_pylist()
    return InferredSampling(evidence.column("rid").combine_chunks(),
                     sampling.kind_codes(sampling.pool_run(kinds, log_p, alpha=alpha)),
                     per_rid.column("rid").combine_chunks(), column_array(per_rid, "temperature", np.float64, np.nan),
                     float(run_wide[-1]) if run_wide else None)


def _sampling(steps: pa.Table, inferred: InferredSampling, temperature: float | None) -> tuple[np.ndarray, ...]:
    """Per step: the temperature known (recorded, else stated), the sampling and its source (as codes).

    Stated, in order: the request's own override (an ingest map), ``temperature``
    (``estimate --temperature``), the run's stored ``ingest --temperature``.
    """
    recorded = column_array(steps, "temperature", np.float64, np.nan)
    fallback = temperature if temperature is not None else inferred.run_override
    override = np.full(steps.num_rows, np.nan if fallback is None else float(fallback))
    if len(inferred.override_rids):   # a lookup of every step's rid: only when there is a map to look in
        ocode, _ = codes(steps.column("rid"), inferred.override_rids)
        override = np.where(ocode >= 0, np.append(inferred.override_temps, np.nan)[ocode], override)
    if len(inferred.rids):
        code, _ = codes(steps.column("rid"), inferred.rids)
        inferred = np.append(inferred.kinds, np.int8(sampling.UNKNOWN_CODE))[code]   # code -1: the unknown
    else:
        inferred = np.broadcast_to(np.int8(sampling.UNKNOWN_CODE), (steps.num_rows,))
    kind, source = sampling.resolve_sampling_codes(recorded, override, inferred)
    return np.where(np.isnan(recorded), override, recorded), kind, source


def load_inputs(con, run_id: str, root, chunk: Chunk, gamma: int | None, *, inferred: InferredSampling,
            temperature: float | None = None, mode: str | None = None,
            requests: RunRequests | None = None) -> tuple[ChunkInputs, str, int]:
    steps, mode, gamma = load_steps(con, run_id, root, chunk, gamma=gamma, mode=mode, requests=requests)
    drafts = padded_lists(steps.column("draft_tokens"), fill=-1, dtype=np.int64)
    if drafts.shape[1] != gamma:  # an empty chunk
        drafts = np.zeros((steps.num_rows, gamma), np.int64)
    conf = padded_lists(steps.column("confidence"), fill=np.nan, dtype=np.float64)
    if conf.shape[1] != gamma:
        conf = np.full((steps.num_rows, gamma), np.nan)
    window = column_array(steps, "verify_len", np.int64, 1) - 1
    correct = column_array(steps, "correct_drafts", np.int64, 0)
    temp, kind, source = _sampling(steps, inferred, temperature)
    greedy = kind == sampling.GREEDY_CODE   # unknown sampling: the sampled rule
    aligned = aligned_evidence(con, run_id, steps, drafts, correct, chunk, used_cells(window, correct, greedy, gamma))
    return ChunkInputs(steps, drafts, conf, window, correct, greedy, aligned, temp, kind, source), mode, gamma
