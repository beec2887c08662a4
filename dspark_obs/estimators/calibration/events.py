"""The events a confidence head predicts, and their labels read from a run.

The event at position ``k`` (1..gamma) of a request-step is *the first k drafts
all survive a full-block verify*; the head predicts it with its survival
``S_k = c_1 * ... * c_k`` (the record's ``survival``, else the cumulative
product of ``confidence``) — SGLang's own probe scores exactly this pair
(``dspark_observability.PerPositionConfidenceMetrics``).

Where the truth comes from (``labels``):

``observed``
    What the run's own record decides.  A cap-accept or static step verified
    the whole block, so every position is known.  A compact step with window
    ``w`` and ``c`` accepted drafts knows positions ``k <= w`` directly, and,
    when the chain broke inside the window (``c < w``), that every ``k > c`` is
    false — a full-block verify would have rejected the same draft.  Only the
    tail of a *censored* step (``c == w < gamma``) is unknown and left out.
    Those are exactly the steps that survived their whole window, so what is
    left is biased twice: deep positions are labelled mostly on steps the
    scheduler trusted (the labelled share of positives is higher than in the
    population), and among steps with the same predicted survival the likely
    positives are missing (the head looks more over-confident than it is).
``reconstructed``
    The block-accept estimator's ceiling (table ``ceiling``, written by
    ``dspark-obs estimate``).  The label at position ``k`` is the
    estimated probability that a full verify accepts the first ``k`` drafts
    (``ceiling.survival_mid``): 0/1 wherever the estimate is exact (uncensored
    steps; greedy censored steps with ``lo == hi``), soft otherwise; the labels
    of a step sum to its estimated acceptance ``mid``.  Older ceiling rows
    without it fall back to ``clip(mid - (k - 1), 0, 1)``, which spreads
    ``mid`` over the positions wrongly.
``companion``
    The paired cap-accept step of a companion run (same rid and anchor
    ``prefix_len``, same drafts; :mod:`dspark_obs.estimators.pairing`):
    ``correct_drafts + cap_trim >= k``.  Compact steps without such a pair are
    left out.

:func:`load_events` reads a run's predictions and labels as :class:`RunEvents`
(arrays, no metrics); :func:`events_query` and :func:`events_sql` give its SQL to
:mod:`dspark_obs.estimators.calibration.chunks`, which reads a large run a chunk
of whole requests at a time, the observed and reconstructed labels of a chunk from
one read (:class:`OuterRead`, :func:`split_outer`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs.acceptance import censored, mode_block_accept
from dspark_obs.estimators import pairing
from dspark_obs.estimators.chunks import ALL
from dspark_obs.estimators.row_order import order_of, rid_ranks
from dspark_obs.estimators.run_requests import RunRequests

__all__ = [
    "LABEL_KINDS", "RunEvents", "CalibrationDataError", "block_events", "observed_events",
    "load_events", "events_query", "events_sql", "OuterRead", "with_estimates", "split_outer", "run_info",
]

LABEL_KINDS = ("observed", "reconstructed", "companion")


# -- events and labels ------------------------------------------------------------


def block_events(block_accept, *, gamma: int) -> np.ndarray:
    """Labels of the events 'first k drafts survive', k = 1..gamma, from a full-block acceptance.

    ``block_accept`` (shape (n,)) counts accepted drafts of a full block; a
    fractional value (an estimate) gives soft labels ``clip(A - (k - 1), 0, 1)``
    that sum to ``A``.  Returns float64 of shape (n, gamma).

    >>> block_events([2, 0.5], gamma=3).tolist()
    [[1.0, 1.0, 0.0], [0.5, 0.0, 0.0]]
    """
    a = np.asarray(block_accept, dtype=np.float64).reshape(-1, 1)
    return np.clip(a - np.arange(gamma), 0.0, 1.0)


def observed_events(correct_drafts, window, *, gamma: int) -> np.ndarray:
    """What a compact step's record decides; NaN where the censored tail leaves it unknown.

    Positions ``k <= window`` were verified; when the chain broke inside the window
    (``correct_drafts < window``) every later event is false.  The positions beyond
    the window of a step that accepted its whole window are unknown (NaN).

    >>> observed_events([1, 2], [3, 2], gamma=4).tolist()
    [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, nan, nan]]
    """
    c = np.asarray(correct_drafts, dtype=np.int64).reshape(-1, 1)
    w = np.asarray(window, dtype=np.int64).reshape(-1, 1)
    y = block_events(c[:, 0], gamma=gamma)
    known = (np.arange(1, gamma + 1) <= w) | (c < w)
    return np.where(known, y, np.nan)


class CalibrationDataError(ValueError):
    """The store lacks what a calibration needs; the message names the fix."""


@dataclass(frozen=True)
class RunEvents:
    """A run's request-steps as arrays: predictions and labels per position.

    ``survival``, ``confidence`` and ``y`` have shape (n, gamma); ``y`` is NaN
    where the truth is unknown (and ``confidence`` where it was not sent).
    ``rid`` is the request (the bootstrap's unit); ``dp_rank`` and ``forward_ct``
    identify the step.  ``rid_code`` and ``workload_code``, when the reader made
    them, number the distinct values of ``rid`` and ``workload`` with non-negative
    integers (equal codes, equal values): the chunk sums compare integers instead
    of Python strings.  A copy holding other rows must carry their codes, or None.
    """

    run_id: str
    labels: str
    mode: str
    gamma: int
    label_source: str
    rid: np.ndarray
    workload: np.ndarray
    dp_rank: np.ndarray
    forward_ct: np.ndarray
    survival: np.ndarray
    confidence: np.ndarray
    y: np.ndarray
    notes: tuple[str, ...] = ()
    rid_code: np.ndarray | None = None
    workload_code: np.ndarray | None = None


_STEPS_SQL = """
SELECT s.rid, s.req_pool_index, s.dp_rank, s.forward_ct, s.prefix_len, s.verify_len, s.correct_drafts,
       s.cap_trim, s.confidence, s.survival{extra}
FROM {step_reqs} s {join}
WHERE s.run_id = $run AND (s.confidence IS NOT NULL OR s.survival IS NOT NULL) AND {chunk}
"""


def events_sql(query: str, chunk=None, froms: dict | None = None) -> str:
    """:func:`events_query`'s SQL for the requests of ``chunk`` (all when None), reading ``step_reqs`` and
    ``ceiling`` from ``froms`` (default: their views; see :func:`chunk_events_sql`).  Its rows come in the
    scan's order and without their request's workload: :func:`events_of` orders them by request and looks
    the workload up (a join and an ``ORDER BY`` here cost 0.1 of a chunk's 0.25 CPU s at 10M)."""
    on = (lambda col: "TRUE") if chunk is None else chunk.on
    froms = {"step_reqs": "step_reqs", "ceiling": "ceiling", **(froms or {})}
    return query.format(chunk=on("s.rid"), chunk_p=on("p.rid"), chunk_e=on("e.rid"), **froms)


def chunk_events_sql(con, query: str, params: dict, chunk) -> tuple[str, dict]:
    """``(sql, parameters)`` of :func:`events_sql` for ``chunk``, reading only the files that may hold its
    rids (:meth:`~dspark_obs.estimators.chunks.Chunk.sources`)."""
    chunk = ALL if chunk is None else chunk
    froms, files = chunk.sources(con, params["run"], *(t for t in ("step_reqs", "ceiling") if "{" + t + "}" in query))
    return events_sql(query, chunk, froms), {**params, **chunk.params, **files}


def fetch(con, sql_text: str, params: dict) -> pa.Table:
    return con.sql(sql_text, params=params).to_arrow_table()  # DuckDB 2: fetch results fully


def run_info(con, run_id: str) -> tuple[str, int | None]:
    """The run's mode (``runs``, else its steps' most common) and gamma (None when not recorded)."""
    rows = con.sql("SELECT mode, gamma FROM runs WHERE run_id = $run", params={"run": run_id}).fetchall()
    mode, gamma = rows[0] if rows else (None, None)
    if not mode:
        modes = con.sql("SELECT mode, count(*) FROM steps WHERE run_id = $run AND mode <> '' GROUP BY 1 "
                        "ORDER BY 2 DESC", params={"run": run_id}).fetchall()
        mode = modes[0][0] if modes else ""
    return mode or "", gamma


def _list_matrix(column: pa.ChunkedArray, gamma: int, name: str) -> np.ndarray:
    """A list<float> column as (n, gamma) float64; null rows become NaN."""
    arr = column.combine_chunks()
    if arr.null_count == 0:   # the common case: one reshape of the values, no row mask
        lengths = pc.list_value_length(arr)
        if len(arr) and (pc.min(lengths).as_py() != gamma or pc.max(lengths).as_py() != gamma):
            raise CalibrationDataError(f"{name} lists have lengths {sorted(set(lengths.to_pylist()))}, "
                                       f"expected gamma = {gamma}")
        return np.asarray(pc.list_flatten(arr).to_numpy(zero_copy_only=False), dtype=np.float64).reshape(len(arr), gamma)
    out = np.full((len(arr), gamma), np.nan)
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False))
    if valid.any():
        lengths = np.asarray(arr.value_lengths().to_numpy(zero_copy_only=False))[valid]
        if np.any(lengths != gamma):
            raise CalibrationDataError(f"{name} lists have lengths {sorted(set(lengths.tolist()))}, expected gamma = {gamma}")
        out[valid] = np.asarray(arr.filter(pa.array(valid)).flatten().to_numpy(zero_copy_only=False),
                                dtype=np.float64).reshape(-1, gamma)
    return out


