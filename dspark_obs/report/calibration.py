"""Calibration figures per run x workload x position: ECE, debiased ECE, Brier, AUROC, acceptance.

Values come from the ``calibration`` table (``dspark-obs calibrate``) for the
run's best label kind (companion > reconstructed > observed, or the kind the
thresholds name).  So do the intervals, from what ``calibrate`` kept: each
bootstrap resample's figures (``calibration_resamples``), AUROC's and the
acceptance's request-clustered SEs (``auroc_se``, ``observed_rate_se``):

* ECE, debiased ECE, Brier: the value +- 1.96 request-bootstrap standard
  errors; drift is the bootstrap of the difference, tested with a z on its
  bootstrap standard error;
* AUROC: the value +- 1.96 request-clustered DeLong standard errors
  (:func:`~dspark_obs.estimators.calibration.metrics.clustered_auroc`: the same
  clustered variance as the request bootstrap, without re-ranking every step
  once per resample); drift is the z-test on the difference with those SEs;
* acceptance (share of request-steps whose first k drafts survive a full block):
  mean with a request-clustered standard error; drift is the two-proportion
  z-test on those standard errors.

A resample weighs each request by Poisson(1) weights drawn from its run, its rid
and the seed (:mod:`dspark_obs.estimators.stats`), as ``calibrate`` draws them:
a run and its baseline are resampled independently.  The
run's events are read again (:func:`dspark_obs.estimators.calibration.events.load_events`)
only when the stored figures cannot serve: a store calibrated before they were
kept, a bootstrap of another size than the thresholds ask, or a baseline of
several runs, which are pooled (their requests keep apart as ``run:rid``, each
with the current run's label kind when it has it, else its own best).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

from dspark_obs import sql as sqlmod
from dspark_obs.estimators import calibration as cal
from dspark_obs.estimators.calibration import metrics as cal_metrics
from dspark_obs.estimators import stats as bootstrap
from dspark_obs.estimators.calibration.resampling import RequestSums, ResampleWeights, resampled_together
from dspark_obs.estimators.calibration.rows import RESAMPLED
from dspark_obs.report.inputs import RunInfo
from dspark_obs.report.model import Drift, Figure
from dspark_obs.report.stats import Z95, clustered_mean, difference_ztest, two_sided_p
from dspark_obs.report.thresholds import Thresholds

__all__ = ["CalibrationSection", "calibration_section", "choose_labels", "LABEL_PREFERENCE"]

LABEL_PREFERENCE = ("companion", "reconstructed", "observed")
_BOOTSTRAPPED = ("ece", "debiased_ece", "brier", "auroc")


@dataclass
class CalibrationSection:
    figures: list[Figure] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # run -> label kind judged
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)  # calibration rows of the judged label kinds
    bins: pd.DataFrame = field(default_factory=pd.DataFrame)  # their reliability bins
    label_bins: pd.DataFrame = field(default_factory=pd.DataFrame)  # '*' bins of every label kind
    notes: list[str] = field(default_factory=list)


def choose_labels(available: set[str], preference: str = "best") -> str | None:
    """The label kind to judge: ``preference`` if available, else the best available (None if none).

    >>> choose_labels({"observed", "reconstructed"})
    'reconstructed'
    """
    if preference != "best" and preference in available:
        return preference
    return next((k for k in LABEL_PREFERENCE if k in available), None)


@dataclass
class _Events:
    y: np.ndarray
    survival: np.ndarray
    workload: np.ndarray
    unit: np.ndarray  # the request (the bootstrap unit) of each step: its number among unit_names
    unit_names: np.ndarray  # the requests as ``run:rid``, sorted
    unit_keys: np.ndarray   # each one's bootstrap key (its run's and rid's: what its weights are drawn from)
    gamma: int
    _levels: dict = field(default_factory=dict, repr=False)

    def score_levels(self, k: int) -> np.ndarray:
        """Each step's rank among the survivals at position ``k`` (clipped to [0, 1]; ties equal): sorted once
        for every workload's AUROC at ``k``."""
        if k not in self._levels:
            ranks = np.unique(np.clip(self.survival[:, k - 1], 0.0, 1.0), return_inverse=True)[1].reshape(-1)
            self._levels[k] = ranks.astype(np.int32) if ranks.size < 2**31 else ranks   # kept for every position
        return self._levels[k]


