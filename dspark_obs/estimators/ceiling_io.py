"""The thin layer of the ceiling estimator: read a run from the views, compute, write results.

Reads ``runs``, ``step_reqs``, ``requests`` and ``tokens`` of one run through
DuckDB, turns them into arrays (requests become integer codes; list columns
become padded matrices), calls the pure functions, finds a truth to validate
against, and replaces the run's partitions of ``ceiling``, ``ceiling_summary``
and ``ceiling_validation``.  Use it through
:func:`dspark_obs.estimators.ceiling.estimate_run`.
"""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs import sql as sqlmod
from dspark_obs.estimators import ceiling_stats, pairing
from dspark_obs.estimators.ceiling import CeilingRun, estimate_ceiling
from dspark_obs.estimators.ceiling_evidence import check_alignment, draft_evidence, padded_lists, token_index
from dspark_obs.store import validate_run_id

__all__ = ["run_estimate", "RESULT_TABLES"]

RESULT_TABLES = ("ceiling", "ceiling_summary", "ceiling_validation")
_MISALIGNED_SHARE = 0.2

_STEPS_SQL = """
SELECT s.dp_rank, s.forward_ct, s.segment, s.rid, s.prefix_len, s.verify_len, s.correct_drafts,
       s.cap_trim, s.bonus_token, s.draft_tokens, s.confidence, s.emu_block_accept,
       s.emu_expected_block_accept, q.workload, q.temperature, q.prompt_tokens,
       q.completion_tokens, q.finish_reason
FROM step_reqs AS s
LEFT JOIN (
    SELECT rid, any_value(workload) AS workload, any_value(temperature) AS temperature,
           any_value(prompt_tokens) AS prompt_tokens, any_value(completion_tokens) AS completion_tokens,
           any_value(finish_reason) AS finish_reason
    FROM requests WHERE run_id = $run GROUP BY rid
) AS q ON s.rid = q.rid
WHERE s.run_id = $run
ORDER BY s.rid, s.prefix_len, s.dp_rank, s.forward_ct
"""
_TOKENS_SQL = "SELECT rid, pos, token_id, logprob, top_ids, top_logprobs FROM tokens WHERE run_id = $run"


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


def _truth(con, run_id: str, steps: pa.Table, mode: str, companion: str | None) -> tuple[np.ndarray, str | None]:
    """Realised full-block acceptance per step (NaN unknown) and where it came from."""
    n = steps.num_rows
    if companion is not None:
        paired = pairing.paired_steps(con, run_id, companion)
        paired = paired.filter(pc.equal(paired.column("same_drafts"), True))
        keys = pa.table({"rid": steps.column("rid"), "dp_rank": steps.column("dp_rank"),
                         "forward_ct": steps.column("forward_ct"), "row": pa.array(np.arange(n))})
        joined = keys.join(paired.select(["rid", "dp_rank", "forward_ct", "true_block_accept"]),
                           ["rid", "dp_rank", "forward_ct"], join_type="inner")
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


def _load_steps(con, run_id: str, root) -> tuple[pa.Table, str, int]:
    steps = _fetch(con, _STEPS_SQL, {"run": run_id})
    if steps.num_rows == 0:
        known = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM step_reqs ORDER BY 1").fetchall()]
        raise LookupError(f"run {run_id!r} has no step_reqs in {root}; runs with steps: "
                          f"{', '.join(known) or 'none (collect one: dspark-obs demo or dspark-obs collect)'}")
    mode, gamma = _run_meta(con, run_id)
    lengths = pc.list_value_length(steps.column("draft_tokens")).to_numpy(zero_copy_only=False)
    gamma = int(gamma or lengths.max())
    if (lengths != gamma).any():
        raise ValueError(f"run {run_id!r}: draft_tokens hold {sorted(set(lengths.tolist()))} tokens, "
                         f"expected gamma={gamma} (runs.gamma); re-collect the run or fix runs.gamma")
    return steps, mode, gamma