def load_events(con, run_id: str, *, labels: str = "observed", companion: str | None = None,
                chunk=None) -> RunEvents:
    """Read one run's predictions and the labels of kind ``labels`` from the views.

    ``companion`` names the cap-accept companion (default: the run recorded with
    ``companion_of = run_id``).  Raises :class:`CalibrationDataError` with the fix
    when the run, its confidences, its companion or its ceiling estimates are missing.
    ``chunk`` (a :class:`~dspark_obs.estimators.chunks.Chunk`) reads only
    some requests; a chunk without labelled steps gives empty events.
    """
    query, params, mode, gamma, source = events_query(con, run_id, labels=labels, companion=companion)
    table = fetch(con, *chunk_events_sql(con, query, params, chunk))
    requests = RunRequests.read(con, run_id, ALL if chunk is None else chunk)
    ev, counts = events_of(table, run_id, labels, mode, gamma, source, requests)
    if chunk is None:
        counts["total"] = check_labelled(con, run_id, labels, mode, source, table.num_rows)
        ev = dataclasses.replace(ev, notes=notes_of(labels, mode, params.get("method"), counts))
    return ev


def notes_of(labels: str, mode: str, method: str | None, counts: dict) -> tuple[str, ...]:
    """What the labels left out, from the counts of :func:`events_of` summed over the run."""
    total, rows = counts["total"], counts["rows"]
    notes = []
    if labels == "companion":
        notes.append(f"{total - rows} of {total} steps have no companion step with the same "
                     f"drafts at the same anchor and are left out")
    elif labels == "reconstructed" and rows < total:
        notes.append(f"{total - rows} of {total} steps have no ceiling estimate and are left out")
    if labels == "reconstructed":
        notes.append(f"ceiling method {method or 'unnamed'}: {counts['fractional']} of "
                     f"{rows} steps have a fractional estimate (soft labels)")
    elif labels == "observed" and mode not in ("cap-accept", "static"):
        notes.append(f"{counts['censored']} of {rows} steps are censored (whole window accepted): "
                     "their positions beyond the window are unlabelled")
    return tuple(notes)


