"""What the ceiling estimator keeps of each chunk, and how partial results of a run merge.

A run is estimated a chunk of whole requests at a time, on one machine or on
many (``--engine ray``).  Whatever the split, each worker reduces its chunks to
a :class:`RunPartial` — small sufficient statistics: per workload the summary's
sums and their request-bootstrap reweightings (:class:`~dspark_obs.estimators.ceiling.stats.GroupSums`,
weights drawn per request, so they add), the validation's sums (over every step, and per group of the
censored steps by sampling, category and workload), and the censored steps with a truth that the
equal-count bins of the validation need (their bounds and truths only), tagged with their request's
position in the run so the merge restores run order.  :func:`merge_partials` adds them; the local path is the merge of one.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs.estimators import sampling
from dspark_obs.estimators import stats as bootstrap
from dspark_obs.estimators.ceiling import stats as ceiling_stats
from dspark_obs.estimators.ceiling import validation as ceiling_validation

__all__ = ["RunTotals", "RunPartial", "merge_partials", "rid_positions", "workload_codes"]


def rid_positions(run_rids: list):
    """A function mapping a chunk's rid dictionary to positions in the run's sorted rids
    (steps without a rid come last, as the database sorts them)."""
    last = len(run_rids)
    # a dict, built once: a chunk's few thousand lookups cost microseconds (pandas' get_indexer took 35 ms a
    # chunk at 193k rids, re-inspecting the run's index on every call)
    named = {r: i for i, r in enumerate(r for r in run_rids if r is not None)}

    def positions(rids: pa.Array) -> np.ndarray:
        found = np.fromiter((named.get(r, last) for r in rids.to_pylist()), np.int64, len(rids))
        return np.append(found, last)  # the spare slot: no rid

    return positions


@dataclass
class RunTotals:
    """One worker's accumulation over its chunks (see :meth:`add`)."""

    positions: object                 # rid_positions(run rids)
    offset: int = 0                   # request codes handed out so far
    totals: list = field(default_factory=list)
    partial: "RunPartial" = None
    tag: str = field(default_factory=lambda: secrets.token_hex(6))

    def __post_init__(self) -> None:
        self.partial = self.partial or RunPartial()

    def add(self, x, part) -> None:
        """Add one chunk's inputs ``x`` and results ``part`` (:class:`~dspark_obs.estimators.ceiling.inputs.ChunkInputs` and io's chunk result)."""
        p, al = self.partial, x.aligned
        _, first = np.unique(al.code, return_index=True)
        for kind, source in zip(x.sampling[first].tolist(), x.sampling_source[first].tolist()):
            key = (sampling.KINDS[kind], sampling.SOURCES[source])
            p.sampling[key] = p.sampling.get(key, 0) + 1
        code = np.where(al.code < 0, -1, al.code + self.offset)
        self.offset += al.n_requests
        where = self.positions(al.rids)
        keys = np.append(bootstrap.unit_keys(al.rids.to_pylist()), bootstrap.unit_keys([None]))
        p.bad += al.bad_steps
        p.checked += al.checked_steps
        names = np.asarray(al.rids.to_pylist(), dtype=object)
        p.misaligned += [(int(where[i]), str(names[i])) for i in al.misaligned_codes]
        p.source = p.source or part.source
        p.rows += x.steps.num_rows
        workload, workload_names = part.workload
        self.totals.append(ceiling_stats.request_totals(code, workload, workload_names=workload_names,
                                                        acc_len=x.correct + 1.0,
                                                        window=x.window, key=keys[al.code], **part.summary_columns))
        p.all_sums = ceiling_validation.add_stat_sums(p.all_sums, part.known_sums)
        p.groups = ceiling_validation.add_label_group_sums(p.groups, part.group_sums)
        kept = dict(part.censored_known)
        kept["order"] = where[al.code][part.censored_rows]
        kept["piece"] = (self.tag, len(p.known))   # a name unique in the run, wherever the chunk was estimated
        p.known.append(kept)

    def finish(self, *, n_bootstrap: int, seed: int) -> "RunPartial":
        """The partial result of every chunk added (the per-request totals reduced to group sums)."""
        self.partial.summary = ceiling_stats.summary_sums(ceiling_stats.concat_totals(self.totals),
                                                          n_bootstrap=n_bootstrap, seed=seed)
        self.totals = []
        return self.partial