def _aligned_evidence(con, run_id: str, steps: pa.Table, drafts: np.ndarray, correct: np.ndarray):
    """Evidence per drafted position, the requests whose tokens do not line up, and natural ends.

    Output position of ``d_1`` = ``prefix_len - prompt_tokens + 1``; a missing
    ``prompt_tokens`` is the request's smallest ``prefix_len`` (its first decode
    step, when recorded).  A request whose committed tokens disagree with the
    tokens table on more than 20% of its steps is walked without tokens.
    """
    code, rids = _codes(steps.column("rid"))
    n_req = len(rids)
    slot = np.where(code < 0, n_req, code)      # per-request arrays keep a spare slot for no rid
    prefix = _np(steps, "prefix_len", np.int64, 0)
    first_seen = np.full(n_req + 1, np.iinfo(np.int64).max)
    np.minimum.at(first_seen, slot, prefix)
    prompt = _np(steps, "prompt_tokens", np.float64, np.nan)
    first_pos = prefix - np.where(np.isnan(prompt), first_seen[slot], prompt).astype(np.int64) + 1

    tokens = _fetch(con, _TOKENS_SQL, {"run": run_id})
    tcode, _ = _codes(tokens.column("rid"), rids)
    tokens, tcode = tokens.filter(pa.array(tcode >= 0)), tcode[tcode >= 0]
    index = token_index(tcode, _np(tokens, "pos", np.int64, -1), _np(tokens, "token_id", np.int64, -1),
                        logprob=_np(tokens, "logprob", np.float64, np.nan),
                        top_ids=padded_lists(tokens.column("top_ids"), fill=-1, dtype=np.int64),
                        top_logprobs=padded_lists(tokens.column("top_logprobs"), fill=np.nan, dtype=np.float64))
    evidence = draft_evidence(index, code, first_pos, drafts)
    aligned = check_alignment(evidence, drafts, correct, _np(steps, "bonus_token", np.int64, -1))
    bad = np.bincount(slot[aligned < 0], minlength=n_req + 1)
    checked = np.bincount(slot[aligned != 0], minlength=n_req + 1)
    if checked.sum() and bad.sum() > 0.5 * checked.sum():
        raise ValueError(f"run {run_id!r}: {int(bad.sum())} of {int(checked.sum())} steps commit tokens that "
                         "differ from the tokens table at their positions; requests.prompt_tokens must be the "
                         "prompt length (output position = prefix_len - prompt_tokens + 1), and tokens must "
                         "come from the same run — re-collect with the driver (dspark-obs collect --workload)")
    misaligned = (checked > 0) & (bad > _MISALIGNED_SHARE * checked)
    misaligned[-1] = False
    if misaligned.any():
        evidence = draft_evidence(index, np.where(misaligned[slot], -1, code), first_pos, drafts)
    complete = np.bincount(tcode, minlength=n_req + 1)[slot] == _np(steps, "completion_tokens", np.int64, -1)
    stop = pc.fill_null(pc.equal(steps.column("finish_reason"), "stop"), False).to_numpy(zero_copy_only=False)
    names = np.asarray(rids.to_pylist(), dtype=object)[np.flatnonzero(misaligned[:-1])]
    return evidence, [str(r) for r in names], stop & complete & ~misaligned[slot], code


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


def _ceiling_table(steps: pa.Table, est, window, correct, method: str) -> pa.Table:
    n = steps.num_rows
    cols = {name: steps.column(name) for name in ("dp_rank", "forward_ct", "segment", "rid", "workload",
                                                   "temperature", "prefix_len")}
    return pa.table({
        **cols, "window": pa.array(window.astype(np.int16)), "correct_drafts": pa.array(correct.astype(np.int16)),
        "censored": pa.array(est.walk.censored), "category": pa.array(est.category.astype(str)),
        "walked": pa.array(est.walk.n_walked.astype(np.int16)),
        "lo": pa.array(est.lo), "mid": pa.array(est.mid), "hi": pa.array(est.hi),
        "method": pa.array([method] * n, pa.string()),
    })


def run_estimate(con_or_store, run_id: str, *, companion, method, sglang_logprobs, n_bootstrap: int,
                 seed: int, write: bool) -> CeilingRun:
    validate_run_id(run_id)
    con, store = _open(con_or_store)
    steps, mode, gamma = _load_steps(con, run_id, store.root)
    drafts = padded_lists(steps.column("draft_tokens"), fill=-1, dtype=np.int64)
    conf = padded_lists(steps.column("confidence"), fill=np.nan, dtype=np.float64)
    if conf.shape[1] != gamma:
        conf = np.full((steps.num_rows, gamma), np.nan)
    window = _np(steps, "verify_len", np.int64, 1) - 1
    correct = _np(steps, "correct_drafts", np.int64, 0)
    greedy = _np(steps, "temperature", np.float64, np.nan) == 0.0   # unknown temperature: the sampled rule
    evidence, misaligned, natural_end, code = _aligned_evidence(con, run_id, steps, drafts, correct)
    q_draft, p_draft = _sglang_arrays(steps, sglang_logprobs, gamma)
    est = estimate_ceiling(drafts, window, correct, evidence, greedy=greedy, natural_end=natural_end,
                           confidence=conf, q_draft=q_draft, p_draft=p_draft, method=method)
    ceiling = _ceiling_table(steps, est, window, correct, method)

    workload = pc.fill_null(steps.column("workload"), "unknown").to_numpy(zero_copy_only=False)
    summary_rows = ceiling_stats.summarize(code, workload, acc_len=correct + 1.0, window=window,
                                           censored=est.walk.censored, lo=est.lo, mid=est.mid, hi=est.hi,
                                           n_bootstrap=n_bootstrap, seed=seed)
    summary = pa.Table.from_pylist([{**r, "method": method} for r in summary_rows],
                                   schema=_file_schema("ceiling_summary"))

    if companion is None and mode == "compact":
        companion = pairing.companion_of(con, run_id)
    truth, source = _truth(con, run_id, steps, mode, companion)
    rows = ceiling_stats.validate(est.lo, est.mid, est.hi, truth, censored=est.walk.censored,
                                  category=est.category, workload=workload, greedy=greedy,
                                  emu_expected=_np(steps, "emu_expected_block_accept", np.float64, np.nan))
    companion = companion if source == "companion" else None
    validation = pa.Table.from_pylist(
        [{**r, "method": method, "truth_source": source, "companion_run": companion} for r in rows],
        schema=_file_schema("ceiling_validation")) if rows else None
    if write:
        for table in RESULT_TABLES:
            store.drop_run(table, run_id)
        store.write("ceiling", run_id, ceiling)
        store.write("ceiling_summary", run_id, summary)
        if validation is not None:
            store.write("ceiling_validation", run_id, validation)
    return CeilingRun(run_id=run_id, method=method, gamma=gamma, ceiling=ceiling, summary=summary,
                      validation=validation, truth_source=source, companion=companion,
                      steps_with_truth=int((~np.isnan(truth)).sum()), misaligned_requests=misaligned)


def _file_schema(table: str) -> pa.Schema:
    from dspark_obs import schema

    return schema.TABLES[table]