def events_query(con, run_id: str, *, labels: str = "observed",
                 companion: str | None = None) -> tuple[str, dict, str, int | None, str]:
    """``(sql, params, mode, gamma, label source)`` of a run's events, the SQL to be completed by
    :func:`events_sql`.  Raises :class:`CalibrationDataError` as :func:`load_events`."""
    if labels not in LABEL_KINDS:
        raise ValueError(f"labels must be one of {', '.join(LABEL_KINDS)}, got {labels!r}")
    mode, gamma = run_info(con, run_id)
    if mode in ("cap-accept", "static") and labels != "observed":
        raise CalibrationDataError(
            f"run {run_id!r} is a {mode} run: it verified whole blocks, so its own labels are the "
            f"full-block truth; use labels 'observed' (--labels observed) instead of {labels!r}")
    params: dict[str, Any] = {"run": run_id}
    extra, join, source = "", "", run_id
    if labels == "companion":
        companion = companion or pairing.companion_of(con, run_id)
        if companion is None:
            raise CalibrationDataError(
                f"no cap-accept companion recorded for run {run_id!r} (runs.companion_of); replay its "
                "requests on a cap-accept server (dspark-obs demo does this) or name one with --companion RUN")
        params["companion"], source = companion, companion
        join = (f"JOIN ({pairing.PAIRED_STEPS_SQL}) p ON p.rid = s.rid AND p.forward_ct = s.forward_ct "
                "AND p.dp_rank = s.dp_rank AND p.same_drafts AND {chunk_p}")
        extra = ", p.true_block_accept"
    elif labels == "reconstructed":
        try:  # the estimator writes one method per run; prefer 'default' if several are there
            methods = [m for m, in con.sql("SELECT DISTINCT coalesce(method, '') FROM ceiling WHERE run_id = $run "
                                           "ORDER BY 1", params=params).fetchall()]
        except Exception:  # the ceiling estimator's table is not registered
            methods = []
        if not methods:
            raise CalibrationDataError(
                f"no ceiling estimates for run {run_id!r}; run `dspark-obs estimate --data DATA --run "
                f"{run_id}` first, or use --labels observed|companion")
        params["method"] = "default" if "default" in methods else methods[0]
        extra, source = ", e.mid, e.survival_mid", "ceiling"
        join = ("JOIN {ceiling} e ON e.run_id = s.run_id AND e.rid = s.rid AND e.forward_ct = s.forward_ct "
                "AND e.prefix_len = s.prefix_len AND coalesce(e.method, '') = $method AND {chunk_e}")
    return (_STEPS_SQL.format(extra=extra, join=join, chunk="{chunk}", chunk_p="{chunk_p}", chunk_e="{chunk_e}",
                              step_reqs="{step_reqs}", ceiling="{ceiling}"),
            params, mode, gamma, source)


