"""Calibration of the confidence head's survival, position by position: the tables.

The event at position ``k`` (1..gamma) of a request-step is *the first k drafts
all survive a full-block verify*; the head predicts it with its survival
``S_k = c_1 * ... * c_k``.  Three modules, one concept each:

* :mod:`dspark_obs.estimators.calibration.events` -- the events and where their
  labels come from (``observed``, ``reconstructed``, ``companion``; and why
  ``observed`` labels of a compact run are biased): :func:`~dspark_obs.estimators.calibration.events.load_events`.
* :mod:`dspark_obs.estimators.calibration.metrics` -- the metrics, pure
  functions in scikit-learn's style (``y_true, y_prob`` positional, options
  keyword-only; ``y_true`` may hold soft labels in [0, 1]).
* this module -- :func:`calibrate_run`, the thin layer that reads a run's
  events, scores them per workload x position x binning and writes the
  ``calibration`` and ``calibration_bins`` tables
  (:mod:`dspark_obs.estimators.calibration.chunks` when the run is large).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_obs import schema
from dspark_obs import sql as sqlmod
from dspark_obs.estimators import stats as bootstrap
from dspark_obs.estimators.calibration import chunks
from dspark_obs.estimators.calibration import ray as calibration_ray
from dspark_obs.estimators.calibration import events
from dspark_obs.estimators.calibration.events import CalibrationDataError, RunEvents
from dspark_obs.estimators.calibration.resampling import RequestSums, figures_of_sums
from dspark_obs.estimators.calibration.rows import cell_rows, resample_table_of
from dspark_obs.estimators.calibration.metrics import (
    BINNINGS,
    binned,
    brier_score_loss,
    log_loss,
    none_if_nan,
    parse_binning,
    clustered_auroc,
)
from dspark_obs.estimators.chunks import ALL, DEFAULT_CHUNK_ROWS
from dspark_obs.schema import CALIBRATION, CALIBRATION_BINS

__all__ = ["RunCalibration", "summarise_events", "calibrate_run", "calibrate_kinds"]

_f64, _str, _i16, _i32, _i64 = pa.float64(), pa.string(), pa.int16(), pa.int32(), pa.int64()


_fld = schema.field  # a documented column


# -- the thin layer ------------------------------------------------------------------


@dataclass(frozen=True)
class RunCalibration:
    """What :func:`calibrate_run` wrote: rows of ``calibration``, ``calibration_bins`` and
    ``calibration_resamples``."""

    run_id: str
    labels: str
    summary: pa.Table
    bins: pa.Table
    notes: tuple[str, ...] = field(default=())
    resamples: pa.Table | None = None   # calibration_resamples rows (none without --bootstrap)


def _position_rows(ev: RunEvents, mask: np.ndarray, k: int, workload: str, binnings, weights, gidx,
                   level: float, n_boot: int) -> tuple[list[dict], list[dict]]:
    y, p = ev.y[mask, k], ev.survival[mask, k]
    ok = ~np.isnan(y) & ~np.isnan(p)
    y, p, g = y[ok], np.clip(p[ok], 0.0, 1.0), gidx[mask][ok]
    n_groups = int(gidx[mask].max()) + 1 if mask.any() else 0   # the cell's requests (columns of weights)
    base = {"workload": workload, "position": k + 1, "labels": ev.labels}
    common = {"mode": ev.mode or None, "label_source": ev.label_source, "n": int(y.size),
              "n_requests": int(np.count_nonzero(np.bincount(g))) if g.size else 0,  # distinct groups (g >= 0)
              "bootstrap": n_boot if y.size and n_boot else 0}
    if y.size:
        common.update(mean_predicted=float(p.mean()), observed_rate=float(y.mean()), brier=brier_score_loss(y, p),
                      log_loss=log_loss(y, p), **dict(zip(("auroc", "auroc_se"), map(none_if_nan, clustered_auroc(
                          y, p, g, n_groups=n_groups)))),
                      observed_rate_se=none_if_nan(bootstrap.clustered_mean(y, g, n_groups=n_groups)[1]))
    bins = {name: binned(y, p, *parse_binning(name)) if y.size else None for name in binnings}

    def resamples(name: str, b) -> dict:
        sums = RequestSums(y, p, g, n_groups=n_groups, binning=name, edges=b.edges)
        return figures_of_sums(weights @ sums.columns(), b.count.size)

    return cell_rows(base, common, bins, level=level, resamples=resamples if n_boot else None)


def _check_options(binnings, n_bootstrap, confidence_level) -> None:
    for name in binnings:
        parse_binning(name)
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, (int, np.integer)) or n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be an integer >= 0 (0 = no CI), got {n_bootstrap!r}")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level!r}")


def summarise_events(ev: RunEvents, *, binnings=BINNINGS, n_bootstrap: int = 1000, confidence_level: float = 0.95,
                     seed: int = 0) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The ``calibration``, ``calibration_bins`` and ``calibration_resamples`` rows of one :class:`RunEvents`
    (pure)."""
    _check_options(binnings, n_bootstrap, confidence_level)
    rows, bin_rows, resample_rows = [], [], []
    wl_code, wl_values = _factorize(ev.workload)
    workloads = ["*", *wl_values]
    rid_code, rid_values = _factorize(ev.rid)  # codes in sorted order of the rids
    keys = bootstrap.run_unit_keys(ev.run_id, rid_values) if n_bootstrap else None
    for i, workload in enumerate(workloads):
        mask = np.ones(len(ev.rid), dtype=bool) if workload == "*" else wl_code == i - 1
        gidx = _dense(rid_code[mask])  # np.unique(ev.rid[mask], return_inverse=True)[1], without sorting strings
        full_gidx = np.zeros(len(ev.rid), dtype=np.int64)
        full_gidx[mask] = gidx
        n_groups = int(gidx.max()) + 1 if gidx.size else 0
        # Poisson weights per request (the same for a request in every group and on every shard of the run)
        weights = (bootstrap.poisson_weights(keys[np.unique(rid_code[mask])], n_bootstrap, seed)
                   if n_bootstrap and n_groups else None)
        for k in range(ev.gamma):
            r, b, s = _position_rows(ev, mask, k, workload, binnings, weights, full_gidx, confidence_level,
                                     n_bootstrap if weights is not None else 0)
            rows += r
            bin_rows += b
            resample_rows += s
    return (pa.Table.from_pylist(rows, schema=CALIBRATION.remove_metadata()),
            pa.Table.from_pylist(bin_rows, schema=CALIBRATION_BINS.remove_metadata()), resample_table_of(resample_rows))