@dataclass
class RunPartial:
    """Sufficient statistics of a set of whole requests of a run; they add (:func:`merge_partials`)."""

    rows: int = 0
    bad: int = 0
    checked: int = 0
    source: str | None = None
    all_sums: dict | None = None
    summary: dict = field(default_factory=dict)      # workload -> GroupSums
    groups: dict = field(default_factory=dict)       # (group_kind, group) -> validation sums, all groups but bins
    known: list = field(default_factory=list)        # per chunk: censored steps with a truth
    bins: np.ndarray | None = None   # the bins' sums, from the processes that hold the steps (known: mid, order)
    misaligned: list = field(default_factory=list)   # (position in the run, rid)
    sampling: dict = field(default_factory=dict)     # (sampling, source) -> requests

    def summary_rows(self, n_bootstrap: int) -> list[dict]:
        return ceiling_stats.summary_rows(self.summary, n_bootstrap=n_bootstrap)

    def misaligned_rids(self) -> list[str]:
        return [rid for _, rid in sorted(self.misaligned)]

    def validation_rows(self) -> list[dict]:
        if not self.known or self.all_sums is None:
            return []
        if self.bins is not None:
            return ceiling_validation.validation_rows(self.all_sums, self.groups, self.bins)
        known, order = self._in_run_order()
        kn = {k: np.concatenate([p[k] for p in known]) for k in known[0] if k not in ("order", "piece")}
        if order is not None:
            kn = {k: v[order] for k, v in kn.items()}
        bins = ceiling_validation.ranked_bin_sums(kn["lo"], kn["mid"], kn["hi"], kn["truth"], kn["emu"], kn["greedy"])
        return ceiling_validation.validation_rows(self.all_sums, self.groups, bins)

    def bin_codes(self) -> tuple[dict, int]:
        """``({piece: its steps' bins}, bins)``: the equal-count bins of every censored step's ``mid`` in run
        order, for pieces whose steps stay where they were estimated (their ``piece`` names them there)."""
        known, order = self._in_run_order()
        mid = np.concatenate([p["mid"] for p in known])
        codes = ceiling_validation.equal_count_bins(mid if order is None else mid[order]).astype(np.int8)
        if order is not None:
            codes[order] = codes.copy()
        bounds = np.cumsum([0] + [len(p["mid"]) for p in known])
        return ({p["piece"]: codes[a:b] for p, a, b in zip(known, bounds[:-1], bounds[1:]) if b > a},
                int(codes.max()) + 1 if codes.size else 0)

    def _in_run_order(self) -> tuple[list, np.ndarray | None]:
        """The pieces in order of their first step, and the order of their concatenated steps by request
        position (None: already in it).  By request, then as read: each chunk's piece is, and chunks are
        disjoint rid ranges, so the pieces put in order of their first step are the run's order (workers'
        pieces come dealt: one chunk in two)."""
        known = sorted(self.known, key=lambda p: p["order"][0] if len(p["order"]) else -1)
        at = np.concatenate([p["order"] for p in known])
        return known, None if (at[1:] >= at[:-1]).all() else np.argsort(at, kind="stable")


def merge_partials(parts: list[RunPartial]) -> RunPartial:
    """One :class:`RunPartial` of disjoint sets of whole requests."""
    out = RunPartial()
    for p in parts:
        out.rows += p.rows
        out.bad += p.bad
        out.checked += p.checked
        out.source = out.source or p.source
        if p.all_sums is not None:
            out.all_sums = ceiling_validation.add_stat_sums(out.all_sums, p.all_sums)
        out.groups = ceiling_validation.add_label_group_sums(out.groups, p.groups)
        out.known += p.known
        out.misaligned += p.misaligned
        for key, n in p.sampling.items():
            out.sampling[key] = out.sampling.get(key, 0) + n
    out.summary = ceiling_stats.merge_summary_sums([p.summary for p in parts])
    return out


def workload_codes(steps: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``(names, codes)``: the steps' workloads (``unknown`` where the request has none) as names and each
    step's index among them: the validation's groups are summed by code, chunk by chunk (a label per step
    was ~100 bytes, and its pickle and hash dominated the validation)."""
    encoded = pc.dictionary_encode(pc.fill_null(steps.column("workload"), "unknown").combine_chunks())
    names = np.asarray(encoded.dictionary.to_pylist() + [None], dtype=object)[:-1]   # 1-D even for one name
    return names, encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