_ESTIMATES_SQL = """
SELECT e.rid, e.forward_ct, e.prefix_len, e.mid, e.survival_mid FROM {ceiling} e
WHERE e.run_id = $run AND coalesce(e.method, '') = $method AND {chunk_e}
"""


@dataclass(frozen=True)
class OuterRead:
    """Every step with predictions and, where there is one, its ceiling estimate (columns ``mid``,
    ``survival_mid``, ``has_estimate``): a chunk's observed and reconstructed events from one read of
    each table (:func:`split_outer`).

    The estimates are matched to the steps here, on the keys the reconstructed labels join on (rid,
    ``forward_ct``, ``prefix_len``): a join in DuckDB gave the steps out of request order, and reading,
    joining and reordering them cost 0.31 CPU s a chunk at 10M request-steps.
    """

    steps_sql: str
    params: dict       # run and ceiling method

    @classmethod
    def of(cls, con, run_id: str) -> "OuterRead":
        """Raises :class:`CalibrationDataError` as :func:`events_query` for reconstructed labels."""
        _, params, *_ = events_query(con, run_id, labels="reconstructed")
        steps_sql, *_ = events_query(con, run_id, labels="observed")
        return cls(steps_sql, params)

    def read(self, con, chunk) -> pa.Table | None:
        """The chunk's steps with their estimates; None when a step has several (the reads apart then)."""
        steps = fetch(con, *chunk_events_sql(con, self.steps_sql, {"run": self.params["run"]}, chunk))
        estimates = fetch(con, *chunk_events_sql(con, _ESTIMATES_SQL, self.params, chunk))
        return with_estimates(steps, estimates)


