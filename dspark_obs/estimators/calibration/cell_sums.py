"""One chunk's calibration sums, added to the run's cells: every label kind, workload and position at once.

A cell is a (workload, position) of one label kind; it holds what :mod:`~.chunks` turns into the
``calibration`` rows: counts and sums, per binning the bins' counts and sums, and the bootstrap's
``weights @ per-request sums``.  A chunk of whole requests adds to its cells in a few passes over all of
its steps (a count per statistic, keyed by cell, or by request and bin), where a pass per cell, position
and binning cost ~100 ns a value; what remains per cell is arithmetic on per-request arrays.

The binning and its counts are one compiled pass (numba, :meth:`CellBins.sums`): numpy needed a table
lookup, a search near the edges and a count per statistic, six passes over every value of the chunk for
each binning, and the pass adds in the same order as ``np.bincount``, so the sums are the same to the
last bit (``calibrate --labels all`` at 10M, ``--jobs 1``: 49.3 against 45.2 CPU s).  A label kind's
per-cell and per-unit sums are one more (:func:`_step_sums`), and every pass reads the rows it takes by
index (``at``), where numpy took six copies of them first and counted five times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from dspark_obs.estimators import stats as bootstrap
from dspark_obs.estimators.calibration import events, metrics
from dspark_obs.estimators.compiled import jit

__all__ = ["Cell", "CellBins", "add_events", "bootstrap_products", "exact_in_float32", "EXACT_FLOAT32"]


class CellBins:
    """:func:`bin_ids` of rows that belong to different cells, each cell with its own edges, in one pass.

    ``metrics.bin_ids(p[i], edges[cell[i]], strategy)`` for every row ``i``.  An equal-mass bin is looked up in
    a table per cell: for each bucket ``[b/M, (b+1)/M)`` (``M`` = :attr:`BUCKETS`, a power of two, so
    ``floor(p * M)`` is exact) the bin every ``p`` in it falls in, unless an edge falls inside the bucket;
    those rows (few) are searched as :func:`bin_ids` searches.  A chunk of a large run bins its steps of
    every workload and position at once, where a search per cell cost ~24 ns a value.
    """

    BUCKETS = 1 << 16
    _tables: dict = {}   # edges (bytes) -> (bin per bucket, edge inside the bucket): a run's edges recur

    def __init__(self, edges: list[np.ndarray], strategy: str) -> None:
        self.edges, self.strategy = [np.asarray(e, dtype=np.float64) for e in edges], strategy
        if strategy == "quantile" and self.edges:
            tables = [self._table(e) for e in self.edges]
            self.bin_of = np.stack([t[0] for t in tables]).reshape(-1)
            self.edge_in = np.stack([t[1] for t in tables]).reshape(-1)

    @classmethod
    def _table(cls, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = edges.tobytes()
        found = cls._tables.get(key)
        if found is None:
            grid = np.arange(cls.BUCKETS + 1, dtype=np.float64) / cls.BUCKETS
            below = np.searchsorted(edges[1:-1], grid)   # interior edges < each bucket's start
            found = (below[:-1].astype(np.min_scalar_type(edges.size)), below[1:] != below[:-1])
            if len(cls._tables) > 4096:
                cls._tables.clear()
            cls._tables[key] = found
        return found

    def __call__(self, p: np.ndarray, cell: np.ndarray) -> np.ndarray:
        """Bin ids (int64) of ``p`` (clamped to [0, 1]) whose cells are ``cell`` (indices into ``edges``)."""
        p, cell = np.asarray(p, dtype=np.float64), np.asarray(cell, dtype=np.int64)
        if self.strategy == "uniform":   # the same edges in every cell
            return metrics.bin_ids(p, self.edges[0], "uniform") if self.edges else np.zeros(p.size, np.int64)
        if not p.size:
            return np.zeros(0, np.int64)
        at = cell * self.BUCKETS + np.minimum((p * self.BUCKETS).astype(np.int64), self.BUCKETS - 1)
        ids = self.bin_of[at].astype(np.int64)
        near = np.flatnonzero(self.edge_in[at])
        if near.size:
            near_cell = cell[near]
            for c in np.unique(near_cell):
                rows = near[near_cell == c]
                ids[rows] = metrics.bin_ids(p[rows], self.edges[c], "quantile")
        return ids

    def sums(self, p: np.ndarray, cell: np.ndarray, key: np.ndarray, y: np.ndarray, groups: int, *,
             at: np.ndarray | None = None) -> np.ndarray:
        """``[3, groups, bins]``: per ``key`` and bin of ``p`` (its ``cell``'s), the count and the sums of ``p``
        and ``y`` (:func:`~.metrics.request_bins` of :meth:`__call__`'s bins), in one compiled pass that adds
        in the order of the values, as ``np.bincount`` does: the same sums, bit for bit.  The pass replaced a
        lookup, a search near the edges and three counts, each a pass over every value of the chunk.
        ``at``: only these rows (ascending indices), as if the arrays were taken at them first."""
        n_bins = self.edges[0].size - 1 if self.edges else 1
        if at is None:
            at = np.arange(len(p), dtype=np.int64)
        if not self.edges or len({e.size for e in self.edges}) != 1:   # no cell, or cells of different bins
            p, cell, key, y = p[at], cell[at], key[at], y[at]
            return np.stack(metrics.request_bins(key, self(p, cell), p, y, groups, n_bins))
        quantile = self.strategy == "quantile"
        at = np.ascontiguousarray(at, dtype=np.int64)
        if len(p) != len(y) or len(p) != len(cell) or len(p) != len(key):
            raise ValueError("p, cell, key and y must be of one length")
        interior = np.ascontiguousarray(np.stack(self.edges)[:, 1:-1]) if quantile else np.zeros((1, 0))
        out = jit(_binned_sums)(at, np.ascontiguousarray(p, dtype=np.float64), np.ascontiguousarray(y, dtype=np.float64),
                                np.ascontiguousarray(cell, dtype=np.int64), np.ascontiguousarray(key, dtype=np.int64),
                                self.bin_of if quantile else np.zeros(1, np.int8),
                                self.edge_in if quantile else np.zeros(1, bool), interior, n_bins, groups, quantile,
                                self.BUCKETS)
        return out.reshape(3, groups, n_bins)


def _binned_sums(at, p, y, cell, key, bin_of, edge_in, interior, n_bins, groups, quantile, buckets):
    """:meth:`CellBins.sums` (compiled): each value of rows ``at``'s bin as :meth:`CellBins.__call__` finds it,
    added to its key's count and sums in order."""
    out = np.zeros((3, groups * n_bins))
    cells = interior.shape[0]
    for i in at:
        if i < 0 or i >= p.size or key[i] < 0 or key[i] >= groups or (quantile and (cell[i] < 0 or cell[i] >= cells)):
            raise ValueError("indices must lie in their ranges (rows, groups, cells)")   # before any is used
        v = p[i]
        if quantile:
            c = cell[i]
            at = c * buckets + min(np.int64(v * buckets), buckets - 1)
            if edge_in[at]:   # searchsorted(interior edges, v, "left"): the edges below v
                lo, hi = 0, interior.shape[1]
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if interior[c, mid] < v:
                        lo = mid + 1
                    else:
                        hi = mid
                b = lo
            else:
                b = np.int64(bin_of[at])
        else:
            b = min(max(np.int64(v * n_bins), 0), n_bins - 1)
        j = key[i] * n_bins + b
        out[0, j] += 1.0
        out[1, j] += v
        out[2, j] += y[i]
    return out


def _step_sums(at, p, y, log_pc, log1m_pc, cell, unit, cells, units):
    """:meth:`_KindSums.of`'s sums over rows ``at`` (compiled), added in order as ``np.bincount`` adds:
    per cell the predictions and log-likelihoods, per cell unit the steps, squared errors and labels;
    and whether every label is 0 or 1.  Two passes for the gathers and five counts before."""
    per_cell, per_unit, whole = np.zeros((2, cells)), np.zeros((3, units)), True
    for i in at:
        if i < 0 or i >= p.size or cell[i] < 0 or cell[i] >= cells or unit[i] < 0 or unit[i] >= units:
            raise ValueError("indices must lie in their ranges (rows, cells, units)")   # before any is used
        v, t = p[i], y[i]
        c, u = cell[i], unit[i]
        d = v - t
        per_cell[0, c] += v
        per_cell[1, c] += t * log_pc[i] + (1.0 - t) * log1m_pc[i]
        per_unit[0, u] += 1.0
        per_unit[1, u] += d * d
        per_unit[2, u] += t
        if t != 0.0 and t != 1.0:
            whole = False
    return per_cell, per_unit, whole


@dataclass
class Cell:
    """Sums of one workload x position (and its binnings) over the chunks so far."""

    n: int = 0
    n_requests: int = 0
    p_sum: float = 0.0
    y_sum: float = 0.0
    sq_sum: float = 0.0
    log_sum: float = 0.0
    clustered: np.ndarray = field(default_factory=lambda: np.zeros(3))  # sums over requests of Y^2, Y N, N^2
    edges: dict = field(default_factory=dict)  # binning -> bin edges
    bins: dict = field(default_factory=dict)   # binning -> [count, pred_sum, true_sum]
    boot: dict = field(default_factory=dict)   # binning -> W @ per-request sums (RequestSums.columns)

    def __add__(self, other: "Cell") -> "Cell":
        """The cell of two disjoint sets of whole requests (the same bin edges)."""
        out = Cell(self.n + other.n, self.n_requests + other.n_requests, self.p_sum + other.p_sum,
                    self.y_sum + other.y_sum, self.sq_sum + other.sq_sum, self.log_sum + other.log_sum,
                    self.clustered + other.clustered, {**other.edges, **self.edges})
        for name in {*self.bins, *other.bins}:
            a, b = self.bins.get(name), other.bins.get(name)
            out.bins[name] = [x + y for x, y in zip(a, b)] if a and b else list(a or b)
        for name in {*self.boot, *other.boot}:
            a, b = self.boot.get(name), other.boot.get(name)
            out.boot[name] = a + b if a is not None and b is not None else (a if a is not None else b)
        return out


def add_events(kinds: list[tuple[dict, events.RunEvents, Callable]], specs: dict, n_bootstrap: int,
                seed: int) -> None:
    """Add one chunk's events to their cells, for label kinds of the same steps: ``[(cells, events, edges)]``.

    Every kind's steps of every workload and position are summed at once (bin counts per cell and per
    request by one count of each); each request's weights are drawn once, and each workload's per-request
    sums of every kind reweighted in one product.  A request is in one workload, and equal-width bins are
    the same in every cell, so every sum of the all-workloads cell but its equal-mass bins is the sum of its
    workloads': counts, sums, per-request moments and equal-width bins, resampled or not, are added there
    from each workload's; its equal-mass bins, whose edges are its own, are counted on its own steps.
    """
    ev0 = kinds[0][1]
    units = _ChunkUnits.of(ev0.rid, ev0.workload, ev0.rid_code, ev0.workload_code)
    drawn = (bootstrap.poisson_weights(bootstrap.run_unit_keys(ev0.run_id, units.names), n_bootstrap, seed)
             if n_bootstrap else None)
    shared, sums = _ChunkSteps.of(ev0.survival, units), []
    for cells, ev, edges in kinds:
        for w in ["*", *units.workloads]:
            for k in range(ev.gamma):
                cell = cells.setdefault((w, k), Cell())
                for name in specs:
                    cell.edges.setdefault(name, edges(w, k, name))
        same = ev.survival is ev0.survival or np.array_equal(ev.survival, ev0.survival, equal_nan=True)
        sums.append(_KindSums.of(ev, shared if same else _ChunkSteps.of(ev.survival, units), specs, cells,
                                 with_units=drawn is not None))
    for (cells, ev, _), got in zip(kinds, sums):
        got.add_to_cells(cells, units.workloads)
    if drawn is None:
        return
    for w, workload in enumerate(units.workloads):   # one product per workload, every kind's sums side by side
        span = slice(units.bounds[w], units.bounds[w + 1])
        pending = []
        for (cells, ev, _), got in zip(kinds, sums):
            for k in range(ev.gamma):
                if got.n[w, k]:
                    for b in specs:
                        mine = cells[(workload, k)].boot   # equal-width bins: the all-workloads cell's too
                        accs = [mine, cells[("*", k)].boot] if specs[b][1] == "uniform" else [mine]
                        pending.append((accs, b, *got.unit_columns(b, k, span)))
        _add_bootstrap(drawn[:, units.unit_of[span]], pending)
    pending = []   # the all-workloads cell's equal-mass bins, over all of the chunk's requests
    for (cells, ev, _), got in zip(kinds, sums):
        for k in range(ev.gamma):
            if got.n[:, k].any():
                for b in specs:
                    if specs[b][1] != "uniform":
                        pending.append(([cells[("*", k)].boot], b,
                                        *got.unit_columns(b, k, units.by_request, every=True)))
    _add_bootstrap(drawn[:, units.unit_of[units.by_request]], pending)


@dataclass(frozen=True)
class _ChunkUnits:
    """A chunk's requests (the bootstrap's units) by workload.

    Each (request, workload) pair of the chunk is a *cell unit*; they are numbered workload by workload,
    each workload's in the order of their first step, so a workload's units are one span
    (``bounds[w]:bounds[w + 1]``) and its weights the columns ``unit_of`` of the drawn ones.
    """

    names: list                # distinct requests, in the order of their first step (weights drawn for these)
    workloads: list            # distinct workloads, in the order of their first step
    step_unit: np.ndarray      # [n] each step's cell unit
    step_workload: np.ndarray  # [n] each step's workload
    unit_of: np.ndarray        # [cell units] request of each, index into names
    bounds: np.ndarray         # [workloads + 1] span of each workload's cell units
    by_request: np.ndarray     # cell units in the order of their request's first step (the all-workloads cell)

    @classmethod
    def of(cls, unit: np.ndarray, workload: np.ndarray, unit_code: np.ndarray | None = None,
           workload_code: np.ndarray | None = None) -> "_ChunkUnits":
        """``unit_code`` and ``workload_code``: the values as non-negative integers (equal codes, equal values),
        when known; else the values are numbered here by hashing."""
        ucode = _codes(unit) if unit_code is None else np.asarray(unit_code, dtype=np.int64)
        wcode = _codes(workload) if workload_code is None else np.asarray(workload_code, dtype=np.int64)
        n = len(ucode)
        change = np.ones(n, dtype=bool)
        change[1:] = (ucode[1:] != ucode[:-1]) | (wcode[1:] != wcode[:-1])
        heads = np.flatnonzero(change)
        key = ucode * (int(wcode.max()) + 1 if n else 1) + wcode
        if np.unique(key[heads]).size == heads.size:
            pair, first = np.cumsum(change) - 1, heads   # events in request order (the usual case): a pair per run
        else:
            pair = pd.factorize(key)[0]
            first = np.unique(pair, return_index=True)[1]
        pair_unit, unit_first = _first_seen(ucode[first])
        pair_workload, workload_first = _first_seen(wcode[first])
        names = np.asarray(unit, dtype=object)[first[unit_first]]
        workloads = np.asarray(workload, dtype=object)[first[workload_first]]
        order = np.argsort(pair_workload, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        step_unit = rank[pair]
        bounds = np.searchsorted(pair_workload[order], np.arange(len(workloads) + 1))
        unit_of = pair_unit[order]
        return cls(list(names), [str(w) for w in workloads], step_unit, pair_workload[pair], unit_of, bounds,
                   np.argsort(unit_of, kind="stable"))


def _codes(values: np.ndarray) -> np.ndarray:
    """Integer codes of any values (None and NaN each a value of their own)."""
    return pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=False)[0].astype(np.int64)


def _first_seen(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``codes`` renumbered in the order each first appears, and the index of that first appearance."""
    renumbered, _ = pd.factorize(codes)
    return renumbered.astype(np.int64), np.unique(renumbered, return_index=True)[1]


@dataclass(frozen=True)
class _ChunkSteps:
    """What every label kind of a chunk's steps shares, flat over (step, position): the predictions
    (clamped to [0, 1], to [EPS, 1 - EPS] and their logs, computed once for all kinds) and each
    value's cell, position and cell unit (see :class:`_KindSums`)."""

    units: _ChunkUnits
    predicted: np.ndarray   # [n * gamma] bool: a prediction is there
    p: np.ndarray
    pc: np.ndarray
    log_pc: np.ndarray
    log1m_pc: np.ndarray
    position: np.ndarray    # [n * gamma] k (0-based)
    cell: np.ndarray        # workload * gamma + k
    unit: np.ndarray        # k * cell units + cell unit

    @classmethod
    def of(cls, survival: np.ndarray, units: _ChunkUnits) -> "_ChunkSteps":
        n, gamma = survival.shape
        p = np.clip(survival.reshape(-1), 0.0, 1.0)
        pc = np.clip(p, metrics.EPS_PROB, 1.0 - metrics.EPS_PROB)
        position = np.tile(np.arange(gamma), n)
        return cls(units, ~np.isnan(p), p, pc, np.log(pc), np.log1p(-pc), position,
                   (units.step_workload[:, None] * gamma + np.arange(gamma)).reshape(-1),
                   (np.arange(gamma) * units.unit_of.size + units.step_unit[:, None]).reshape(-1))


@dataclass
class _KindSums:
    """One label kind's sums of a chunk, per (workload, position) cell and per cell unit (see :func:`add_events`).

    Per cell: ``n``, the sums of ``p``, ``y``, ``(p - y)^2`` and the log-likelihood, and per binning its bin
    counts and sums; per cell unit and position the steps, squared errors and labels, and per binning the
    bin counts and sums (:func:`~.metrics.request_bins`), which the bootstrap reweights.  ``every_bins`` and
    ``every_unit_bins`` hold the all-workloads cell's equal-mass bins.
    """

    n: np.ndarray                   # [workloads, gamma]
    totals: np.ndarray              # [4, workloads, gamma]: p, y, squared error, log-likelihood
    unit_steps: np.ndarray          # [3, gamma, cell units]: steps, squared errors, labels
    bins: dict                      # binning -> [3, workloads, gamma, bins]
    every_bins: dict                # quantile binning -> [3, gamma, bins] (the all-workloads cell's own)
    unit_bins: dict                 # binning -> [3, gamma, cell units, bins]
    every_unit_bins: dict           # quantile binning -> [3, gamma, cell units, bins]
    bounds: np.ndarray              # [workloads + 1] span of each workload's cell units
    whole_labels: bool              # every label 0 or 1 (observed labels): their sums are whole numbers

    @classmethod
    def of(cls, ev: events.RunEvents, shared: "_ChunkSteps", specs: dict, cells: dict, *,
           with_units: bool) -> "_KindSums":
        units, gamma = shared.units, ev.gamma
        n_w, n_u = len(units.workloads), units.unit_of.size
        labels = np.ascontiguousarray(ev.y.reshape(-1), dtype=np.float64)
        at = np.flatnonzero(shared.predicted & ~np.isnan(labels))   # rows in step order, positions within a step
        size = n_w * gamma
        if labels.size != shared.p.size:
            raise ValueError(f"{labels.size} labels for {shared.p.size} predictions")
        per_cell, unit_steps, whole = jit(_step_sums)(at, shared.p, labels, shared.log_pc, shared.log1m_pc,
                                                      shared.cell, shared.unit, size, gamma * n_u)
        unit_steps = unit_steps.reshape(3, gamma, n_u)

        def by_workload(per: np.ndarray) -> np.ndarray:   # [3, gamma, units, ...] -> [3, gamma, workloads, ...]
            if not n_u:
                return np.zeros(per.shape[:2] + (n_w,) + per.shape[3:])
            return np.add.reduceat(per, units.bounds[:-1], axis=2)

        steps, sq_sum, y_sum = by_workload(unit_steps).transpose(0, 2, 1)
        totals = np.stack([per_cell[0].reshape(n_w, gamma), y_sum, sq_sum, per_cell[1].reshape(n_w, gamma)])
        n = steps.astype(np.int64)
        bins, every_bins, unit_bins, every_unit_bins = {}, {}, {}, {}
        pc, y = shared.pc, labels
        for name, (n_bins, strategy) in specs.items():
            edges = [cells[(w, j)].edges[name] for w in units.workloads for j in range(gamma)]
            binner = CellBins(edges, strategy)
            if with_units:   # a cell's bins are its requests' (added up in the order of the requests)
                unit_bins[name] = binner.sums(pc, shared.cell, shared.unit, y, gamma * n_u, at=at
                                              ).reshape(3, gamma, n_u, n_bins)
                bins[name] = by_workload(unit_bins[name]).transpose(0, 2, 1, 3)
            else:
                bins[name] = binner.sums(pc, shared.cell, shared.cell, y, size, at=at).reshape(3, n_w, gamma, n_bins)
            if strategy == "uniform":
                continue
            every = CellBins([cells[("*", j)].edges[name] for j in range(gamma)], strategy)
            if with_units:
                every_unit_bins[name] = every.sums(pc, shared.position, shared.unit, y, gamma * n_u, at=at
                                                   ).reshape(3, gamma, n_u, n_bins)
                every_bins[name] = every_unit_bins[name].sum(axis=2)
            else:
                every_bins[name] = every.sums(pc, shared.position, shared.position, y, gamma, at=at)
        return cls(n, totals, unit_steps, bins, every_bins, unit_bins, every_unit_bins, units.bounds, whole)

    def add_to_cells(self, cells: dict, workloads: list) -> None:
        """Add the sums to the kind's cells (those of a workload to the all-workloads cell too, but its
        equal-mass bins)."""
        gamma = self.n.shape[1]
        for w, name in enumerate(workloads):
            for k in range(gamma):
                if not self.n[w, k]:
                    continue
                cell, every = cells[(name, k)], cells[("*", k)]
                mine = slice(int(self.bounds[w]), int(self.bounds[w + 1]))
                n_g, y_g = self.unit_steps[0, k, mine], self.unit_steps[2, k, mine]
                moments = [float(y_g @ y_g), float(y_g @ n_g), float(n_g @ n_g)]
                for c in (cell, every):
                    c.n += int(self.n[w, k])
                    c.n_requests += int(np.count_nonzero(n_g))
                    c.clustered = c.clustered + moments
                    c.p_sum, c.y_sum, c.sq_sum, c.log_sum = (
                        a + float(b) for a, b in zip((c.p_sum, c.y_sum, c.sq_sum, c.log_sum), self.totals[:, w, k]))
                for b, sums in self.bins.items():
                    shared = b not in self.every_bins
                    for c in (cell, every) if shared else (cell,):
                        acc = c.bins.setdefault(b, [np.zeros(sums.shape[-1]) for _ in range(3)])
                        for a, s in zip(acc, sums[:, w, k]):
                            a += s
        for k in range(gamma):
            if not self.n[:, k].any():
                continue
            for b, sums in self.every_bins.items():
                acc = cells[("*", k)].bins.setdefault(b, [np.zeros(sums.shape[-1]) for _ in range(3)])
                for a, s in zip(acc, sums[:, k]):
                    a += s

    def unit_columns(self, name: str, k: int, units, *, every: bool = False) -> tuple:
        """Per cell unit of ``units`` (a span or an index array) the columns the bootstrap reweights, those of
        :meth:`~.resampling.RequestSums.columns` (bin counts, prediction and label sums, then steps,
        squared errors, labels), in two blocks: whole numbers (the counts; the labels' sums too when every
        label is 0 or 1) and the rest, each block a list of views (its ``[units, columns]`` pieces, copied
        once, into the product's matrix), with the spans of that layout its columns fill, in order."""
        bins = (self.every_unit_bins if every else self.unit_bins)[name][:, k, units]
        steps = self.unit_steps[:, k, units]
        nb = bins.shape[-1]
        if self.whole_labels:
            return ([bins[0], bins[2], steps[0][:, None], steps[2][:, None]], [bins[1], steps[1][:, None]],
                    (slice(0, nb), slice(2 * nb, 3 * nb), slice(3 * nb, 3 * nb + 1), slice(3 * nb + 2, 3 * nb + 3)),
                    (slice(nb, 2 * nb), slice(3 * nb + 1, 3 * nb + 2)))
        return ([bins[0], steps[0][:, None]], [bins[1], bins[2], steps[1][:, None], steps[2][:, None]],
                (slice(0, nb), slice(3 * nb, 3 * nb + 1)), (slice(nb, 3 * nb), slice(3 * nb + 1, 3 * nb + 3)))


EXACT_FLOAT32 = 2 ** 24
"""Whole numbers below this, and sums of them, are exact in float32."""


def bootstrap_products(weights: np.ndarray, whole: np.ndarray, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(weights @ whole, weights @ rest)`` in float64: the bootstrap's two matrix products, the first taken
    in float32 when that is exact (:func:`exact_in_float32`).  Most of ``calibrate``'s time at its default
    1000 resamples (``bench/floors.py`` counts their operations)."""
    if exact_in_float32(weights, whole):
        counted = (weights.astype(np.float32) @ whole.astype(np.float32)).astype(np.float64)
    else:
        counted = weights @ whole
    return counted, weights @ rest


def exact_in_float32(weights: np.ndarray, whole: np.ndarray) -> bool:
    """Whether ``weights @ whole`` (whole numbers both) is exact in float32: every resampled sum stays below
    :data:`EXACT_FLOAT32` (the largest weight times the largest column sum bounds them)."""
    return weights.max(initial=0.0) * whole.sum(axis=0).max(initial=0.0) < EXACT_FLOAT32


def _add_bootstrap(weights: np.ndarray, pending: list) -> None:
    """``acc[key] += weights @ columns`` for each ``acc`` of ``accs`` of each ``(accs, key, whole, rest,
    whole_spans, rest_spans)`` of ``pending`` (:meth:`_KindSums.unit_columns`), as two matrix products.

    Poisson weights are whole numbers, and so are counts and the sums of 0/1 labels: while every resampled
    sum of them stays below :data:`EXACT_FLOAT32`, their product in float32 is the float64 product exactly,
    in half the time (they are a third to two thirds of the columns; the bootstrap's product was 22 of
    ``calibrate``'s 67 CPU s at 10M).
    """
    if not pending:
        return
    counted, summed = bootstrap_products(weights, np.concatenate([piece for p in pending for piece in p[2]], axis=1),
                                         np.concatenate([piece for p in pending for piece in p[3]], axis=1))
    at_c = at_r = 0
    for accs, key, c, r, c_spans, r_spans in pending:
        width = sum(s.stop - s.start for s in (*c_spans, *r_spans))
        parts = []
        for spans, product, at in ((c_spans, counted, at_c), (r_spans, summed, at_r)):
            for s in spans:
                parts.append((s, product[:, at:at + s.stop - s.start]))
                at += s.stop - s.start
        for acc in accs:
            total = acc.setdefault(key, np.zeros((weights.shape[0], width)))
            for columns, block in parts:
                total[:, columns] += block
        at_c += sum(piece.shape[1] for piece in c)
        at_r += sum(piece.shape[1] for piece in r)