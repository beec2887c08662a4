"""Calibration of a run larger than a chunk: whole requests at a time, sufficient statistics.

Every figure of :func:`~dspark_obs.estimators.calibration.summarise_events` but
two is a sum over steps, so chunks of whole requests (rid ranges, as the ceiling
estimator reads them: :mod:`~dspark_obs.estimators.chunks`) add up to the run's value:

* counts, mean prediction and label, Brier score, log loss, and per bin the
  count and the sums of predictions and labels (hence ECE, MCE, debiased ECE and
  the reliability bins) — equal to one pass up to the order of float additions;
* the request-level bootstrap of the ECE, debiased ECE and Brier score (kept as
  ``calibration_resamples`` for the report) — each resample's per-bin sums are
  ``weights @ per-request sums``, accumulated chunk by chunk with the very
  Poisson weights one pass draws (drawn per request from its run and rid:
  :mod:`~dspark_obs.estimators.stats`), so chunks, and shards of requests on other machines
  (``--engine ray``: :func:`accumulate_chunks` per shard, :func:`merge_cells`),
  add up to the one-pass sums.

Two need every step at once: **AUROC** (a ranking) and the **edges of
equal-mass bins** (quantiles).  They come from a bounded sample of blocks of
whole requests chosen by a hash of their rid (``sample_rows`` steps; the whole run
when it fits, and then they are exact).  The bins' counts and sums still cover
every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs import schema
from dspark_obs.estimators import stats as bootstrap
from dspark_obs.estimators.calibration import events, metrics
from dspark_obs.estimators.calibration.cell_sums import Cell, add_events
from dspark_obs.estimators.calibration.resampling import figures_of_sums
from dspark_obs.estimators.calibration.rows import cell_rows, resample_table_of
from dspark_obs.estimators.chunks import Chunk, plan_chunks, sample_requests
from dspark_obs.estimators.run_requests import RunRequests

__all__ = ["RunPlan", "RunReads", "run_steps", "plan_run", "summarise_in_chunks", "accumulate_chunks", "merge_cells",
           "BinEdges", "DEFAULT_SAMPLE_ROWS"]

DEFAULT_SAMPLE_ROWS = 500_000
"""Steps behind AUROC and equal-mass bin edges when a run holds more."""
COUNT_CHUNKS = 8
"""Chunks per range in which a run's labelled steps are counted per rid (:func:`plan_run`)."""


_BASE_SQL = """
SELECT rid, count(*) AS n FROM step_reqs
WHERE run_id = $run AND (confidence IS NOT NULL OR survival IS NOT NULL)
GROUP BY rid ORDER BY rid NULLS LAST
"""


@dataclass(frozen=True)
class RunPlan:
    """A run's chunks and labelled steps per request: what the sample of whole requests needs up front.

    A run that fits one chunk is not counted further: it is calibrated in one pass.
    """

    query: str
    params: dict
    mode: str
    gamma: int | None
    source: str
    chunks: list               # Chunk, in rid order
    total: int = 0             # the run's steps (labelled or not)
    labelled: int = 0
    rids: list = field(default_factory=list)    # rids with labelled steps (reconstructed: _estimable), None last
    rid_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    step_rids: list = field(default_factory=list)    # every rid with predictions (what shards split), None last
    step_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def run_steps(con, run_id: str) -> tuple[list, np.ndarray]:
    """The run's rids with predictions (sorted, None last) and their steps: what :func:`plan_run` chunks."""
    base = events.fetch(con, _BASE_SQL, {"run": run_id})
    return base.column("rid").to_pylist(), base.column("n").to_numpy().astype(np.int64)