def _events(con, runs: list[tuple[str, str]]) -> _Events | None:
    parts = []
    for run, labels in runs:
        ev = cal.load_events(con, run, labels=labels)
        parts.append((run, ev))
    if not parts:
        return None
    gamma = max(ev.gamma for _, ev in parts)

    def pad(a: np.ndarray) -> np.ndarray:
        return a if a.shape[1] == gamma else np.pad(a, ((0, 0), (0, gamma - a.shape[1])), constant_values=np.nan)

    # each run's requests named once (not once per step), then numbered in the sorted order of the names
    codes, names = zip(*(_factorize(ev.rid) for _, ev in parts))
    offsets = np.cumsum([0, *(len(n) for n in names)])
    unit_names, first, rank = np.unique(np.asarray([f"{run}:{rid}" for (run, _), n in zip(parts, names) for rid in n],
                                                   dtype=str), return_index=True, return_inverse=True)
    keys = np.concatenate([bootstrap.run_unit_keys(run, list(n)) for (run, _), n in zip(parts, names)])
    return _Events(
        y=np.vstack([pad(ev.y) for _, ev in parts]),
        survival=np.vstack([pad(ev.survival) for _, ev in parts]),
        workload=np.concatenate([ev.workload.astype(object) for _, ev in parts]),
        unit=np.concatenate([rank.reshape(-1)[c + o] for c, o in zip(codes, offsets)]).astype(np.int64),
        unit_names=unit_names, unit_keys=keys[first], gamma=gamma)


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's number among the distinct values, and those (in order of first appearance)."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=False)
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


def _dense(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct non-negative ``codes`` (sorted) and each one's number among them: ``np.unique(codes,
    return_inverse=True)`` by counting, not sorting."""
    if codes.size == 0:
        return codes, codes
    present = np.zeros(int(codes.max()) + 1, dtype=np.int64)
    present[codes] = 1
    return np.flatnonzero(present), (np.cumsum(present) - 1)[codes]


class _Cell:
    """One workload of one event set: its requests indexed once, the same resamples at every position."""

    def __init__(self, ev: _Events, workload: str, n_boot: int, seed: int) -> None:
        self.mask = np.ones(len(ev.unit), bool) if workload == "*" else ev.workload == workload
        units, self.g = _dense(ev.unit[self.mask])   # numbered in the sorted order of their names
        self.n_groups = int(self.g.max()) + 1 if self.g.size else 0
        self.keys = ev.unit_keys[units]  # a request's weights follow its run and rid, as calibrate draws them
        self.ones = np.ones((1, self.n_groups))
        self.ev = ev
        self.weights = ResampleWeights(self.n_groups, n_boot, seed, self.keys)   # drawn once for every position

    def positions(self, ks: list[int], binning: str) -> dict[int, "_Position | None"]:
        """The figures' inputs at each position of ``ks`` (None: no steps); the resamples of every position
        drawn together (:func:`resampled_together`: one product per block of weights)."""
        exact, out = {}, {}
        for k in ks:
            y = self.ev.y[self.mask, k - 1]
            p = self.ev.survival[self.mask, k - 1]
            ok = ~np.isnan(y) & ~np.isnan(p)
            if not ok.any():
                out[k] = None
                continue
            y, p, g = y[ok], p[ok], self.g[ok]
            exact[k] = RequestSums(y, p, g, n_groups=self.n_groups, binning=binning)
            point = {m: float(v[0]) for m, v in exact[k](self.ones, auroc=False).items()}
            point["auroc"], auroc_se = cal_metrics.clustered_auroc(
                y, np.clip(p, 0.0, 1.0), g, n_groups=self.n_groups, levels=self.ev.score_levels(k)[self.mask][ok])
            mean, se, _ = clustered_mean(y, g, n_groups=self.n_groups)
            out[k] = _Position(point, {}, (mean, se), int(ok.sum()), auroc_se)
        for k, reps in zip(exact, resampled_together(list(exact.values()), self.weights)):
            out[k].reps.update(reps)
        return out


class _Position(NamedTuple):
    """One cell's position: exact metrics, their resamples (all but AUROC), the acceptance's request-clustered
    mean and SE, the steps, and AUROC's clustered SE."""

    point: dict
    reps: dict
    acceptance: tuple
    n: int
    auroc_se: float


