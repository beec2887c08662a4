"""Baseline against candidate: headline figures of two runs (or of matched sweep points) with bootstrap CIs.

Pure functions over per-request frames (the ``ui_compare_requests`` rows of one
run each): every figure is recomputed on ``n_bootstrap`` resamples of each
run's requests, independently, and the delta's 95% interval is the percentile
interval of the resampled differences.  Both runs must be on one clock.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

__all__ = ["HEADLINE", "compare_runs", "compare_sweeps"]

_Stat = Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]  # columns, [B, n] resample indices -> [B]


def _ratio(num: str, den: str, scale: str | None = None) -> _Stat:
    def stat(cols, idx):
        out = cols[num][idx].sum(axis=1) / cols[den][idx].sum(axis=1)
        return out * cols[scale][0] if scale else out
    return stat


def _mean(col: str) -> _Stat:
    return lambda cols, idx: cols[col][idx].mean(axis=1)


def _quantile(col: str, q: float) -> _Stat:
    return lambda cols, idx: np.quantile(cols[col][idx], q, axis=1)


# name, label, better, the columns a request needs finite, the statistic
HEADLINE: tuple[tuple[str, str, str, tuple[str, ...], _Stat], ...] = (
    ("throughput_tok_s", "total throughput (tok/s)", "higher", ("completion_tokens", "e2e_latency_s", "concurrency"),
     _ratio("completion_tokens", "e2e_latency_s", "concurrency")),
    ("per_user_tok_s", "per-user speed (tok/s)", "higher", ("per_user_tok_s",), _mean("per_user_tok_s")),
    ("accept_length", "accept length (tokens/step)", "higher", ("completion_tokens", "spec_verify_ct"),
     _ratio("completion_tokens", "spec_verify_ct")),
    ("e2e_p50_s", "end-to-end p50 (s)", "lower", ("e2e_latency_s",), _quantile("e2e_latency_s", 0.5)),
    ("e2e_p99_s", "end-to-end p99 (s)", "lower", ("e2e_latency_s",), _quantile("e2e_latency_s", 0.99)),
    ("ttft_p50_s", "TTFT p50 (s)", "lower", ("ttft_s",), _quantile("ttft_s", 0.5)),
)
_COLUMNS = ["metric", "label", "better", "baseline", "candidate", "delta", "delta_ci_low", "delta_ci_high",
            "relative", "n_baseline", "n_candidate"]


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["per_user_tok_s"] = df["completion_tokens"] / df["e2e_latency_s"].where(df["e2e_latency_s"] > 0)
    return df


def _resampled(df: pd.DataFrame, need: tuple[str, ...], stat: _Stat, rng: np.random.Generator, n_bootstrap: int
               ) -> tuple[float, np.ndarray, int]:
    """(the figure on every request, its resampled values, requests used) — NaN when no request has the columns."""
    sub = df[list(need)].apply(pd.to_numeric, errors="coerce").dropna()
    sub = sub[(sub["spec_verify_ct"] > 0)] if "spec_verify_ct" in need else sub
    n = len(sub)
    if n == 0:
        return float("nan"), np.full(n_bootstrap, np.nan), 0
    cols = {c: sub[c].to_numpy(dtype=np.float64) for c in need}
    point = float(stat(cols, np.arange(n)[None, :])[0])
    return point, stat(cols, rng.integers(0, n, size=(n_bootstrap, n))), n


def compare_runs(baseline: pd.DataFrame, candidate: pd.DataFrame, *, n_bootstrap: int = 400, seed: int = 0,
                 metrics: tuple[str, ...] | None = None) -> pd.DataFrame:
    """One row per headline figure: both values, the delta (candidate - baseline) and its 95% interval.

    Frames: one run's requests with completion_tokens, e2e_latency_s,
    spec_verify_ct, ttft_s, concurrency.  ``relative`` is delta / baseline.
    """
    if n_bootstrap < 10:
        raise ValueError(f"n_bootstrap must be >= 10 for a 95% interval, got {n_bootstrap}")
    rng = np.random.default_rng(seed)
    base, cand = _prepare(baseline), _prepare(candidate)
    rows = []
    for name, label, better, need, stat in HEADLINE:
        if metrics is not None and name not in metrics:
            continue
        b, b_boot, nb = _resampled(base, need, stat, rng, n_bootstrap)
        c, c_boot, nc = _resampled(cand, need, stat, rng, n_bootstrap)
        diff = c_boot - b_boot
        lo, hi = (np.nanpercentile(diff, [2.5, 97.5]) if np.isfinite(diff).any() else (np.nan, np.nan))
        rows.append([name, label, better, b, c, c - b, float(lo), float(hi),
                     (c - b) / b if b else np.nan, nb, nc])
    return pd.DataFrame(rows, columns=_COLUMNS)


def compare_sweeps(points: pd.DataFrame, requests: pd.DataFrame, baseline: str, candidate: str, *,
                   n_bootstrap: int = 200, seed: int = 0) -> pd.DataFrame:
    """Throughput and per-user speed of each point both sweeps have (method, workload, concurrency), with CIs.

    ``points``: ``sweep_points`` rows of both sweeps; ``requests``: the
    ``ui_compare_requests`` rows of their runs.
    """
    keys = ["method", "workload", "concurrency"]
    b = points[points["sweep_id"] == baseline].set_index(keys)["run_id"]
    c = points[points["sweep_id"] == candidate].set_index(keys)["run_id"]
    by_run = dict(tuple(requests.groupby("run_id")))
    out = []
    for key in b.index.intersection(c.index):
        rows = compare_runs(by_run.get(b[key], requests.iloc[:0]), by_run.get(c[key], requests.iloc[:0]),
                            n_bootstrap=n_bootstrap, seed=seed, metrics=("throughput_tok_s", "per_user_tok_s"))
        out.append(rows.assign(**dict(zip(keys, key)), baseline_run=b[key], candidate_run=c[key]))
    if not out:
        return pd.DataFrame(columns=[*keys, "baseline_run", "candidate_run", *_COLUMNS])
    df = pd.concat(out, ignore_index=True)
    return df[[*keys, "baseline_run", "candidate_run", *_COLUMNS]].sort_values([*keys, "metric"]).reset_index(drop=True)