def plan_run(con, run_id: str, *, labels: str, companion: str | None, chunk_rows: int,
             units: bool = True, steps: tuple | None = None) -> RunPlan:
    """Chunks of the run's steps with predictions, then (``units``) its labelled steps per rid,
    which the sample of whole requests needs before the first chunk (``steps``: :func:`run_steps`,
    when the caller has them).

    Every step with predictions has observed labels, so those are the steps per rid; reconstructed
    labels are bounded per rid by its estimates (:func:`_estimable`); companion labels are counted a
    range of chunks at a time: joining a whole run with its companion at once would hold both in memory.
    Raises as ``load_events``.
    """
    query, params, mode, gamma, source = events.events_query(con, run_id, labels=labels, companion=companion)
    rids, rows = steps if steps is not None else run_steps(con, run_id)
    chunks = plan_chunks(rids, rows, chunk_rows=chunk_rows)
    steps = {"step_rids": rids, "step_rows": rows}
    if len(chunks) == 1:
        return RunPlan(query, params, mode, gamma, source, chunks, **steps)
    if not units or labels == "observed":  # steps with predictions are (or stand in for) the labelled ones
        labelled = int(rows.sum())
        total = events.check_labelled(con, run_id, labels, mode, source, labelled, labelled) if units else 0
        return RunPlan(query, params, mode, gamma, source, chunks, total, labelled, rids, rows, **steps)
    if labels == "reconstructed":
        counts = _estimable(con, params, rids, rows)
    else:
        # counted over ranges of COUNT_CHUNKS chunks: a count holds a rid and three keys per step, not a chunk's
        # lists, and each query has a fixed cost (views bound, files opened): at 10M rows, a count per chunk
        # took 7.8 s on the wall before the first chunk, ranges of eight 2.9 s (peak 423 MB against 283 MB)
        ranges = plan_chunks(rids, rows, chunk_rows=chunk_rows * COUNT_CHUNKS)
        counts = pa.concat_tables([events.fetch(con, f"SELECT rid, count(*) AS n FROM ({events.events_sql(query, part)}) "
                                                     "GROUP BY rid ORDER BY rid NULLS LAST", {**params, **part.params})
                                   for part in ranges])
    labelled = int(np.sum(counts.column("n").to_numpy())) if counts.num_rows else 0
    total = events.check_labelled(con, run_id, labels, mode, source, labelled, int(rows.sum()))
    return RunPlan(query, params, mode, gamma, source, chunks, total, labelled, counts.column("rid").to_pylist(),
                   counts.column("n").to_numpy().astype(np.int64), **steps)


_ESTIMATES_PER_RID_SQL = """
SELECT rid, count(*) AS n FROM ceiling WHERE run_id = $run AND coalesce(method, '') = $method
GROUP BY rid ORDER BY rid NULLS LAST
"""


def _estimable(con, params: dict, rids: list, rows: np.ndarray) -> pa.Table:
    """Per rid (in ``rids``' order, those above 0): the fewer of its steps with predictions (``rows``) and its
    ceiling estimates, which bound its steps with reconstructed labels and equal them when each of those
    steps has one estimate (``estimate`` writes one per step).

    The sample of whole requests is chosen by these counts.  Counting the labels themselves joins every step
    with its estimate and decodes both list columns: the plan took 4.9 CPU s at 10M that way, 0.5 s this way.
    """
    estimates = events.fetch(con, _ESTIMATES_PER_RID_SQL, {"run": params["run"], "method": params["method"]})
    names = pa.array(rids, pa.string())
    at = pc.fill_null(pc.index_in(names, value_set=estimates.column("rid").combine_chunks()), -1)
    per_rid = np.append(estimates.column("n").to_numpy().astype(np.int64), 0)[at.to_numpy(zero_copy_only=False)]
    n = np.minimum(np.asarray(rows, dtype=np.int64), per_rid)
    keep = np.flatnonzero(n > 0)
    return pa.table({"rid": names.take(pa.array(keep)), "n": pa.array(n[keep])})


