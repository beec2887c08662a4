"""Sequential Temperature Scaling (STS) of the confidence head, as SGLang fits it.

SGLang applies per-position temperatures to the head's raw logits,
``c_k = sigmoid(raw_k / T_k)``, loaded from ``--speculative-dspark-confidence-sts-path``
(a JSON ``{temperatures, dataset, num_samples, ece_before, ece_after}``).  Its
fitting script (``sglang/benchmark/dspark_sts_fit.py``) goes position by
position: with ``T_1..T_{k-1}`` fixed, it picks ``T_k`` from a 41-point log grid
on [0.1, 10] minimising the 15-bin equal-width ECE of the *survival*
``S_k = prod_{i<=k} sigmoid(raw_i / T_i)`` against the event "the first k drafts
were accepted", over all samples (not only the survivors of position k-1); the
first grid point wins ties.  :func:`fit_sts` does the same and then refines each
``T_k`` continuously (bounded Brent search between the grid neighbours of the
best grid point), keeping the refinement only when it lowers the ECE.

The records carry the confidences *after* the server's own STS, so the raw
logits are recovered as ``raw = logit(c) * T_current`` (:func:`raw_logits`);
the fitted temperatures replace the current ones (they are not a correction on
top of them).  Positions whose label is unknown (NaN; e.g. the censored tail of
a compact step) are left out of that position's ECE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import minimize_scalar

from dspark_obs.estimators.calibration.metrics import EPS_PROB, binned, check_binning, ece_of
from dspark_obs.sts_format import StsCalibration  # the file's one declaration (re-exported here)

__all__ = ["SGLANG_GRID", "StsCalibration", "StsFit", "raw_logits", "fit_sts", "fit_sts_run"]

SGLANG_GRID = np.logspace(math.log10(0.1), math.log10(10.0), 41).astype(np.float32).astype(np.float64)
"""SGLang's ``default_temperature_grid()``: 41 log-spaced temperatures on [0.1, 10], as the
float32 values ``torch.logspace`` makes (so a grid fit picks bit-identical temperatures)."""
_CONF_EPS = 1e-7  # recorded confidences are float32 (and 4-decimal in the emulator): keep logit finite


def raw_logits(confidence, *, temperatures=None) -> np.ndarray:
    """Raw head logits from reported confidences: ``logit(c) * T`` (shape (n, gamma)).

    ``temperatures`` (length gamma) are those the server applied (its STS file);
    None means none were applied (all 1).  Confidences are clamped to
    [1e-7, 1 - 1e-7] first (float32 resolution), NaN stays NaN.

    >>> raw_logits([[0.5, 0.8]], temperatures=[1.0, 2.0]).round(4).tolist()
    [[0.0, 2.7726]]
    """
    c = np.asarray(confidence, dtype=np.float64)
    if c.ndim != 2:
        raise ValueError(f"confidence must be 2-D (n, gamma), got shape {c.shape}")
    if np.nanmin(c, initial=0.0) < 0 or np.nanmax(c, initial=1.0) > 1:
        raise ValueError(f"confidence has values outside [0, 1]: min {np.nanmin(c):g}, max {np.nanmax(c):g}")
    c = np.clip(c, _CONF_EPS, 1.0 - _CONF_EPS)
    z = np.log(c) - np.log1p(-c)
    if temperatures is not None:
        t = _check_temperatures(temperatures, c.shape[1], "temperatures")
        z = z * t
    return z


def _check_temperatures(temperatures, gamma: int, name: str) -> np.ndarray:
    t = np.asarray(temperatures, dtype=np.float64).reshape(-1)
    if t.size != gamma:
        raise ValueError(f"{name} has {t.size} values but gamma is {gamma}; pass the STS file the server "
                         "was started with (--current-sts)")
    if not np.all(np.isfinite(t) & (t > 0)):
        raise ValueError(f"{name} must all be finite and > 0, got {t.tolist()}")
    return t


@dataclass(frozen=True)
class StsFit:
    """Fitted STS temperatures and per-position ECE (lists of length gamma).

    ``ece_before``: the raw head (all T = 1), as SGLang reports it;
    ``ece_after``: with the fitted temperatures; ``ece_reported``: with the
    temperatures the server ran with (what the records show), when known.
    """

    temperatures: list[float]
    grid_temperatures: list[float]
    ece_before: list[float]
    ece_after: list[float]
    num_samples: int
    n_labelled: list[int]
    ece_reported: list[float] | None = None
    labels: str = ""
    dataset: str = ""

    def to_sglang(self) -> StsCalibration:
        """The SGLang STS file of this fit (write it with ``.to_json()``)."""
        return StsCalibration(temperatures=[float(t) for t in self.temperatures], dataset=self.dataset,
                              num_samples=int(self.num_samples),
                              ece_before=[_finite(x) for x in self.ece_before],
                              ece_after=[_finite(x) for x in self.ece_after])


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else 0.0


_GRID_CELLS = 1 << 23  # temperatures x samples evaluated at once: ~64 MB per float64 array


def _grid_ece(prev: np.ndarray, z: np.ndarray, y: np.ndarray, temps: np.ndarray, n_bins: int) -> np.ndarray:
    """ECE of ``prev * sigmoid(z / T)`` for every T in ``temps`` (SGLang's binning).

    As many temperatures at once as fit in ``_GRID_CELLS`` cells (one at a time
    on a run of millions of steps, where the whole grid would take gigabytes);
    each temperature's ECE is the same whatever the block.
    """
    step = max(1, _GRID_CELLS // max(len(y), 1))
    if len(temps) <= step:
        return _grid_ece_block(prev, z, y, temps, n_bins)
    return np.concatenate([_grid_ece_block(prev, z, y, temps[i:i + step], n_bins)
                           for i in range(0, len(temps), step)])


def _grid_ece_block(prev: np.ndarray, z: np.ndarray, y: np.ndarray, temps: np.ndarray, n_bins: int) -> np.ndarray:
    probs = prev[None, :] / (1.0 + np.exp(-z[None, :] / temps[:, None]))
    probs = np.clip(probs, EPS_PROB, 1.0 - EPS_PROB)
    ids = np.clip((probs * n_bins).astype(np.int64), 0, n_bins - 1) + n_bins * np.arange(len(temps))[:, None]
    size = n_bins * len(temps)
    psum = np.bincount(ids.ravel(), weights=probs.ravel(), minlength=size)
    ysum = np.bincount(ids.ravel(), weights=np.broadcast_to(y, probs.shape).ravel(), minlength=size)
    return np.abs(psum - ysum).reshape(len(temps), n_bins).sum(axis=1) / max(len(y), 1)


def fit_sts(logits, y_true, *, n_bins: int = 15, grid=None, refine: bool = True) -> StsFit:
    """Fit one temperature per position, sequentially, minimising the survival ECE.

    Parameters
    ----------
    logits : array-like of shape (n, gamma)
        Raw head logits (see :func:`raw_logits`).
    y_true : array-like of shape (n, gamma)
        Label of "the first k drafts survive" (0/1, soft labels in [0, 1], or NaN
        where unknown).  SGLang's ``prefix_mask``.
    n_bins : int, default 15
        Equal-width ECE bins (SGLang's default).
    grid : array-like, default :data:`SGLANG_GRID`
    refine : bool, default True
        Refine each grid optimum with ``scipy.optimize.minimize_scalar`` (bounded)
        between its grid neighbours; ``False`` reproduces SGLang's fit exactly.

    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(1.0, 2.0, size=(4000, 1))
    >>> y = (rng.random((4000, 1)) < 1 / (1 + np.exp(-z / 2.0))).astype(float)  # true T = 2
    >>> fit = fit_sts(z, y)
    >>> bool(1.6 < fit.temperatures[0] < 2.5), fit.ece_after[0] < fit.ece_before[0]
    (True, True)
    """
    z, y, temps = _checked_fit_inputs(logits, y_true, n_bins, grid)
    known = ~np.isnan(y)
    n, gamma = z.shape
    surv_one, surv_fit = np.ones(n), np.ones(n)
    out = {"t": [], "grid_t": [], "before": [], "after": [], "n": []}
    for k in range(gamma):
        zk = z[:, k]
        surv_one = surv_one / (1.0 + np.exp(-zk))
        m = known[:, k] & np.isfinite(zk) & np.isfinite(surv_fit)
        yk = y[m, k]
        if not m.any():  # no labels here: keep T = 1 (SGLang would fail on an empty position)
            before, t_best, ece_best, t_grid = math.nan, 1.0, math.nan, 1.0
        else:
            before = ece_of(binned(yk, surv_one[m], n_bins, "uniform"))
            eces = _grid_ece(surv_fit[m], zk[m], yk, temps, n_bins)
            i = int(np.argmin(eces))  # the first minimum, as SGLang's strict '<' keeps
            t_grid = t_best = float(temps[i])
            ece_best = float(eces[i])
            if refine and temps.size > 1:
                t_best, ece_best = _refine(surv_fit[m], zk[m], yk, temps, i, n_bins, t_best, ece_best)
        surv_fit = surv_fit / (1.0 + np.exp(-zk / t_best))
        for key, value in (("t", t_best), ("grid_t", t_grid), ("before", before), ("after", ece_best),
                           ("n", int(m.sum()))):
            out[key].append(value)
    return StsFit(out["t"], out["grid_t"], out["before"], out["after"], n, out["n"])


def _checked_fit_inputs(logits, y_true, n_bins, grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(logits, labels, temperature grid)`` as float arrays, refused with the bad value when unusable."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(y_true, dtype=np.float64)
    if z.ndim != 2 or y.shape != z.shape:
        raise ValueError(f"logits and y_true must both have shape (n, gamma); got {z.shape} and {y.shape}")
    if z.shape[0] == 0:
        raise ValueError("fit_sts needs at least one sample (got an empty array)")
    known = ~np.isnan(y)
    if np.any(~np.isfinite(z) & known):
        raise ValueError("logits have non-finite values where a label is known")
    if np.any((y[known] < 0) | (y[known] > 1)):
        raise ValueError(f"y_true has values outside [0, 1]: min {np.nanmin(y):g}, max {np.nanmax(y):g}")
    check_binning(n_bins, "uniform")
    temps = SGLANG_GRID if grid is None else np.asarray(grid, dtype=np.float64)
    if temps.ndim != 1 or temps.size == 0 or not np.all(temps > 0):
        raise ValueError(f"grid must be a non-empty 1-D array of positive temperatures, got {temps!r}")
    return z, y, temps


def _refine(prev, z, y, temps, i, n_bins, t_grid, ece_grid) -> tuple[float, float]:
    lo, hi = math.log(temps[max(i - 1, 0)]), math.log(temps[min(i + 1, temps.size - 1)])
    res = minimize_scalar(lambda u: _grid_ece(prev, z, y, np.array([math.exp(u)]), n_bins)[0],
                          bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    if res.success and res.fun < ece_grid:
        return float(math.exp(res.x)), float(res.fun)
    return t_grid, ece_grid


def fit_sts_run(con_or_store, run_id: str, *, labels: str = "observed", companion: str | None = None,
                current_temperatures=None, n_bins: int = 15, refine: bool = True, dataset: str | None = None,
                sample_rows: int | None = None) -> StsFit:
    """Fit STS on one run's records (labels as in :func:`~dspark_obs.estimators.calibration.events.load_events`).

    ``current_temperatures`` are the STS temperatures the server ran with (None:
    none); they turn the recorded confidences back into raw logits.  Use labels
    that know the full block — a cap-accept run's own (``observed``), a
    ``companion`` or ``reconstructed`` — a compact run's ``observed`` labels drop
    the censored tails and bias the fit.  ``sample_rows``: fit on whole requests
    holding about that many steps, in blocks chosen by a hash of their rid
    (:func:`~dspark_obs.estimators.chunks.sample_requests`, the same requests on
    every re-run), when the run holds more — six temperatures need far fewer
    steps than a run of millions has, and the grid search costs each step once
    per temperature.
    """
    # at call time: the fit itself needs neither, and SGLang's fidelity venv (no DuckDB) imports this module
    from dspark_obs import sql as sqlmod
    from dspark_obs.estimators.calibration.chunks import run_steps
    from dspark_obs.estimators.calibration.events import load_events
    from dspark_obs.estimators.chunks import sample_requests

    con, _ = sqlmod.connection_and_store(con_or_store)
    sample = None
    if sample_rows is not None:
        sample = sample_requests(*run_steps(con, run_id), max_rows=sample_rows)
        sample = None if sample.where == "TRUE" else sample
    ev = load_events(con, run_id, labels=labels, companion=companion, chunk=sample)
    if sample is not None and not len(ev.rid):
        raise ValueError(f"run {run_id!r}: no {labels} labels among the {sample.requests} requests sampled for the "
                         "STS fit")
    current = None if current_temperatures is None else _check_temperatures(
        current_temperatures, ev.gamma, "current temperatures")
    z = raw_logits(ev.confidence, temperatures=current)
    fit = fit_sts(z, ev.y, n_bins=n_bins, refine=refine)
    reported = []
    for k in range(ev.gamma):
        m = ~np.isnan(ev.y[:, k]) & ~np.isnan(ev.survival[:, k])
        reported.append(ece_of(binned(ev.y[m, k], np.clip(ev.survival[m, k], 0, 1), n_bins, "uniform"))
                        if m.any() else math.nan)
    dataset = dataset or f"dspark-obs:{run_id}:labels={labels}:source={ev.label_source}"
    if sample is not None:
        dataset += f":sample={sample.requests} requests"
    return replace(fit, ece_reported=reported, labels=labels, dataset=dataset)
