"""Summaries of per-step ceilings: bootstrap means per workload (the ``ceiling_summary`` rows).

They take plain arrays (one entry per request-step) and return row dicts; the
validation against truth (``ceiling_validation``) is :mod:`.validation`'s.

Units: ``lo``/``mid``/``hi``/``truth`` are drafts a full block accepts
(0..gamma).  The summary reports *accept lengths* (drafts + 1, the bonus
token), like SGLang's ``spec_accept_length`` / ``spec_block_accept_length``,
so utilisation = mean acc_len / mean ceiling accept length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dspark_obs.estimators import stats as bootstrap

__all__ = ["summarize", "summarize_totals", "summary_sums", "merge_summary_sums", "summary_rows", "GroupSums",
           "group_sums", "request_totals", "concat_totals", "RequestTotals", "label_codes", "ALL"]

ALL = "*"


def _groups(labels: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``(name, mask)`` for ``*`` (everything) and each label (as text), sorted.

    Labels are hashed once (no fixed-width text copy of millions of labels).
    """
    labels = np.asarray(labels)
    codes, uniques = pd.factorize(labels.astype(object) if labels.dtype != object else labels,
                                  use_na_sentinel=False)
    text = [str(u) for u in uniques]
    groups = [(ALL, np.ones(labels.size, dtype=bool))]
    for name in sorted(set(text)):
        groups.append((name, np.isin(codes, [i for i, t in enumerate(text) if t == name])))
    return groups


def label_codes(labels, names=None) -> tuple[np.ndarray, np.ndarray]:
    """``(names, codes)``: the labels as text, sorted, and each label's index among them (``np.unique`` of the
    text, by hashing the labels once instead of sorting a fixed-width text copy of every label).  With
    ``names``, ``labels`` are codes into them (a chunk's workloads: no label per step is made or hashed)."""
    if names is not None:
        text, of_name = np.unique(np.asarray(names, dtype=str), return_inverse=True)
        return text, of_name.reshape(-1)[np.asarray(labels, dtype=np.int64)]
    labels = np.asarray(labels, dtype=object)
    if not labels.size:
        return np.zeros(0, str), np.zeros(0, np.int64)
    codes, uniques = pd.factorize(labels, use_na_sentinel=False)
    text = np.asarray([str(u) for u in uniques])
    names, of_unique = np.unique(text, return_inverse=True)   # two labels of one text (1 and "1") are one name
    return names, of_unique.reshape(-1)[codes].astype(np.int64)


def _ratio_stats(num: np.ndarray, den: np.ndarray, ratio_pairs: list[tuple[int, int]]) -> np.ndarray:
    """Means ``num / den`` per column, then ratios of two numerator sums (last axis)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        means = num / np.asarray(den)[..., None]
        ratios = [num[..., i] / num[..., j] for i, j in ratio_pairs]
    return np.concatenate([means, np.stack(ratios, axis=-1)], axis=-1) if ratios else means


@dataclass
class GroupSums:
    """One group's sufficient statistics: plain sums and their bootstrap reweightings.

    ``boot_sums [B, m]`` and ``boot_den [B]`` are ``weights @ per-request sums`` with
    the per-request Poisson weights of :mod:`~dspark_obs.estimators.stats`, so the sums of disjoint
    sets of requests add up (:func:`merge_group_sums`) to the whole run's.
    """

    requests: int
    sums: np.ndarray       # [m]
    den: float
    boot_sums: np.ndarray  # [B, m]
    boot_den: np.ndarray   # [B]

    def __add__(self, other: "GroupSums") -> "GroupSums":
        return GroupSums(self.requests + other.requests, self.sums + other.sums, self.den + other.den,
                         self.boot_sums + other.boot_sums, self.boot_den + other.boot_den)


def group_sums(sums: np.ndarray, den: np.ndarray, keys: np.ndarray, *, n_bootstrap: int, seed: int) -> GroupSums:
    """:class:`GroupSums` of per-request ``sums [r, m]`` and ``den [r]`` (one row per request, key ``keys``)."""
    return _groups_sums(keys, [(sums, den, np.arange(keys.size))], n_bootstrap=n_bootstrap, seed=seed)[0]


def _groups_sums(keys: np.ndarray, groups: list, *, n_bootstrap: int, seed: int) -> list[GroupSums]:
    """:func:`group_sums` of each ``(sums, den, columns)`` of ``groups``, whose requests are ``keys[columns]``
    (ascending): each request's weights are drawn once for all the groups it is in (a weight depends on its
    key only), in tiles of requests (:func:`~dspark_obs.estimators.stats.weight_tiles`: bounded memory, and
    fast)."""
    boots = [(np.zeros((n_bootstrap, sums.shape[1])), np.zeros(n_bootstrap)) for sums, _, _ in groups]
    for start, lo, hi, drawn in bootstrap.weight_tiles(keys, n_bootstrap, seed):
        rows = slice(start, start + drawn.shape[0])
        for (sums, den, cols), (boot_sums, boot_den) in zip(groups, boots):
            a, b = np.searchsorted(cols, [lo, hi])
            if a == b:
                continue
            weights = drawn if b - a == hi - lo else drawn[:, cols[a:b] - lo]   # all of the tile: no copy
            boot_sums[rows] += weights @ sums[a:b]
            boot_den[rows] += weights @ den[a:b]
    return [GroupSums(int(den.size), sums.sum(axis=0), float(den.sum()), boot_sums, boot_den)
            for (sums, den, _), (boot_sums, boot_den) in zip(groups, boots)]


def _bootstrap_ratios(g: GroupSums, ratio_pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Point values and 95% percentile intervals of sum(num)/sum(den) per column, plus
    ratios of two numerator sums, over the request resamples in ``g``.

    Returns ``values [m + r]`` and ``ci [2, m + r]``.
    """
    values = _ratio_stats(g.sums, np.asarray(g.den), ratio_pairs)
    if g.boot_den.size == 0 or g.requests < 2:
        return values, np.stack([values, values])
    return values, np.nanpercentile(_ratio_stats(g.boot_sums, g.boot_den, ratio_pairs), [2.5, 97.5], axis=0)