def _boot_se(replicates: np.ndarray) -> float | None:
    r = replicates[np.isfinite(replicates)]
    return float(r.std(ddof=1)) if r.size >= 2 else None


def _normal_interval(value: float | None, replicates: np.ndarray, metric: str
                     ) -> tuple[float | None, float | None]:
    """``value +- 1.96 SE`` with the bootstrap SE, kept within the metric's range (``calibrate``'s interval).

    Not the percentile interval: the ECE's replicates sit above the ECE (its
    sampling bias, which the debiased ECE removes), so a percentile interval
    can miss the estimate altogether.
    """
    if value is None:
        return None, None
    lo, hi = cal_metrics.normal_interval(value, np.asarray(replicates, dtype=np.float64), 0.95,
                                   lower=None if metric == "debiased_ece" else 0.0)
    return (None, None) if np.isnan(lo) else (lo, hi)


def _interval(value: float | None, at: _Position, metric: str) -> tuple[float | None, float | None]:
    """The figure's 95% interval: AUROC's from its clustered SE, the others' from their resamples."""
    if metric != "auroc":
        return _normal_interval(value, at.reps[metric], metric)
    if value is None or not math.isfinite(at.auroc_se):
        return None, None
    return max(0.0, value - Z95 * at.auroc_se), min(1.0, value + Z95 * at.auroc_se)


def _value(row: dict | None, column: str, fallback: float) -> float | None:
    v = row.get(column) if row else None
    v = fallback if v is None or (isinstance(v, float) and np.isnan(v)) else v
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)


def calibration_section(con, runs: list[RunInfo], baselines: dict[str, list[RunInfo]], th: Thresholds
                        ) -> CalibrationSection:
    """Figures, chart frames and notes of the calibration section (see the module docstring)."""
    out = CalibrationSection()
    ids = sorted({r.run_id for r in runs} | {b.run_id for bs in baselines.values() for b in bs})
    table = sqlmod.query(con, "report_calibration", {"runs": ids, "binning": th.binning}).to_pandas()
    bins = sqlmod.query(con, "report_calibration_bins", {"runs": ids, "binning": th.binning}).to_pandas()
    resamples = sqlmod.query(con, "report_calibration_resamples", {"runs": ids, "binning": th.binning}).to_pandas()
    kept = _Kept(table, resamples, th.n_bootstrap)
    kinds = {run: set(sub["labels"]) for run, sub in table.groupby("run_id")} if not table.empty else {}
    judged_rows, judged_bins = [], []
    for run in runs:
        labels = choose_labels(kinds.get(run.run_id, set()), th.labels)
        if labels is None:
            out.notes.append(f"{run.run_id}: no calibration ({run.mode or 'unknown'} mode"
                             f"{': static runs build no confidence head' if run.mode == 'static' else ''})")
            continue
        if th.labels not in ("best", labels):
            out.notes.append(f"{run.run_id}: no {th.labels} labels; judged on {labels} labels")
        out.labels[run.run_id] = labels
        rows = table[(table["run_id"] == run.run_id) & (table["labels"] == labels)]
        judged_rows.append(rows)
        judged_bins.append(bins[(bins["run_id"] == run.run_id) & (bins["labels"] == labels)])
        out.figures += _run_figures(con, run, labels, rows, baselines.get(run.run_id, []), kinds, th, out.notes, kept)
    if judged_rows:
        out.rows = _with_report_intervals(pd.concat(judged_rows, ignore_index=True), out.figures)
        out.bins = pd.concat(judged_bins, ignore_index=True)
    judged_ids = list(out.labels)
    out.label_bins = bins[bins["run_id"].isin(judged_ids) & (bins["workload"] == "*")].reset_index(drop=True)
    return out