@dataclass(frozen=True)
class RunReads:
    """How a run's chunks are read for its label kinds: observed and reconstructed from one read.

    ``fused`` is the outer read (steps with their ceiling estimate where there is one,
    :class:`~.events.OuterRead`) when both kinds are planned; other kinds read on their own.
    """

    run_id: str
    plans: dict                     # label kind -> RunPlan, in the order they are reported
    requests: RunRequests           # the run's, for every chunk's workloads
    fused: events.OuterRead | None = None

    @classmethod
    def of(cls, con, run_id: str, plans: dict) -> "RunReads":
        fused = None
        if {"observed", "reconstructed"} <= set(plans) and plans["observed"].mode not in ("cap-accept", "static"):
            fused = events.OuterRead.of(con, run_id)
        return cls(run_id, plans, RunRequests.read(con, run_id), fused)

    def subset(self, kinds) -> "RunReads":
        plans = {kind: self.plans[kind] for kind in kinds}
        return RunReads(self.run_id, plans, self.requests,
                        self.fused if {"observed", "reconstructed"} <= set(plans) else None)

    def read(self, con, chunk: Chunk, steps: int) -> dict:
        """``kind -> (RunEvents, counts)`` of the requests of ``chunk``, which hold ``steps`` steps with
        predictions; the outer read is used only when it gives one row per step (one estimate per step)."""
        out = {}
        if self.fused is not None:
            table = self.fused.read(con, chunk)
            if table is not None and table.num_rows == steps:
                ref = self.plans["observed"]
                out = events.split_outer(table, self.run_id, ref.mode, ref.gamma, ("observed", "reconstructed"),
                                         self.requests)
            del table
        for kind, plan in self.plans.items():
            if kind not in out:
                out[kind] = _load(con, plan, self.run_id, kind, chunk, self.requests)
        return {kind: out[kind] for kind in self.plans}


def _load(con, plan: RunPlan, run_id: str, labels: str, chunk: Chunk, requests: RunRequests):
    table = events.fetch(con, *events.chunk_events_sql(con, plan.query, plan.params, chunk))
    return events.events_of(table, run_id, labels, plan.mode, plan.gamma, plan.source, requests)


def summarise_in_chunks(con, reads: RunReads, *, binnings, n_bootstrap: int, confidence_level: float, seed: int,
                        sample_rows: int = DEFAULT_SAMPLE_ROWS, progress: Callable[[int, int], None] | None = None,
                        accumulate: Callable | None = None) -> dict[str, tuple[pa.Table, pa.Table, pa.Table, tuple]]:
    """``kind -> (calibration rows, calibration_bins rows, calibration_resamples rows, notes)`` of every kind
    ``reads`` plans, a chunk of requests at a time, every chunk read once for all of them.

    ``accumulate`` (e.g. :func:`~dspark_obs.estimators.calibration.ray.accumulate`
    bound to an engine) sums the run's chunks elsewhere, taking the arguments of
    :func:`accumulate_chunks` without the chunks and returning the same; default:
    here, chunk by chunk.
    """
    specs = {name: metrics.parse_binning(name) for name in binnings}
    samples = SampleEdges.of(con, reads, specs, sample_rows)
    edges = {kind: sample.edges for kind, sample in samples.items()}
    plan = next(iter(reads.plans.values()))
    total_rows = sum(chunk.rows for chunk in plan.chunks)
    if accumulate is None:
        done = [0]

        def advance(rows: int) -> None:
            done[0] += rows
            if progress is not None:
                progress(done[0], total_rows)

        sums = accumulate_chunks(con, reads, plan.chunks, specs=specs, edges=edges, n_bootstrap=n_bootstrap,
                                 seed=seed, progress=advance)
    else:
        sums = accumulate(con, reads, specs=specs, edges=edges, n_bootstrap=n_bootstrap, seed=seed,
                          progress=progress, total=total_rows)
    return {kind: _tables(con, reads.run_id, kind, reads.plans[kind], samples[kind], *sums[kind], binnings=binnings,
                          confidence_level=confidence_level, n_bootstrap=n_bootstrap)
            for kind in reads.plans}


