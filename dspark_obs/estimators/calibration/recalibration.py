"""Recalibration of the head's survival beyond temperature, judged on requests it was not fitted on.

SGLang 0.5.23 can apply one kind of recalibration: Sequential Temperature
Scaling (``c = sigmoid(raw / T_k)``, :mod:`~dspark_obs.estimators.calibration.sts`).  A
temperature only sharpens or flattens a logit; it cannot move it, so a head
that is biased (under-confident everywhere, as a drafter's probability of its
own token usually is) keeps most of its error.  Per position ``k`` this module
fits four maps of the survival ``S_k`` to the event "the first k drafts
survive" on one half of the requests, and scores each on the other half:

``none``      the head as recorded;
``sts``       SGLang's STS (its grid fit plus refinement), applied to the raw logits;
``platt``     logit-affine: ``sigmoid(a_k * logit(S_k) + b_k)`` (Platt 1999);
``isotonic``  the monotone step function of least squares (Zadrozny & Elkan 2002),
              interpolated linearly between its knots;
``beta``      ``sigmoid(a_k * ln S_k - b_k * ln(1 - S_k) + c_k)`` (Kull et al. 2017),
              which contains the identity and Platt's map in logit space.

The split is by request (steps of one request share its prompt): a request is
in the fitting half when a seeded hash of its rid is even, so the same seed
gives the same halves on every run and machine.  Soft labels (the
``reconstructed`` ones) enter the fits as cross-entropy targets.

:func:`recalibrate_events` is the computation; :func:`recalibrate_run` reads a
run's events, writes the ``recalibration`` table and returns the maps;
:func:`survival_map_json` exports a bias-capable map (not loadable by SGLang
0.5.23) and :func:`apply_survival_map` applies one, e.g. for ``replay``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy.optimize import isotonic_regression, minimize

from dspark_obs import schema
from dspark_obs import sql as sqlmod
from dspark_obs.estimators.calibration.events import RunEvents, load_events
from dspark_obs.estimators.calibration.metrics import (
    bootstrap_calibration_error,
    brier_score_loss,
    expected_calibration_error,
)
from dspark_obs.estimators.calibration.sts import fit_sts, raw_logits
from dspark_obs.estimators.chunks import rid_hash
from dspark_obs.schema import RECALIBRATION

__all__ = ["METHODS", "BIAS_CAPABLE", "RECALIBRATION", "FORMAT", "SurvivalMap", "request_split", "fit_map",
           "recalibrate_events", "recalibrate_run", "Recalibration", "survival_map_json", "load_survival_map",
           "apply_survival_map"]

METHODS = ("none", "sts", "platt", "isotonic", "beta")
BIAS_CAPABLE = ("platt", "isotonic", "beta")
FORMAT = "dspark-obs/survival-recalibration/1"
_EPS = 1e-6
_MIN_ROWS = 20

_f = schema.field


def request_split(rids, *, seed: int = 0) -> np.ndarray:
    """``True`` for requests in the fitting half: a seeded BLAKE2b hash of the rid is even.

    >>> request_split(["a", "b", "a"], seed=0).tolist() == request_split(["a", "b", "a"], seed=0).tolist()
    True
    """
    rids = [None if r is None else str(r) for r in np.asarray(rids, dtype=object)]
    return (rid_hash([f"{seed}\x1f{r or ''}" for r in rids]) % np.uint64(2)) == 0


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _features(method: str, s: np.ndarray) -> np.ndarray:
    s = np.clip(s, _EPS, 1 - _EPS)
    if method == "platt":
        return np.column_stack([_logit(s), np.ones_like(s)])
    return np.column_stack([np.log(s), -np.log1p(-s), np.ones_like(s)])     # beta


def _logistic(x: np.ndarray, y: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Cross-entropy fit of ``sigmoid(x @ w)`` to (soft) labels ``y``, lightly ridge-penalised."""
    def loss(w):
        z = x @ w
        f = np.sum(np.logaddexp(0.0, z) - y * z) + 1e-6 * w @ w
        g = x.T @ (_sigmoid(z) - y) + 2e-6 * w
        return f, g
    return minimize(loss, start, jac=True, method="L-BFGS-B").x