def _with_report_intervals(rows: pd.DataFrame, figures: list[Figure]) -> pd.DataFrame:
    """The rows with ``ece_ci_lo``/``ece_ci_hi`` set to the report's ECE intervals, so charts match the tables."""
    ci = {(f.run_id, f.workload, f.position): (f.ci_low, f.ci_high) for f in figures if f.metric == "ece"}
    keys = list(zip(rows["run_id"], rows["workload"], rows["position"].astype(int)))
    rows = rows.copy()
    rows["ece_ci_lo"] = [ci.get(k, (None, None))[0] for k in keys]
    rows["ece_ci_hi"] = [ci.get(k, (None, None))[1] for k in keys]
    return rows


def _run_figures(con, run: RunInfo, labels: str, rows: pd.DataFrame, baseline: list[RunInfo],
                 kinds: dict[str, set[str]], th: Thresholds, notes: list[str], kept: "_Kept") -> list[Figure]:
    base_pairs = []
    for b in baseline:
        kind = labels if labels in kinds.get(b.run_id, set()) else choose_labels(kinds.get(b.run_id, set()))
        if kind is None:
            notes.append(f"baseline {b.run_id}: no calibration; left out of the calibration drift tests")
            continue
        if kind != labels:
            notes.append(f"baseline {b.run_id}: no {labels} labels; compared on its {kind} labels")
        base_pairs.append((b.run_id, kind))
    base_ids = [r for r, _ in base_pairs]
    now_kept = kept.positions(run.run_id, labels)
    then_kept = kept.positions(*base_pairs[0]) if len(base_pairs) == 1 else None
    ev = base_ev = None
    if now_kept is None:
        try:
            ev = _events(con, [(run.run_id, labels)])
        except ValueError as exc:  # CalibrationDataError: the table exists but the events cannot be rebuilt
            notes.append(f"{run.run_id}: calibration intervals unavailable: {exc}")
    if base_pairs and then_kept is None:
        try:
            base_ev = _events(con, base_pairs)
        except ValueError as exc:
            notes.append(f"baseline calibration events unavailable: {exc}")
    figures = []
    for workload in list(dict.fromkeys(rows["workload"])):
        records = rows[rows["workload"] == workload].to_dict("records")
        ks = sorted({int(row["position"]) for row in records})
        now = _cell_positions(now_kept, ev, workload, ks, th)
        then = _cell_positions(then_kept, base_ev, workload, ks, th) if base_pairs else {}
        for row in records:
            k = int(row["position"])
            figures += _position_figures(run.run_id, workload, k, row, labels, now.get(k), then.get(k), base_ids, th)
    return figures


def _cell_positions(kept: dict | None, ev: _Events | None, workload: str, ks: list[int], th: Thresholds) -> dict:
    """A workload's positions from what ``calibrate`` kept, else resampled from the events (empty: neither)."""
    if kept is not None:
        return {k: kept.get((workload, k)) for k in ks}
    if ev is None or not (workload == "*" or (ev.workload == workload).any()):
        return {}
    return _Cell(ev, workload, th.n_bootstrap, th.seed).positions(ks, th.binning)


class _Kept:
    """The figures ``calibrate`` kept per run and label kind: a cell's :class:`_Position` without its events."""

    def __init__(self, table: pd.DataFrame, resamples: pd.DataFrame, n_boot: int) -> None:
        self.table, self.n_boot = table, n_boot
        self.resamples = {key: part for key, part in resamples.groupby(["run_id", "labels"])} if len(resamples) else {}

    def positions(self, run_id: str, labels: str) -> dict | None:
        """``(workload, k) -> _Position`` of the run's cells; None when the stored figures cannot serve (a store
        calibrated before they were kept, or a bootstrap of another size than the thresholds ask)."""
        rows = self.table[(self.table["run_id"] == run_id) & (self.table["labels"] == labels)]
        rows = rows[rows["n"] > 0]
        if rows.empty or not rows["observed_rate_se"].notna().any() or (rows["bootstrap"] != self.n_boot).any():
            return None
        reps: dict = {}
        if self.n_boot:
            part = self.resamples.get((run_id, labels))
            if part is None:
                return None
            for (w, k), cell in part.groupby(["workload", "position"]):   # rows in resample order (the query's)
                reps[w, int(k)] = {m: cell[m].to_numpy(dtype=np.float64, na_value=np.nan) for m in RESAMPLED}
            if any(len(r["ece"]) != self.n_boot for r in reps.values()) or len(reps) != len(rows):
                return None
        return {(row["workload"], int(row["position"])): _kept_position(row, reps.get((row["workload"],
                                                                                     int(row["position"])), {}))
                for row in rows.to_dict("records")}