def _tables(con, run_id: str, labels: str, plan: RunPlan, sample: "SampleEdges", cells: dict, counts: dict, *,
            binnings, confidence_level: float, n_bootstrap: int) -> tuple[pa.Table, pa.Table, pa.Table, tuple]:
    counts["total"] = plan.total or events.check_labelled(con, run_id, labels, plan.mode, plan.source, counts["rows"],
                                                          int(plan.step_rows.sum()))
    rows, bin_rows, resample_rows = [], [], []
    names = sorted({w for w, _ in cells} - {"*"})
    for w in ["*", *names]:
        for k in range(sample.gamma):
            cell = cells.get((w, k), Cell())
            y, p, g = sample.labelled.get((w, k), (np.zeros(0), np.zeros(0), np.zeros(0, np.int64)))
            auroc = tuple(map(metrics.none_if_nan, metrics.clustered_auroc(y, p, g))) if y.size else (None, None)
            r, b, s = _rows(cell, auroc, w, k, labels, plan, binnings, confidence_level, n_bootstrap)
            rows += r
            bin_rows += b
            resample_rows += s
    notes = events.notes_of(labels, plan.mode, plan.params.get("method"), counts)
    return (pa.Table.from_pylist(rows, schema=schema.CALIBRATION.remove_metadata()),
            pa.Table.from_pylist(bin_rows, schema=schema.CALIBRATION_BINS.remove_metadata()),
            resample_table_of(resample_rows), notes)


@dataclass
class SampleEdges:
    """What needs every step at once, from a sample of whole requests: AUROC's pairs and bin edges."""

    gamma: int
    labelled: dict             # (workload, k) -> (y, p, request) of the sample, for AUROC (stays with the driver)
    edges: "BinEdges"

    @classmethod
    def of(cls, con, reads: RunReads, specs: dict, sample_rows: int) -> dict[str, "SampleEdges"]:
        """Each kind's sample; kinds whose samples hold the same requests read them once."""
        chosen = {kind: sample_requests(plan.rids, plan.rid_rows, max_rows=sample_rows)
                  for kind, plan in reads.plans.items()}
        out: dict = {}
        for kind, chunk in chosen.items():
            if kind in out:
                continue
            same = {k: reads.plans[k] for k, c in chosen.items() if (c.where, c.params) == (chunk.where, chunk.params)}
            steps = chosen["observed"].rows if "observed" in same else -1   # observed rows: all steps with predictions
            for k, (ev, _) in reads.subset(same).read(con, chunk, steps).items():
                out[k] = cls.of_events(ev, specs)
        return {kind: out[kind] for kind in reads.plans}

    @classmethod
    def of_events(cls, sample: events.RunEvents, specs: dict) -> "SampleEdges":
        labelled: dict = {}
        _, unit = _local_units(sample.rid)
        for w, mask in _groups(sample.workload):
            for k in range(sample.gamma):
                y, p = sample.y[mask, k], sample.survival[mask, k]
                ok = ~np.isnan(y) & ~np.isnan(p)
                labelled[w, k] = (y[ok], np.clip(p[ok], 0.0, 1.0), unit[mask][ok])
        edges = {(w, k, name): _edges_of(p, specs[name]) for (w, k), (_, p, _) in labelled.items() for name in specs}
        return cls(sample.gamma, labelled, BinEdges(edges, specs))


def _edges_of(p: np.ndarray, spec: tuple[int, str]) -> np.ndarray:
    n_bins, strategy = spec
    return metrics.bin_edges(np.clip(p, metrics.EPS_PROB, 1.0 - metrics.EPS_PROB), n_bins, strategy)


@dataclass(frozen=True)
class BinEdges:
    """Bin edges per (workload, position, binning) from the sample; a cell the sample lacks gets
    the edges of no data (small: this is what every worker receives)."""

    table: dict
    specs: dict

    def __call__(self, w: str, k: int, name: str) -> np.ndarray:
        found = self.table.get((w, k, name))
        return found if found is not None else _edges_of(np.zeros(0), self.specs[name])