def _factorize(values: np.ndarray) -> tuple[np.ndarray, list]:
    """Codes of ``values`` numbered in their sorted order, and the sorted distinct values.

    The same numbering as ``np.unique(values, return_inverse=True)``, by hashing
    each value once and sorting only the distinct ones.
    """
    import pandas as pd  # at call time: the one pandas use here; the SGLang fidelity venv has no pandas

    codes, uniques = pd.factorize(np.asarray(values), use_na_sentinel=False)
    uniques = np.asarray(uniques, dtype=object if np.asarray(values).dtype == object else None)
    if uniques.size == 0:
        return codes.astype(np.int64), []
    order = np.argsort(uniques, kind="stable")
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return rank[codes], uniques[order].tolist()


def _dense(codes: np.ndarray) -> np.ndarray:
    """Renumber non-negative codes 0..k-1 keeping their order (``np.unique(codes, return_inverse=True)[1]``)."""
    if codes.size == 0:
        return codes.astype(np.int64)
    present = np.zeros(int(codes.max()) + 1, dtype=np.int64)
    present[codes] = 1
    return (np.cumsum(present) - 1)[codes]


def calibrate_run(con_or_store, run_id: str, *, labels: str = "observed", companion: str | None = None,
                  binnings=BINNINGS, n_bootstrap: int = 1000, confidence_level: float = 0.95, seed: int = 0,
                  write: bool = True, chunk_rows: int | None = None, sample_rows: int | None = None,
                  progress=None, engine=None) -> RunCalibration:
    """Score a run's survival predictions per workload x position x binning and store the result.

    ``con_or_store``: a :class:`~dspark_obs.store.Store`, a data root, or a
    connection from :func:`dspark_obs.sql.connect`.  ``labels``: one of
    :data:`LABEL_KINDS` (see :mod:`~dspark_obs.estimators.calibration.events`).
    ``n_bootstrap`` request-level resamples give ``ece_ci_lo/hi`` (0 = none;
    ``seed`` makes them reproducible).

    A run of more than ``chunk_rows`` labelled steps (default 150k) is read a
    chunk of whole requests at a time, so memory does not grow with the run
    (:mod:`~dspark_obs.estimators.calibration.chunks`): every figure is then the
    one-pass value up to the order of float additions, except AUROC and the
    edges of equal-mass bins, which come from a sample of blocks of whole requests
    chosen by rid hash (``sample_rows`` steps, default 500k) when the run holds more.
    ``progress(done_steps, total_steps)`` is called after each chunk.
    ``engine`` (a :class:`dspark_obs.ray_engine.RayEngine`) sums shards of the
    requests (by rid hash) as Ray tasks, whatever the run's size: the chunked
    figures, which for a run of one chunk are the one-pass ones up to the order
    of float additions (the bootstrap's weights are drawn per request).

    The rows of (``run_id``, ``labels``) in ``calibration`` and
    ``calibration_bins`` replace older ones; other label kinds are kept.
    """
    result = calibrate_kinds(con_or_store, run_id, (labels,), companion=companion, binnings=binnings,
                             n_bootstrap=n_bootstrap, confidence_level=confidence_level, seed=seed, write=write,
                             chunk_rows=chunk_rows, sample_rows=sample_rows, progress=progress, engine=engine)[labels]
    if isinstance(result, Exception):
        raise result
    return result