def _kept_position(row: dict, reps: dict) -> "_Position":
    def num(column: str) -> float:
        v = row.get(column)
        return math.nan if v is None or pd.isna(v) else float(v)

    point = {m: num(m) for m in ("ece", "debiased_ece", "brier", "auroc")}
    point["acceptance"] = num("observed_rate")
    reps = reps or {m: np.zeros(0) for m in RESAMPLED}   # no bootstrap: no intervals
    return _Position(point, dict(reps), (point["acceptance"], num("observed_rate_se")), int(row["n"]), num("auroc_se"))


def _position_figures(run_id: str, workload: str, k: int, row: dict, labels: str, c: _Position | None,
                      b: _Position | None, base_ids: list[str], th: Thresholds) -> list[Figure]:
    detail = {"labels": labels, "binning": th.binning, "label_source": row.get("label_source"),
              "n_requests": row.get("n_requests")}
    figures = []
    n = int(row["n"])
    for metric in _BOOTSTRAPPED:
        delong = metric == "auroc"
        value = _value(row, metric, c.point[metric] if c else np.nan)
        lo, hi = (_interval(value, c, metric) if c else (None, None))
        drift = Drift(test="z-test on the difference (request-clustered DeLong SEs)" if delong else
                      "request-bootstrap difference (z on the bootstrap SE)", baseline_runs=base_ids)
        if c and b and np.isfinite(c.point[metric]) and np.isfinite(b.point[metric]):
            drift.baseline_value = b.point[metric]
            drift.baseline_ci = _interval(b.point[metric], b, metric)
            drift.baseline_n = b.n
            if delong:   # independent runs: the SEs add in quadrature
                drift.delta, se, drift.p_value = difference_ztest(c.point[metric], c.auroc_se,
                                                                  b.point[metric], b.auroc_se)
            else:
                drift.delta = c.point[metric] - b.point[metric]
                se = _boot_se(c.reps[metric] - b.reps[metric])
                if se is not None:
                    drift.p_value = two_sided_p(drift.delta / se) if se > 0 else (1.0 if drift.delta == 0 else 0.0)
            if se is not None:
                drift.delta_ci = (drift.delta - Z95 * se, drift.delta + Z95 * se)
        elif base_ids and c and not b:
            drift.verdict, drift.note = "no_baseline", f"the baseline has no {workload} steps at k={k}"
        method = "value +- 1.96 request-clustered DeLong SE" if delong else "value +- 1.96 request-bootstrap SE"
        figures.append(Figure(metric, run_id, value, workload=workload, position=k, ci_low=lo, ci_high=hi,
                              ci_method=method if lo is not None else None, n=n,
                              detail=dict(detail), drift=drift))
    # acceptance: the share whose first k drafts survive, request-clustered
    value = _value(row, "observed_rate", c.point["acceptance"] if c else np.nan)
    lo = hi = se = None
    if c:
        se = c.acceptance[1]
        if se is not None and np.isfinite(se):
            lo, hi = max(0.0, value - Z95 * se), min(1.0, value + Z95 * se)
    drift = Drift(test="two-proportion z-test (request-clustered SEs)", baseline_runs=base_ids)
    if c and b:
        mean_b, se_b = b.acceptance
        drift.baseline_value, drift.baseline_n = mean_b, b.n
        if se_b is not None and np.isfinite(se_b):
            drift.baseline_ci = (max(0.0, mean_b - Z95 * se_b), min(1.0, mean_b + Z95 * se_b))
        drift.delta, s, drift.p_value = difference_ztest(value, se, mean_b, se_b)
        if s is not None:
            drift.delta_ci = (drift.delta - Z95 * s, drift.delta + Z95 * s)
    figures.append(Figure("acceptance", run_id, value, workload=workload, position=k, ci_low=lo, ci_high=hi,
                          ci_method="normal, request-clustered SE" if lo is not None else None, n=n,
                          detail=dict(detail), drift=drift))
    return figures