def with_estimates(steps: pa.Table, estimates: pa.Table) -> pa.Table | None:
    """``steps`` with the ``mid`` and ``survival_mid`` of the estimate of the same rid, ``forward_ct`` and
    ``prefix_len`` (null, and ``has_estimate`` false, where there is none); None when a step's rid and
    ``forward_ct`` match several estimates."""
    enc = pc.dictionary_encode(steps.column("rid").combine_chunks())
    step_code = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    est_code = pc.fill_null(pc.index_in(estimates.column("rid"), value_set=enc.dictionary), -1)
    est_code = est_code.to_numpy(zero_copy_only=False).astype(np.int64)
    step_ct, est_ct = (t.column("forward_ct").to_numpy().astype(np.int64) for t in (steps, estimates))
    span = int(max(step_ct.max(initial=0), est_ct.max(initial=0))) + 1
    if step_ct.min(initial=0) < 0 or est_ct.min(initial=0) < 0 or (len(enc.dictionary) + 1) * span >= 2 ** 62:
        return None
    rows = np.flatnonzero(est_code >= 0)
    keys = est_code[rows] * span + est_ct[rows]
    order = np.argsort(keys, kind="stable")
    keys, rows = keys[order], rows[order]
    if keys.size and (np.diff(keys) == 0).any():
        return None
    want = step_code * span + step_ct
    at = np.minimum(np.searchsorted(keys, want), max(keys.size - 1, 0))
    hit = (step_code >= 0) & (keys.size > 0)
    if keys.size:
        est_prefix = estimates.column("prefix_len").to_numpy().astype(np.int64)
        hit &= (keys[at] == want) & (est_prefix[rows[at]] == steps.column("prefix_len").to_numpy())
    which = pa.array(np.where(hit, rows[at] if keys.size else 0, 0), mask=~hit)
    return (steps.append_column("mid", pc.take(estimates.column("mid"), which))
            .append_column("survival_mid", pc.take(estimates.column("survival_mid"), which))
            .append_column("has_estimate", pa.array(hit)))


def check_labelled(con, run_id: str, labels: str, mode: str, source: str, labelled: int,
                   predicted: int | None = None) -> int:
    """The run has steps, confidences, and labelled steps (else the fix); its steps.

    ``predicted``: the run's steps with a confidence or survival, when the caller has counted them
    (:func:`~dspark_obs.estimators.calibration.chunks.run_steps`); else they are counted here, which
    decodes both list columns of every step (0.7 CPU s at 10M rows).
    """
    if predicted is None:
        total = con.sql("SELECT count(*), count(confidence) + count(survival) FROM step_reqs WHERE run_id = $run",
                        params={"run": run_id}).fetchall()[0]
    else:
        total = (con.sql("SELECT count(*) FROM step_reqs WHERE run_id = $run", params={"run": run_id}).fetchall()[0][0],
                 predicted)
    if total[0] == 0:
        known = [r[0] for r in con.sql("SELECT DISTINCT run_id FROM step_reqs ORDER BY 1").fetchall()]
        raise CalibrationDataError(f"no request-steps for run {run_id!r}; runs with steps: "
                                   f"{', '.join(known) or 'none'} (collect one with dspark-obs collect or demo)")
    if total[1] == 0:
        raise CalibrationDataError(
            f"run {run_id!r} recorded no confidence or survival ({mode or 'unknown'} mode): static mode builds "
            "no confidence head; calibrate a compact or cap-accept run")
    if labelled == 0:
        raise CalibrationDataError(f"no request-steps of run {run_id!r} have {labels} labels "
                                   f"(source {source!r}); check that the runs pair up (same prompts and seeds)")
    return int(total[0])