@dataclass(frozen=True)
class RequestTotals:
    """Per-request sums of a run's steps: all the summary and its bootstrap need.

    One entry per (request, workload); requests are whole within a chunk of
    requests, so the totals of chunks concatenate (:func:`concat_totals`).
    """

    request: np.ndarray   # [u] int request code (the resampling unit), ascending
    workload: np.ndarray  # [u] object workload label
    sums: np.ndarray      # [u, 6] acc_len, mid + 1, lo + 1, hi + 1, window, censored
    steps: np.ndarray     # [u] float steps
    key: np.ndarray       # [u] uint64 key of the request (bootstrap.unit_keys of its rid)


def request_totals(request: np.ndarray, workload: np.ndarray, *, acc_len: np.ndarray, window: np.ndarray,
                   censored: np.ndarray, lo: np.ndarray, mid: np.ndarray, hi: np.ndarray,
                   key: np.ndarray, workload_names: np.ndarray | None = None) -> RequestTotals:
    """Sum each request's steps (in row order, as one pass over the run would); ``key`` per step.
    ``workload``: labels, or codes into ``workload_names``."""
    request = np.asarray(request, dtype=np.int64)
    names, wl = label_codes(workload, workload_names)
    keys, first, inv = np.unique(request * max(1, names.size) + wl.reshape(-1) if request.size else request,
                                 return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    u = keys.size
    num = np.stack([acc_len, mid + 1.0, lo + 1.0, hi + 1.0, window, censored], axis=1).astype(np.float64)
    sums = np.stack([np.bincount(inv, weights=col, minlength=u) for col in num.T], axis=1) if u else \
        np.zeros((0, 6))
    return RequestTotals(request=request[first], workload=names.astype(object)[wl[first]], sums=sums,
                         steps=np.bincount(inv, minlength=u).astype(np.float64),
                         key=np.asarray(key, dtype=np.uint64)[first])


def concat_totals(parts: list[RequestTotals]) -> RequestTotals:
    """Totals of disjoint sets of requests as one, ordered by request code (stable)."""
    if not parts:
        return RequestTotals(np.zeros(0, np.int64), np.zeros(0, object), np.zeros((0, 6)), np.zeros(0),
                             np.zeros(0, np.uint64))
    req = np.concatenate([p.request for p in parts])
    order = np.argsort(req, kind="stable")
    return RequestTotals(req[order], np.concatenate([p.workload for p in parts])[order],
                         np.concatenate([p.sums for p in parts])[order],
                         np.concatenate([p.steps for p in parts])[order],
                         np.concatenate([p.key for p in parts])[order])


def summarize(
    request: np.ndarray,
    workload: np.ndarray,
    *,
    acc_len: np.ndarray,
    window: np.ndarray,
    censored: np.ndarray,
    lo: np.ndarray,
    mid: np.ndarray,
    hi: np.ndarray,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> list[dict]:
    """One row per workload and one for all (``*``): means and request-level bootstrap CIs.

    ``request`` identifies the resampling unit (a rid) of each step; the
    bootstrap reweights requests ``n_bootstrap`` times with Poisson(1) weights
    drawn per request from ``(seed, rid)`` (:mod:`~dspark_obs.estimators.stats`), so any split of
    the requests gives the same resamples.
    """
    request = np.asarray(request)
    if request.size == 0:
        return []
    uniques, codes = np.unique(request, return_inverse=True)
    totals = request_totals(codes.reshape(-1), workload, acc_len=acc_len, window=window, censored=censored,
                            lo=lo, mid=mid, hi=hi, key=bootstrap.unit_keys(uniques.tolist())[codes.reshape(-1)])
    return summarize_totals(totals, n_bootstrap=n_bootstrap, seed=seed)


def summarize_totals(totals: RequestTotals, *, n_bootstrap: int = 1000, seed: int = 0) -> list[dict]:
    """:func:`summarize` from per-request totals (the same numbers, bit for bit)."""
    return summary_rows(summary_sums(totals, n_bootstrap=n_bootstrap, seed=seed), n_bootstrap=n_bootstrap)


def summary_sums(totals: RequestTotals, *, n_bootstrap: int, seed: int) -> dict[str, GroupSums]:
    """Per workload (and ``*``) the :class:`GroupSums` of ``totals``; they add over disjoint requests."""
    out: dict[str, GroupSums] = {}
    if totals.request.size == 0:
        return out
    names, groups = [], []
    for name, mask in _groups(totals.workload):
        if not mask.any():
            continue
        cols = np.flatnonzero(mask)
        req, sums, den = totals.request[cols], totals.sums[cols], totals.steps[cols]
        if req.size > 1 and (np.diff(req) == 0).any():  # a request under two workloads: one unit
            _, first, inv = np.unique(req, return_index=True, return_inverse=True)
            sums = np.stack([np.bincount(inv, weights=col) for col in sums.T], axis=1)
            den, cols = np.bincount(inv, weights=den), cols[first]
        names.append(name)
        groups.append((sums, den, cols))
    return dict(zip(names, _groups_sums(totals.key, groups, n_bootstrap=max(0, n_bootstrap), seed=seed)))


def merge_summary_sums(parts: list[dict[str, GroupSums]]) -> dict[str, GroupSums]:
    """:func:`summary_sums` of disjoint sets of requests as one (whole requests in each part)."""
    out: dict[str, GroupSums] = {}
    for part in parts:
        for name, g in part.items():
            out[name] = out[name] + g if name in out else g
    return out


def summary_rows(sums: dict[str, GroupSums], *, n_bootstrap: int) -> list[dict]:
    """The ``ceiling_summary`` rows of :func:`summary_sums` (``*`` first, then workloads sorted)."""
    rows = []
    for name in sorted(sums, key=lambda n: (n != ALL, n)):
        g = sums[name]
        # columns: 0 acc_len, 1 mid, 2 lo, 3 hi, 4 window, 5 censored; ratios acc/mid, acc/hi, acc/lo
        val, ci = _bootstrap_ratios(g, [(0, 1), (0, 3), (0, 2)])
        row = {
            "workload": name,
            "requests": int(g.requests),
            "steps": int(g.den),
            "censored_steps": int(g.sums[5]),
            "censored_share": float(val[5]),
            "mean_window": float(val[4]),
            "n_bootstrap": int(n_bootstrap),
        }
        for col, i in (("mean_acc_len", 0), ("ceiling_len_mid", 1), ("ceiling_len_lo", 2),
                       ("ceiling_len_hi", 3), ("utilisation", 6)):
            row[col], row[f"{col}_ci95_low"], row[f"{col}_ci95_high"] = (
                float(val[i]), float(ci[0, i]), float(ci[1, i]))
        row["utilisation_at_hi"], row["utilisation_at_lo"] = float(val[7]), float(val[8])
        rows.append(row)
    return rows