def calibrate_kinds(con_or_store, run_id: str, kinds, *, companion: str | None = None, binnings=BINNINGS,
                    n_bootstrap: int = 1000, confidence_level: float = 0.95, seed: int = 0, write: bool = True,
                    chunk_rows: int | None = None, sample_rows: int | None = None, progress=None,
                    engine=None) -> dict:
    """:func:`calibrate_run` of each label kind of ``kinds``, each chunk of the run read once for all of them
    (observed and reconstructed labels come from one read: the steps with their ceiling estimates).

    Returns ``kind -> RunCalibration``, or the :class:`CalibrationDataError` that kind raised (the
    others are still calibrated), in the order of ``kinds``.
    """
    _check_options(binnings, n_bootstrap, confidence_level)
    chunk_rows = chunk_rows or DEFAULT_CHUNK_ROWS
    con, store = sqlmod.connection_and_store(con_or_store)
    steps = chunks.run_steps(con, run_id)
    plans, out = {}, {}
    for kind in kinds:
        try:
            plans[kind] = chunks.plan_run(con, run_id, labels=kind, companion=companion, chunk_rows=chunk_rows,
                                          units=n_bootstrap > 0, steps=steps)
        except CalibrationDataError as exc:
            out[kind] = exc
    options = dict(binnings=binnings, n_bootstrap=n_bootstrap, confidence_level=confidence_level, seed=seed,
                   sample_rows=sample_rows, progress=progress, engine=engine)
    try:
        tables = _tables(con, run_id, plans, out, **options) if plans else {}
    except CalibrationDataError:  # one kind's data (say, its ceiling estimates) is unusable: each kind on its own
        if len(plans) == 1:
            raise
        tables = {}
        for kind in plans:
            try:
                tables.update(_tables(con, run_id, {kind: plans[kind]}, out, **options))
            except CalibrationDataError as exc:
                out[kind] = exc
    for kind, (summary, bins, resamples, notes) in tables.items():
        if write:
            for table, rows in (("calibration", summary), ("calibration_bins", bins),
                                ("calibration_resamples", resamples)):
                _replace_labels(store, table, run_id, kind, rows)
        out[kind] = RunCalibration(run_id, kind, summary, bins, notes, resamples)
    return {kind: out[kind] for kind in kinds}


def _tables(con, run_id: str, plans: dict, errors: dict, *, binnings, n_bootstrap, confidence_level, seed,
            sample_rows, progress, engine) -> dict:
    """``kind -> (summary, bins, notes)`` of the planned kinds: in one pass, or a chunk at a time."""
    reads = chunks.RunReads.of(con, run_id, plans)
    n_chunks = len(next(iter(plans.values())).chunks)
    if engine is not None and n_chunks < getattr(engine, "min_chunks", 0):
        engine = None   # --jobs on a run of one chunk: this process
    if n_chunks == 1 and engine is None:  # one pass
        return _one_pass(con, reads, binnings=binnings, n_bootstrap=n_bootstrap, confidence_level=confidence_level,
                         seed=seed, progress=progress, errors=errors)
    return chunks.summarise_in_chunks(
        con, reads, binnings=binnings, n_bootstrap=n_bootstrap, confidence_level=confidence_level, seed=seed,
        sample_rows=sample_rows or chunks.DEFAULT_SAMPLE_ROWS, progress=progress,
        accumulate=None if engine is None else functools.partial(calibration_ray.accumulate, engine))


def _one_pass(con, reads, *, binnings, n_bootstrap, confidence_level, seed, progress, errors: dict) -> dict:
    """``kind -> tables`` of a run of one chunk, read once; a kind without labelled steps goes to ``errors``."""
    plan = next(iter(reads.plans.values()))
    tables = {}
    for kind, (ev, counts) in reads.read(con, ALL, int(plan.step_rows.sum())).items():
        p = reads.plans[kind]
        try:
            counts["total"] = events.check_labelled(con, reads.run_id, kind, p.mode, p.source, len(ev.rid))
        except CalibrationDataError as exc:
            errors[kind] = exc
            continue
        summary, bins, resamples = summarise_events(ev, binnings=binnings, n_bootstrap=n_bootstrap,
                                                    confidence_level=confidence_level, seed=seed)
        tables[kind] = (summary, bins, resamples, events.notes_of(kind, p.mode, p.params.get("method"), counts))
        if progress is not None:
            progress(len(ev.rid), len(ev.rid))
    return tables


def _replace_labels(store, table: str, run_id: str, labels: str, rows: pa.Table) -> None:
    """Rewrite the run's partition of ``table`` with ``rows`` in place of the old ``labels`` rows.

    The store has no atomic partition replace, so a reader may briefly see the
    partition empty (between the drop and the write).
    """
    old = store.read(table, run_id).drop_columns(["run_id"])
    keep = old.filter(pc.not_equal(old.column("labels"), labels)) if old.num_rows else old
    merged = pa.concat_tables([keep.cast(rows.schema), rows]) if keep.num_rows else rows
    store.drop_run(table, run_id)
    store.write(table, run_id, merged)