def predictions_of(table: pa.Table, gamma: int | None) -> tuple[int, np.ndarray, np.ndarray]:
    """``(gamma, survival, confidence)`` of the fetched steps, each (n, gamma): a missing one from the other."""
    if not gamma:
        gamma = max(pc.max(pc.list_value_length(table.column(c))).as_py() or 0 for c in ("confidence", "survival"))
    conf = _list_matrix(table.column("confidence"), gamma, "confidence")
    surv = _list_matrix(table.column("survival"), gamma, "survival")
    if np.isnan(surv).any():   # each missing one from the other (computed only when one is missing)
        surv = np.where(np.isnan(surv), np.cumprod(conf, axis=1), surv)
    if np.isnan(conf).any():
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = surv / np.concatenate([np.ones((len(surv), 1)), surv[:, :-1]], axis=1)
        conf = np.where(np.isnan(conf), ratio, conf)
    return gamma, surv, conf


def split_outer(table: pa.Table, run_id: str, mode: str, gamma: int | None, kinds: tuple[str, ...],
                requests: RunRequests) -> dict[str, tuple[RunEvents, dict]]:
    """The events and counts of each of ``kinds`` (observed, reconstructed) from one :class:`OuterRead`:
    :func:`events_of` of each, the predictions converted and the steps ordered once.

    The reconstructed events are the rows with an estimate: those the inner join gives.
    """
    shared = predictions_of(table, gamma) if gamma else None  # else each kind's own gamma, as before
    has = table.column("has_estimate").to_numpy(zero_copy_only=False).astype(bool)
    keys = _keys_of(table, requests) if has.all() else None
    out = {}
    if "observed" in kinds:
        out["observed"] = events_of(table, run_id, "observed", mode, gamma, run_id, requests, predictions=shared,
                                    keys=keys)
    if "reconstructed" in kinds:
        part, own = table, shared
        if keys is None:
            part = table.filter(pa.array(has))
            own = None if shared is None else (shared[0], shared[1][has], shared[2][has])
        out["reconstructed"] = events_of(part, run_id, "reconstructed", mode, gamma, "ceiling", requests,
                                         predictions=own, keys=keys)
    return out


@dataclass(frozen=True)
class _Keys:
    """A fetched table's request order (``order``: None when it came sorted) and its key columns in that order."""

    order: np.ndarray | None
    unit: np.ndarray
    workload: np.ndarray
    dp_rank: np.ndarray
    forward_ct: np.ndarray
    unit_code: np.ndarray
    workload_code: np.ndarray


def _keys_of(table: pa.Table, requests: RunRequests) -> _Keys:
    rid = table.column("rid")
    unit = rid if not rid.null_count else pc.coalesce(rid, pc.binary_join_element_wise(
        "pool-", pc.cast(table.column("req_pool_index"), pa.string()), ""))
    workload = pc.fill_null(requests.per_step(rid).column("workload"), "unknown")
    dp_rank, forward_ct = table.column("dp_rank").to_numpy(), table.column("forward_ct").to_numpy()
    order = order_of([rid_ranks(rid), dp_rank.astype(np.int64), forward_ct.astype(np.int64)])
    if order is not None:
        dp_rank, forward_ct = dp_rank[order], forward_ct[order]
    (unit, unit_code), (workload, workload_code) = (_coded(a, order) for a in (unit, workload))
    return _Keys(order, unit, workload, dp_rank, forward_ct, unit_code, workload_code)