@dataclass(frozen=True)
class SurvivalMap:
    """One position's map of the survival; ``params`` are JSON-ready."""

    method: str
    params: dict = field(default_factory=dict)

    def apply(self, s: np.ndarray) -> np.ndarray:
        s = np.asarray(s, dtype=np.float64)
        if self.method in ("none", "sts"):
            return s
        if self.method == "isotonic":
            return np.interp(s, self.params["x"], self.params["y"])
        return _sigmoid(_features(self.method, s) @ np.asarray(self.params["w"]))


def fit_map(method: str, s: np.ndarray, y: np.ndarray) -> SurvivalMap:
    """Fit one position's ``platt`` / ``isotonic`` / ``beta`` map (``none`` is the identity).

    >>> m = fit_map("platt", np.array([0.2, 0.4, 0.6, 0.8] * 50), np.array([0, 0, 1, 1] * 50))
    >>> bool(m.apply(np.array([0.8]))[0] > 0.9)
    True
    """
    s = np.asarray(s, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if method == "none" or s.size < _MIN_ROWS:
        return SurvivalMap("none")
    if method == "isotonic":
        order = np.argsort(s, kind="stable")
        xs, inverse = np.unique(s[order], return_inverse=True)
        sums = np.bincount(inverse, weights=y[order])
        counts = np.bincount(inverse)
        fitted = isotonic_regression(sums / counts, weights=counts).x
        return SurvivalMap("isotonic", {"x": xs.tolist(), "y": np.clip(fitted, 0, 1).tolist()})
    if method in ("platt", "beta"):
        start = np.array([1.0, 0.0]) if method == "platt" else np.array([1.0, 1.0, 0.0])
        return SurvivalMap(method, {"w": _logistic(_features(method, s), y, start).tolist()})
    raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")


def _sts_survival(z: np.ndarray, temperatures) -> np.ndarray:
    return np.cumprod(_sigmoid(z / np.asarray(temperatures)[None, :]), axis=1)


@dataclass
class Recalibration:
    """Held-out figures (rows of ``recalibration``) and the maps fitted on the fitting half."""

    run_id: str
    labels: str
    rows: list[dict]
    maps: dict[str, list[SurvivalMap]]
    sts_temperatures: list[float] | None
    gamma: int

    def mean_ece(self, method: str) -> float:
        vals = [r["ece"] for r in self.rows if r["method"] == method and r["workload"] == "*"
                and r["ece"] is not None and math.isfinite(r["ece"])]
        return float(np.mean(vals)) if vals else math.nan

    def best_bias_capable(self) -> str:
        """The bias-capable method with the lowest mean held-out ECE over positions."""
        return min(BIAS_CAPABLE, key=lambda m: (np.nan_to_num(self.mean_ece(m), nan=np.inf), m))


def recalibrate_events(ev: RunEvents, *, seed: int = 0, n_bootstrap: int = 200,
                       current_temperatures=None) -> Recalibration:
    """Fit every method on one half of ``ev``'s requests and score it on the other (module docstring)."""
    gamma = ev.gamma
    fit_half = request_split(ev.rid, seed=seed)
    surv = np.clip(np.nan_to_num(ev.survival, nan=0.5), 0.0, 1.0)
    z = raw_logits(ev.confidence, temperatures=current_temperatures)
    y = ev.y
    labelled = ~np.isnan(y)
    sts_t = None
    predictions = {"none": surv}
    if (fit_half[:, None] & labelled).sum() >= _MIN_ROWS and np.isfinite(z).all():
        sts_t = fit_sts(z[fit_half], y[fit_half]).temperatures
        predictions["sts"] = _sts_survival(z, sts_t)
    maps: dict[str, list[SurvivalMap]] = {"none": [SurvivalMap("none")] * gamma,
                                          "sts": [SurvivalMap("sts", {"temperature": t}) for t in (sts_t or [])]}
    for method in BIAS_CAPABLE:
        maps[method], pred = [], np.empty_like(surv)
        for k in range(gamma):
            m = fit_half & labelled[:, k]
            maps[method].append(fit_map(method, surv[m, k], y[m, k]))
            pred[:, k] = maps[method][k].apply(surv[:, k])
        predictions[method] = pred
    rows = []
    groups = [("*", np.ones(len(ev.rid), dtype=bool))] + [
        (str(w), ev.workload == w) for w in sorted({str(w) for w in ev.workload})]
    for method, pred in predictions.items():
        for k in range(gamma):
            n_fit = int((fit_half & labelled[:, k]).sum())
            for name, sel in groups:
                m = ~fit_half & labelled[:, k] & sel
                rows.append(_row(ev, name, k, method, y[m, k], pred[m, k], ev.rid[m], n_fit, n_bootstrap, seed))
    return Recalibration(ev.run_id, ev.labels, rows, maps, sts_t, gamma)


def _row(ev, workload, k, method, y, p, rid, n_fit, n_bootstrap, seed) -> dict:
    p = np.clip(p, 0.0, 1.0)
    ece = expected_calibration_error(y, p) if y.size else math.nan
    lo = hi = math.nan
    if y.size and n_bootstrap:
        lo, hi = bootstrap_calibration_error(y, p, rid, n_resamples=n_bootstrap, seed=seed)
    clean = lambda v: None if not math.isfinite(v) else float(v)  # noqa: E731
    return {"workload": workload, "position": k + 1, "method": method, "split": "held_out",
            "labels": ev.labels, "n": int(y.size), "n_fit": n_fit, "ece": clean(ece), "ece_ci_lo": clean(lo),
            "ece_ci_hi": clean(hi), "brier": clean(brier_score_loss(y, p)) if y.size else None, "seed": seed}


def recalibrate_run(con_or_store, run_id: str, *, labels: str = "observed", companion: str | None = None,
                    seed: int = 0, n_bootstrap: int = 200, current_temperatures=None,
                    write: bool = True) -> Recalibration:
    """Read ``run_id``'s events (``labels`` as in :func:`load_events`), recalibrate, replace its rows."""
    con, store = sqlmod.connection_and_store(con_or_store)
    ev = load_events(con, run_id, labels=labels, companion=companion)
    result = recalibrate_events(ev, seed=seed, n_bootstrap=n_bootstrap, current_temperatures=current_temperatures)
    if write:
        rows = pa.Table.from_pylist(result.rows, schema=RECALIBRATION)
        old = store.read("recalibration", run_id)
        if old.num_rows:
            old = old.drop_columns(["run_id"])
            old = old.filter(pc.not_equal(old.column("labels"), labels))
            rows = pa.concat_tables([old.cast(RECALIBRATION), rows]) if old.num_rows else rows
        store.drop_run("recalibration", run_id)
        store.write("recalibration", run_id, rows)
    return result


def survival_map_json(result: Recalibration, method: str | None = None) -> str:
    """A bias-capable map as JSON (default: the best held out). SGLang 0.5.23 cannot load it."""
    method = method or result.best_bias_capable()
    if method not in BIAS_CAPABLE:
        raise ValueError(f"method {method!r} is not bias-capable; choose one of {', '.join(BIAS_CAPABLE)} "
                         "(STS exports as SGLang's own file with --fit-sts)")
    return json.dumps({
        "format": FORMAT, "method": method, "gamma": result.gamma, "run_id": result.run_id,
        "labels": result.labels, "maps_survival": True,
        "note": "a map of the survival S_k per position; NOT loadable by SGLang 0.5.23, which applies only "
                "STS temperatures (--speculative-dspark-confidence-sts-path); use it with dspark-obs replay "
                "--recalibration",
        "held_out_mean_ece": result.mean_ece(method), "held_out_mean_ece_none": result.mean_ece("none"),
        "positions": [m.params for m in result.maps[method]],
    }, indent=1)


def load_survival_map(text: str) -> list[SurvivalMap]:
    """Read :func:`survival_map_json`'s output; ValueError with what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc}); pass the file `dspark-obs calibrate --recalibrate-out` wrote") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a survival recalibration (format {FORMAT!r} expected, got "
                         f"{doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r}); "
                         "for SGLang's STS file use --sts")
    method = doc.get("method")
    if method not in BIAS_CAPABLE:
        raise ValueError(f"method {method!r} is not one of {', '.join(BIAS_CAPABLE)}")
    return [SurvivalMap(method if params else "none", params) for params in doc["positions"]]


def apply_survival_map(survival: np.ndarray, maps: list[SurvivalMap]) -> np.ndarray:
    """Recalibrated survivals ``[n, gamma]``, kept non-increasing along positions (a survival is)."""
    s = np.asarray(survival, dtype=np.float64)
    if len(maps) < s.shape[1]:
        raise ValueError(f"the map has {len(maps)} positions, the run's gamma is {s.shape[1]}")
    out = np.column_stack([maps[k].apply(s[:, k]) for k in range(s.shape[1])])
    return np.minimum.accumulate(np.clip(out, 0.0, 1.0), axis=1)
