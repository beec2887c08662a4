"""Chunks of whole requests, and a deterministic sample of them, for bounded-memory estimates.

A request's steps and tokens depend on each other (the walk reads tokens the
request committed later) but never on another request's, so a run can be
estimated a few requests at a time: memory then follows the chunk, not the
store.  Chunks are contiguous ranges of rids in sorted order (plus one chunk
for steps without a rid), so that concatenating them gives exactly the rows,
in exactly the order, of one pass ordered by rid.

What needs the whole run is handled apart: the acceptance model is fitted on a
**sample** of blocks of consecutive whole requests chosen by a hash of their
first rid (the same requests for the same run, on every machine and version;
every request when the run holds at most ``fit_rows`` steps), and summaries are accumulated from per-chunk
sufficient statistics (:mod:`~dspark_obs.estimators.ceiling.stats`, :mod:`~dspark_obs.estimators.ceiling.validation`).

The predicates are SQL text with bound parameters (``$chunk_lo`` ...), to be
applied to a rid column by the caller's query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dspark_obs import run_files
from dspark_obs.keys import stable_keys

__all__ = ["Chunk", "plan_chunks", "split_chunks", "dealt_groups", "equal_chunks", "sample_requests", "shard_requests", "rid_hash", "DEFAULT_CHUNK_ROWS",
           "DEFAULT_FIT_ROWS", "FIT_PART_ROWS", "SAMPLE_BLOCK_REQUESTS", "SAMPLE_BLOCKS", "sample_parts", "sample_spans"]

DEFAULT_CHUNK_ROWS = 150_000
"""Request-steps per chunk: about 0.5 GB of working memory in the estimator."""
DEFAULT_FIT_ROWS = 200_000
"""Request-steps the acceptance model is fitted on (about 600k verified drafts)."""
SAMPLE_BLOCK_REQUESTS = 64
"""The most consecutive requests (in rid order) per block of a sample (:func:`sample_requests`).  A
sample of single requests chosen by hash touched every row group of a clustered store, so reading it
decoded the whole run (the fit's sample at 10M request-steps: 5.8 CPU s); blocks of up to 64 requests
(about 3k steps) touch one or two row groups each (1.7 CPU s).  A block's requests are neighbours in
rid order (often of one workload, or close in time); the blocks are drawn by hash, at least
:data:`SAMPLE_BLOCKS` of them, so the sample is still a random sample of the run's blocks."""
SAMPLE_BLOCKS = 64
"""The fewest blocks a sample is drawn in (smaller blocks for a smaller sample)."""
FIT_PART_ROWS = 25_000
"""Request-steps of the fitting sample per part (the fit's sums are added part by part, see
:mod:`~dspark_obs.estimators.ceiling.fit_parts`): eight parts of a full sample, to spread over workers."""


@dataclass(frozen=True)
class Chunk:
    """Which requests a chunk holds: a predicate on a rid column and its parameters."""

    where: str                     # SQL with {rid} for the column, e.g. "{rid} BETWEEN $chunk_lo AND $chunk_hi"
    params: dict = field(default_factory=dict)
    rows: int = 0                  # request-steps in the chunk
    requests: int = 0

    def on(self, column: str) -> str:
        """The predicate applied to ``column`` (e.g. ``s.rid``)."""
        return self.where.format(rid=column)

    def rid_ranges(self) -> tuple[list[tuple[str, str]] | None, bool]:
        """The chunk's rids as inclusive ranges (None: every rid), and whether it holds steps without one.

        >>> Chunk("{rid} BETWEEN $chunk_lo AND $chunk_hi", {"chunk_lo": "a", "chunk_hi": "c"}).rid_ranges()
        ([('a', 'c')], False)
        >>> ALL.rid_ranges(), Chunk("{rid} IS NULL").rid_ranges()
        ((None, True), ([], True))
        """
        if self.where in ("TRUE", "FALSE", "{rid} IS NULL"):
            return (None, True) if self.where == "TRUE" else ([], self.where != "FALSE")
        if "chunk_rids" in self.params:
            rids = self.params["chunk_rids"]
            return ([(min(rids), max(rids))] if rids else []), False
        ranges = [(v, self.params[k.replace("_lo", "_hi", 1)]) for k, v in self.params.items()
                  if k.endswith("_lo") or "_lo_" in k]
        return (ranges or None), False

    def sources(self, con, run_id: str, *tables: str) -> tuple[dict[str, str], dict]:
        """``({table: FROM text}, parameters)`` reading only the files of ``tables`` that may hold the chunk's
        rids (:func:`dspark_obs.run_files.source`); each query formats its ``FROM`` with them."""
        ranges, nulls = self.rid_ranges()
        froms, params = {}, {}
        for table in tables:
            froms[table], more = run_files.source(con, table, run_id, ranges, nulls, f"files_{table}")
            params.update(more)
        return froms, params


ALL = Chunk("TRUE")


def plan_chunks(rids: list, counts: np.ndarray, *, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                listed: bool = False) -> list[Chunk]:
    """Group requests, in the given (sorted) order, into chunks of about ``chunk_rows`` steps.

    ``rids`` are the run's distinct rids sorted as the database sorts them, with
    ``None`` (steps without a rid) last; ``counts`` their steps.  A request larger
    than ``chunk_rows`` is a chunk of its own; a run that fits is one chunk
    without a predicate.  ``listed`` names each chunk's rids (for a shard of
    :func:`shard_requests`, whose rids are not a contiguous range of the run).

    >>> [c.rows for c in plan_chunks(["a", "b", "c", None], np.array([3, 2, 4, 1]), chunk_rows=5)]
    [5, 4, 1]
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total <= chunk_rows and not listed:
        return [Chunk("TRUE", rows=total, requests=len(rids))]
    chunks: list[Chunk] = []
    named = [i for i, r in enumerate(rids) if r is not None]
    start, rows, prev = None, 0, -1
    for i in named:
        if start is not None and rows + counts[i] > chunk_rows:
            chunks.append(_range(rids, start, prev, rows, listed))
            start, rows = None, 0
        if start is None:
            start = i
        rows += int(counts[i])
        prev = i
    if start is not None:
        chunks.append(_range(rids, start, prev, rows, listed))
    unnamed = [i for i, r in enumerate(rids) if r is None]
    if unnamed:
        chunks.append(Chunk("{rid} IS NULL", rows=int(counts[unnamed].sum()), requests=1))
    return chunks


def _range(rids: list, first: int, last: int, rows: int, listed: bool = False) -> Chunk:
    if listed:
        named = [str(r) for r in rids[first:last + 1] if r is not None]
        return Chunk("{rid} IN (SELECT unnest($chunk_rids))", {"chunk_rids": named}, rows=rows, requests=len(named))
    return Chunk("{rid} BETWEEN $chunk_lo AND $chunk_hi", {"chunk_lo": rids[first], "chunk_hi": rids[last]},
                 rows=rows, requests=last - first + 1)


def split_chunks(rids: list, counts: np.ndarray, chunks: list, n_tasks: int, *, recut: bool = True) -> list[list]:
    """The run's chunks in ``n_tasks`` contiguous groups of about equal steps: one group per task.

    Every chunk is a rid range (``rid BETWEEN lo AND hi``), which DuckDB applies
    inside the Parquet scan, before the other columns are decoded, and which the
    row groups' min/max statistics prune on files sorted by rid.  Shards of
    requests by rid hash named their rids instead (``rid IN (...)``, a join after
    the scan): each chunk query then decoded every row of the run, 2.4x a range
    chunk's time at 1M request-steps.  A run of fewer chunks than tasks (one
    chunk without a predicate, say) is re-cut into ranges of ``total / n_tasks``
    steps, so every task has work (unless ``recut`` is False: groups of the chunks as they are, for work
    that must see the local path's chunks, such as the fit's parts).

    >>> [len(g) for g in split_chunks(list("abcdef"), np.ones(6), [], 2)]
    [1, 1]
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if recut and n_tasks > 1 and len(chunks) < n_tasks and total > 1:
        chunks = plan_chunks(rids, counts, chunk_rows=max(1, math.ceil(total / n_tasks)))
    sizes = np.array([c.rows for c in chunks], dtype=np.int64)
    rows = np.cumsum(sizes)
    spread = max(1, int(rows[-1])) if sizes.size else 1   # the chunks' steps: a sample's parts hold less than the run
    which = np.minimum((rows - sizes / 2) * n_tasks // spread, n_tasks - 1)
    return [g for g in ([c for c, w in zip(chunks, which) if w == t] for t in range(n_tasks)) if g]


def dealt_groups(rids: list, counts: np.ndarray, chunks: list, n_tasks: int) -> list[list]:
    """The run's chunks dealt to ``n_tasks`` tasks in turn (task ``t`` gets chunks ``t, t + n, ...``).

    Rids sort by their workload's name, and a step's cost depends on its
    workload, so contiguous halves of a run cost different CPU: one worker sat
    idle 2.7 of 38 s on the wall at 10M with two.  Dealt chunks give every
    task the same mix; each chunk is still one rid range read on its own.
    When the chunks do not divide among the tasks (67 at 10M: one worker had
    2% more steps), the run is first cut into a multiple of ``n_tasks``
    ranges of equal steps (:func:`equal_chunks`).  Tasks of decreasing size
    balance as well but pay a task's fixed costs (a connection, the run's rid
    index) once per task: thirteen times instead of twice at 10M.  A run of fewer chunks than tasks is re-cut as
    :func:`split_chunks` does.

    >>> [[c.rows for c in g] for g in dealt_groups(list("abcdef"), np.ones(6), plan_chunks(list("abcdef"), np.ones(6), chunk_rows=1), 2)]
    [[1, 1, 1], [1, 1, 1]]
    >>> rids = [f"r{i:02d}" for i in range(12)]   # three chunks of 4 for two tasks: four of 3 instead
    >>> [[c.rows for c in g] for g in dealt_groups(rids, np.ones(12), plan_chunks(rids, np.ones(12), chunk_rows=4), 2)]
    [[3, 3], [3, 3]]
    """
    if n_tasks <= 1 or len(chunks) < n_tasks:
        return split_chunks(rids, counts, chunks, n_tasks)
    if len(chunks) % n_tasks and rids and rids[-1] is not None:   # steps without a rid are a chunk apart
        chunks = equal_chunks(rids, counts, n_tasks * math.ceil(len(chunks) / n_tasks))
    return [chunks[t::n_tasks] for t in range(n_tasks)]


def equal_chunks(rids: list, counts: np.ndarray, n_chunks: int) -> list[Chunk]:
    """The run's requests (every rid named, in sorted order) in ``n_chunks`` rid ranges of about equal steps,
    each ending at the first request that reaches its share (fewer when single requests are larger than a share).

    >>> [c.rows for c in equal_chunks(list("abcde"), np.array([1, 1, 1, 1, 2]), 2)]
    [3, 3]
    """
    counts = np.asarray(counts, dtype=np.int64)
    ends = np.cumsum(counts)
    shares = ends[-1] * np.arange(1, n_chunks) / n_chunks
    cut = np.searchsorted(ends, shares, side="left")            # the request at which each share is reached
    cut = np.unique(np.minimum(cut, len(counts) - 2)) if len(counts) > 1 else np.zeros(0, np.int64)
    lasts = np.append(cut, len(counts) - 1)
    firsts = np.append(0, lasts[:-1] + 1)
    rows = ends[lasts] - np.append(0, ends[lasts[:-1]])
    return [_range(rids, int(a), int(b), int(r)) for a, b, r in zip(firsts, lasts, rows)]


class RayUnavailable(RuntimeError):
    """``--engine ray`` without Ray installed, or a cluster that cannot be reached."""


def rid_hash(rids: list) -> np.ndarray:
    """A stable 64-bit hash of each rid (:func:`dspark_obs.keys.stable_keys`; ``None`` as the empty string)."""
    return stable_keys(rids)


def shard_requests(rids: list, counts: np.ndarray, n_shards: int) -> list[tuple[list, np.ndarray]]:
    """Split a run's requests into ``n_shards`` by rid hash: ``(rids, counts)`` per shard, in run order.

    The split depends only on the rids (the same shards on every machine); a
    request is never split.

    >>> [len(r) for r, _ in shard_requests(list("abcdefgh"), np.ones(8), 2)]  # 6 + 2: a hash, not a deal
    [6, 2]
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    which = rid_hash(rids) % np.uint64(n_shards)
    counts = np.asarray(counts, dtype=np.int64)
    out = []
    for s in range(n_shards):
        idx = np.flatnonzero(which == s)
        out.append(([rids[i] for i in idx], counts[idx]))
    return out


def sample_requests(rids: list, counts: np.ndarray, *, max_rows: int = DEFAULT_FIT_ROWS,
                    block: int | None = None) -> Chunk:
    """Blocks of ``block`` consecutive requests, in increasing hash order of their first rid, until they
    hold ``max_rows`` steps.

    Every request (no predicate) when the run holds at most ``max_rows`` steps;
    steps without a rid are never sampled otherwise.  The predicate names the
    blocks' rid ranges (adjacent blocks merged), which DuckDB prunes by row
    group on files clustered by request (see :data:`SAMPLE_BLOCK_REQUESTS`).
    ``block`` defaults to :data:`SAMPLE_BLOCK_REQUESTS`, fewer when the sample
    would hold fewer than :data:`SAMPLE_BLOCKS` blocks (single requests for a
    small sample, where blocks would be few and lumpy).

    >>> sample_requests(["a", "b"], np.array([2, 3]), max_rows=10).where
    'TRUE'
    >>> two = sample_requests([f"r{i:02d}" for i in range(13)], np.ones(13), max_rows=4, block=2)
    >>> two.on("rid"), two.params["sample_lo_0"], two.params["sample_lo_1"]
    ('(rid BETWEEN $sample_lo_0 AND $sample_hi_0 OR rid BETWEEN $sample_lo_1 AND $sample_hi_1)', 'r02', 'r12')
    """
    counts = np.asarray(counts, dtype=np.int64)
    if int(counts.sum()) <= max_rows:
        return Chunk("TRUE", rows=int(counts.sum()), requests=len(rids))
    named = sum(r is not None for r in rids)        # rids sort None last
    if not named:
        return Chunk("FALSE")
    if block is None:
        per_request = counts[:named].sum() / named
        block = int(np.clip(max_rows / per_request / SAMPLE_BLOCKS, 1, SAMPLE_BLOCK_REQUESTS))
    starts = np.arange(0, named, block)
    rows = np.add.reduceat(counts[:named], starts) if named else np.zeros(0, np.int64)
    order = np.argsort(rid_hash([rids[i] for i in starts]), kind="stable")
    take = np.sort(order[: max(1, int(np.searchsorted(np.cumsum(rows[order]), max_rows, side="right")))])
    spans = _merged([(int(starts[b]), min(int(starts[b]) + block, named) - 1) for b in take])
    return _ranges_chunk(rids, spans, "sample", rows=int(rows[take].sum()),
                         requests=sum(last - first + 1 for first, last in spans))


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted index spans ``(first, last)`` with adjacent ones joined."""
    out: list[list[int]] = []
    for first, last in spans:
        if out and first == out[-1][1] + 1:
            out[-1][1] = last
        else:
            out.append([first, last])
    return [(a, b) for a, b in out]


def _ranges_chunk(rids: list, spans: list[tuple[int, int]], name: str, *, rows: int, requests: int) -> Chunk:
    """The requests of index ``spans`` of the sorted ``rids`` as one predicate: an OR of rid ranges
    (parameters ``${name}_lo_{j}``, ``${name}_hi_{j}``)."""
    where = " OR ".join(f"{{rid}} BETWEEN ${name}_lo_{j} AND ${name}_hi_{j}" for j in range(len(spans)))
    params = {}
    for j, (first, last) in enumerate(spans):
        params[f"{name}_lo_{j}"], params[f"{name}_hi_{j}"] = rids[first], rids[last]
    return Chunk(f"({where})", params, rows=rows, requests=requests)


def sample_spans(rids: list, sample: Chunk) -> list[tuple[int, int]]:
    """The index spans of the sorted ``rids`` that :func:`sample_requests` chose (the whole run for ``TRUE``)."""
    if sample.where in ("TRUE", "FALSE"):
        return [(0, len(rids) - 1)] if rids and sample.where == "TRUE" else []
    at = {r: i for i, r in enumerate(rids) if r is not None}
    return [(at[sample.params[f"sample_lo_{j}"]], at[sample.params[f"sample_hi_{j}"]])
            for j in range(len(sample.params) // 2)]


def sample_parts(rids: list, counts: np.ndarray, sample: Chunk, *, part_rows: int = FIT_PART_ROWS) -> list[Chunk]:
    """The sample's requests cut, in rid order, into parts of about ``part_rows`` steps (``rids`` sorted as
    :func:`plan_chunks` takes them): the same parts whatever the run's chunks and the engine.  A part of a
    whole run is a rid range; a part of a sample is its blocks' ranges (parameters unique across parts).

    >>> [c.rows for c in sample_parts(list("abcd"), np.array([2, 2, 2, 2]), ALL, part_rows=4)]
    [4, 4]
    """
    counts = np.asarray(counts, dtype=np.int64)
    if sample.where == "TRUE":
        return plan_chunks(rids, counts, chunk_rows=part_rows)
    chosen = [i for first, last in sample_spans(rids, sample) for i in range(first, last + 1)]
    groups: list[list[int]] = []
    rows = 0
    for i in chosen:
        if not groups or rows + counts[i] > part_rows:
            groups.append([])
            rows = 0
        groups[-1].append(i)
        rows += int(counts[i])
    return [_ranges_chunk(rids, _merged([(i, i) for i in group]), f"part{p}", rows=int(counts[group].sum()),
                          requests=len(group)) for p, group in enumerate(groups)]