def _coded(values: pa.Array | pa.ChunkedArray, order: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Strings as an object array and as integer codes (null: a code of its own), rows in ``order``.

    Each distinct string becomes a Python object once, not once a row, and rows move as integers
    (``to_numpy`` of a chunk's 150k rids and workloads cost 13 ms, and finding its units among them 10 ms)."""
    enc = pc.dictionary_encode(values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)
    n = len(enc.dictionary)
    code = pc.fill_null(enc.indices, n).to_numpy(zero_copy_only=False).astype(np.int64)
    if order is not None:
        code = code[order]
    names = np.empty(n + 1, dtype=object)
    names[:n] = enc.dictionary.to_pylist()
    return names[code], code


def events_of(table: pa.Table, run_id: str, labels: str, mode: str, gamma: int | None, source: str,
              requests: RunRequests, predictions: tuple | None = None, keys: _Keys | None = None) -> tuple[RunEvents, dict]:
    """Arrays and labels of the fetched steps in request order (rid, rank, step: how part files clustered
    by request are scanned, so that they are rarely permuted; any layout of the same rows gives the same
    arrays), and the counts behind the notes (``requests``: the run's, for the workloads;
    ``predictions`` and ``keys``: those of ``table``, when the caller has them)."""
    counts = {"rows": table.num_rows, "censored": 0, "fractional": 0}
    gamma, surv, conf = predictions if predictions is not None else predictions_of(table, gamma)

    col = {name: table.column(name).to_numpy().astype(np.int64) for name in ("verify_len", "correct_drafts", "cap_trim")}
    col["window"] = col.pop("verify_len") - 1
    if labels == "companion":
        y = block_events(table.column("true_block_accept").to_numpy(), gamma=gamma)
    elif labels == "reconstructed":
        mid = _ceiling_accept(table, col["correct_drafts"], col["window"], gamma)
        y = block_events(mid, gamma=gamma)
        if "survival_mid" in table.column_names:
            per_position = _list_matrix(table.column("survival_mid"), gamma, "survival_mid")
            y = np.where(np.isnan(per_position).any(axis=1, keepdims=True), y, np.clip(per_position, 0.0, 1.0))
        counts["fractional"] = int(np.sum(mid != np.round(mid)))
    elif mode in ("cap-accept", "static"):
        y = block_events(mode_block_accept(mode, col["correct_drafts"], col["cap_trim"]), gamma=gamma)
    else:
        y = observed_events(col["correct_drafts"], col["window"], gamma=gamma)
        counts["censored"] = int(censored(col["window"], col["correct_drafts"], gamma).sum())
    keys = keys or _keys_of(table, requests)
    if keys.order is not None:
        surv, conf, y = (a[keys.order] for a in (surv, conf, y))
    return RunEvents(run_id, labels, mode, gamma, source, keys.unit, keys.workload, keys.dp_rank, keys.forward_ct,
                     surv, conf, y, rid_code=keys.unit_code, workload_code=keys.workload_code), counts


def _ceiling_accept(table: pa.Table, correct: np.ndarray, window: np.ndarray, gamma: int) -> np.ndarray:
    """The ceiling's ``mid`` in drafts; checks its unit on the steps whose acceptance is known."""
    mid = np.asarray(table.column("mid").to_numpy(zero_copy_only=False), dtype=np.float64)
    exact = ~censored(window, correct, gamma)  # the block acceptance is correct_drafts
    if exact.any() and not np.allclose(mid[exact], correct[exact]):
        if np.allclose(mid[exact], correct[exact] + 1):  # acc_len units (SGLang's lo = w + 1 + extra)
            mid = mid - 1.0
        else:
            raise CalibrationDataError("ceiling.mid disagrees with correct_drafts on uncensored steps; "
                                       "re-run `dspark-obs estimate` for this run")
    return np.where(np.isnan(mid), np.nan, np.clip(mid, 0.0, gamma))