def accumulate_chunks(con, reads: RunReads, chunks: list, *, specs: dict, edges: dict, n_bootstrap: int, seed: int,
                      progress: Callable[[int], None] | None = None) -> dict[str, tuple[dict, dict]]:
    """``kind -> (cells, counts)``: sums of ``chunks`` per (workload, position) for each planned label kind
    (``edges``: kind -> :class:`BinEdges`), each chunk read once; the one per-chunk path, for the local
    loop and for every worker.  Cells of disjoint requests add (:func:`merge_cells`)."""
    sums = {kind: ({}, {"rows": 0, "censored": 0, "fractional": 0}) for kind in reads.plans}
    for chunk in chunks:
        read = reads.read(con, chunk, chunk.rows)
        for kind, (_, c) in read.items():
            for key in sums[kind][1]:
                sums[kind][1][key] += c[key]
        groups: list[list] = []   # kinds whose events are the same steps (one read): their requests indexed once
        for kind, (ev, _) in read.items():
            group = next((g for g in groups if _same_steps(g[0][1], ev)), None)
            if group is None:
                group = []
                groups.append(group)
            group.append((sums[kind][0], ev, edges[kind]))
        for group in groups:
            add_events(group, specs, n_bootstrap, seed)
        if progress is not None:
            progress(chunk.rows)
    return sums


def _same_steps(a: events.RunEvents, b: events.RunEvents) -> bool:
    return len(a.rid) == len(b.rid) and np.array_equal(a.rid, b.rid) and np.array_equal(a.workload, b.workload)


def merge_cells(parts: list[dict]) -> dict[str, tuple[dict, dict]]:
    """:func:`accumulate_chunks` of disjoint sets of whole requests as one."""
    out: dict = {}
    for part in parts:
        for kind, (part_cells, part_counts) in part.items():
            cells, counts = out.setdefault(kind, ({}, {"rows": 0, "censored": 0, "fractional": 0}))
            for key in counts:
                counts[key] += part_counts[key]
            for key, cell in part_cells.items():
                cells[key] = cells[key] + cell if key in cells else cell
    return out


def _groups(workload: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``("*", all)`` and ``(name, mask)`` per workload."""
    codes, names = pd.factorize(np.asarray(workload, dtype=object), use_na_sentinel=False)
    return [("*", np.ones(codes.size, bool))] + [(str(n), codes == i) for i, n in enumerate(names)]


def _local_units(units: np.ndarray) -> tuple[list, np.ndarray]:
    """Distinct units of a chunk and each row's number among them."""
    codes, uniques = pd.factorize(np.asarray(units, dtype=object), use_na_sentinel=False)
    return list(uniques), codes.astype(np.int64)


def _rows(cell: Cell, auroc: tuple, workload: str, k: int, labels: str, plan: RunPlan, binnings, level: float,
          n_boot: int) -> tuple[list[dict], list[dict], list[pa.Table]]:
    base = {"workload": workload, "position": k + 1, "labels": labels}
    common = {"mode": plan.mode or None, "label_source": plan.source, "n": cell.n, "n_requests": cell.n_requests,
              "bootstrap": n_boot if cell.n and n_boot else 0}
    if cell.n:
        _, rate_se = bootstrap.clustered_mean_of_sums(cell.n, cell.y_sum, cell.clustered, cell.n_requests)
        common.update(mean_predicted=cell.p_sum / cell.n, observed_rate=cell.y_sum / cell.n,
                      brier=cell.sq_sum / cell.n, log_loss=-cell.log_sum / cell.n, auroc=auroc[0], auroc_se=auroc[1],
                      observed_rate_se=metrics.none_if_nan(rate_se))
    bins = {name: metrics.Bins(cell.edges[name], np.zeros(0, np.int64), *cell.bins[name]) if cell.n else None
            for name in binnings}
    return cell_rows(base, common, bins, level=level,
                     resamples=(lambda name, b: figures_of_sums(cell.boot[name], b.count.size)) if n_boot else None)
