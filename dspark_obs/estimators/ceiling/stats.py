"""Summaries of per-step ceilings: bootstrap means per workload, and validation against truth.

Both take plain arrays (one entry per request-step) and return lists of row
dicts for the ``ceiling_summary`` and ``ceiling_validation`` tables.

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
           "request_totals", "concat_totals", "RequestTotals", "validate",
           "validate_parts", "label_group_sums", "add_label_group_sums", "validation_rows", "bin_sums", "stat_sums",
           "add_stat_sums", "equal_count_bins", "N_BINS"]

N_BINS = 8
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


def _label_codes(labels) -> tuple[np.ndarray, np.ndarray]:
    """``(names, codes)``: the labels as text, sorted, and each label's index among them (``np.unique`` of the
    text, by hashing the labels once instead of sorting a fixed-width text copy of every label)."""
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
                   key: np.ndarray) -> RequestTotals:
    """Sum each request's steps (in row order, as one pass over the run would); ``key`` per step."""
    request = np.asarray(request, dtype=np.int64)
    names, wl = _label_codes(workload)
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


def equal_count_bins(values: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Bin index (0..n_bins-1) of each value: sorted by value (stable), split into
    ``n_bins`` groups whose sizes differ by at most one.

    SGLang's analyzer cuts chunks of ``len // 8`` and keeps a remainder chunk (so
    up to 9 bins); equal splitting keeps exactly 8 and no tiny last bin.

    The bins of a stable sort without sorting: the values at the bins' first ranks come from one
    partial sort (``np.partition``); a value between them has its bin, and only the steps that tie with
    one of them are ranked, by position (what a stable sort does with ties).
    """
    values = np.asarray(values)
    n_bins = max(1, min(n_bins, values.size))
    starts = np.cumsum([part.size for part in np.array_split(np.arange(values.size), n_bins)])[:-1]  # first ranks
    if values.size == 0 or starts.size == 0 or values.dtype.kind not in "iuf" or np.isnan(values).any():
        return _sorted_bins(values, n_bins)
    at_starts = np.partition(values, starts)[starts]      # the value at each bin's first rank, ascending
    out = np.searchsorted(at_starts, values, side="left")  # bins whose first value is below the value
    for tie in np.unique(at_starts):
        same = np.flatnonzero(values == tie)   # in position order: their ranks follow one another
        rank = int(np.count_nonzero(values < tie)) + np.arange(same.size)
        out[same] = np.searchsorted(starts, rank, side="right")
    return out.astype(np.int64)


def _sorted_bins(values: np.ndarray, n_bins: int) -> np.ndarray:
    """:func:`equal_count_bins` by a stable sort (empty input, NaN, values that are not numbers)."""
    order = np.argsort(values, kind="stable")
    out = np.empty(values.size, dtype=np.int64)
    for b, part in enumerate(np.array_split(order, max(1, min(n_bins, values.size)))):
        out[part] = b
    return out


def stat_sums(lo, mid, hi, truth, emu, mask, per_step) -> dict:
    """The sums behind :func:`_stats` over ``mask``: they add up across chunks of steps.

    ``per_step`` marks the steps whose realised truth is what the estimate
    targets step by step (greedy: the realisation is the expectation); MAE and
    coverage against the truth are over those only.  A sampled step's
    realisation is one draw of a random acceptance: it is judged through the
    means (bias, bins) and, in the emulator, against its expectation (``emu``).
    """
    mask = np.asarray(mask, dtype=bool)
    per_step = np.broadcast_to(np.asarray(per_step, dtype=bool), mask.shape)
    (total,) = _sums_by_codes(*(np.asarray(x)[mask] for x in (lo, mid, hi, truth, emu)), per_step[mask],
                              [(np.zeros(int(mask.sum()), np.int8), 1)])
    return _as_sums(total[0])


def add_stat_sums(a: dict | None, b: dict) -> dict:
    """Sums of two disjoint sets of steps."""
    return dict(b) if a is None else {k: a[k] + b[k] for k in a}


def _from_sums(s: dict) -> dict:
    """:func:`_stats` from :func:`stat_sums` (the same numbers for one set of steps)."""
    n, ne = s["n"], s["emu_n"]
    row: dict = {"n": n, "emu_n": ne}
    for col in ("lo", "mid", "hi"):
        row[f"mean_{col}"] = float(s[col] / n) if n else (float(s[f"emu_{col}"] / ne) if ne else None)
    nc = s["coverage_n"]
    row["coverage_n"] = nc
    if n:
        row.update(mean_truth=float(s["truth"] / n), bias=float(s["bias"] / n))
    if nc:
        row.update(mae=float(s["mae"] / nc), coverage=float(np.float64(s["coverage"]) / nc))
    if ne:
        row.update(mean_emu_expected=float(s["emu"] / ne), emu_bias=float(s["emu_bias"] / ne),
                   emu_mae=float(s["emu_mae"] / ne), emu_coverage=float(np.float64(s["emu_coverage"]) / ne))
    return row


def validate(
    lo: np.ndarray,
    mid: np.ndarray,
    hi: np.ndarray,
    truth: np.ndarray,
    *,
    censored: np.ndarray,
    category: np.ndarray,
    workload: np.ndarray,
    greedy: np.ndarray,
    emu_expected: np.ndarray | None = None,
    n_bins: int = N_BINS,
) -> list[dict]:
    """Bias of ``mid`` against ``truth`` and, on greedy steps, MAE and coverage of ``[lo, hi]``, per group.

    ``truth`` is the realised full-block acceptance (NaN where unknown); it is
    the per-step target only of greedy steps (see :func:`stat_sums`);
    ``emu_expected`` the emulator's expectation given the drafts (NaN / None on
    real servers), the per-step target of the estimate under sampling.  Groups
    (``group_kind``): ``all_steps`` (every step), and over censored steps:
    ``overall``, ``sampling`` (greedy / temperature), ``category``,
    ``workload``, and ``bin`` — ``n_bins`` equal-count bins of ``mid``
    (SGLang's analyzer: per bin mean mid, lo, hi, truth and n).
    """
    lo, mid, hi = (np.asarray(x, dtype=np.float64) for x in (lo, mid, hi))
    truth = np.asarray(truth, dtype=np.float64)
    emu = np.full(lo.shape, np.nan) if emu_expected is None else np.asarray(emu_expected, dtype=np.float64)
    censored = np.asarray(censored, dtype=bool)
    emu = np.where(censored, emu, np.nan)  # the expectation is the target only where the ceiling was hidden
    known = ~np.isnan(truth) | ~np.isnan(emu)
    base = censored & known
    greedy = np.asarray(greedy, dtype=bool)
    return validate_parts(stat_sums(lo, mid, hi, truth, emu, known, greedy), lo[base], mid[base], hi[base], truth[base],
                          emu[base], category=np.asarray(category, dtype=object)[base],
                          workload=np.asarray(workload, dtype=object)[base],
                          greedy=greedy[base], n_bins=n_bins)


def validate_parts(all_steps: dict, lo, mid, hi, truth, emu, *, category, workload, greedy,
                   n_bins: int = N_BINS, category_names=None, workload_names=None) -> list[dict]:
    """:func:`validate` from the sums over every step with a truth (:func:`stat_sums`, added
    over chunks) and the censored steps with a truth or an expectation, in run order.

    ``category`` and ``workload`` hold labels, or codes into ``category_names`` / ``workload_names`` when
    those are given (no string per step).
    """
    groups = label_group_sums(lo, mid, hi, truth, emu, category=category, workload=workload, greedy=greedy,
                              category_names=category_names, workload_names=workload_names)
    codes = equal_count_bins(np.asarray(mid, dtype=np.float64), n_bins)
    bins = bin_sums(lo, mid, hi, truth, emu, greedy, codes, int(codes.max()) + 1 if codes.size else 0)
    return validation_rows(all_steps, groups, bins)


def label_group_sums(lo, mid, hi, truth, emu, *, category, workload, greedy, category_names=None,
                     workload_names=None) -> dict:
    """``{(group_kind, group): stat sums}`` of censored steps with a truth or an expectation, for the groups
    of :func:`validate` that are labels (``overall``, ``sampling``, ``category``, ``workload``; not the bins,
    which rank every step of the run): they add over chunks of steps (:func:`add_label_group_sums`), so each
    chunk's are summed where it was estimated.  Arguments as :func:`validate_parts`'s."""
    greedy = np.asarray(greedy, dtype=bool)
    sampling = (np.array(["greedy", "temperature"]), (~greedy).astype(np.int8))   # the names sorted, as text
    kinds = {"sampling": sampling, "category": _coded(category, category_names),
             "workload": _coded(workload, workload_names)}
    groupings = [(np.zeros(greedy.size, np.int8), 1)] + [(codes, names.size) for names, codes in kinds.values()]
    overall, *totals = _sums_by_codes(lo, mid, hi, truth, emu, greedy, groupings)
    out = {("overall", ALL): _as_sums(overall[0])}
    for (kind, (names, codes)), total in zip(kinds.items(), totals):
        for code in np.flatnonzero(np.bincount(codes, minlength=names.size)).tolist():   # the codes present
            out[(kind, str(names[code]))] = _as_sums(total[code])
    return out


def add_label_group_sums(a: dict, b: dict) -> dict:
    """:func:`label_group_sums` of two disjoint sets of steps."""
    return {key: add_stat_sums(a.get(key), b[key]) for key in b} | {key: a[key] for key in a if key not in b}


def validation_rows(all_steps: dict, groups: dict, bins: np.ndarray) -> list[dict]:
    """The rows of :func:`validate`: ``all_steps`` and ``groups`` (:func:`label_group_sums`) as they are, then
    the equal-count bins of ``mid`` from their sums (:func:`bin_sums`, added over the sets of steps that hold
    them)."""
    if not (all_steps["n"] or all_steps["emu_n"]):
        return []
    rows = [{"group_kind": "all_steps", "group": ALL, **_from_sums(all_steps)},
            {"group_kind": "overall", "group": ALL, **_from_sums(groups[("overall", ALL)])}]
    for kind in ("sampling", "category", "workload"):
        for name in sorted(group for k, group in groups if k == kind):
            rows.append({"group_kind": kind, "group": name, **_from_sums(groups[(kind, name)])})
    for b, row in enumerate(bins):   # equal-count bins: none is empty
        rows.append({"group_kind": "bin", "group": str(b), "bin": b, **_from_sums(_as_sums(row))})
    return rows


def bin_sums(lo, mid, hi, truth, emu, greedy, codes, n_codes: int) -> np.ndarray:
    """``[n_codes, ...]``: the :func:`stat_sums` of each bin's steps, ``codes`` the steps' bins
    (:func:`equal_count_bins` of the whole run's ``mid``), as :func:`validation_rows` takes them; sums of
    disjoint sets of steps add."""
    (total,) = _sums_by_codes(lo, mid, hi, truth, emu, np.asarray(greedy, dtype=bool),
                              [(np.asarray(codes), n_codes)])
    return total


def _coded(labels, names) -> tuple[np.ndarray, np.ndarray]:
    """``(names, codes)`` as :func:`_label_codes` gives them, of labels, or of codes into ``names``."""
    if names is None:
        return _label_codes(labels)
    text, of_name = np.unique(np.asarray(names, dtype=str), return_inverse=True)
    return text, of_name.reshape(-1)[np.asarray(labels, dtype=np.int64)]


_SUMS = ("n", "coverage_n", "coverage", "lo", "mid", "hi", "truth", "bias", "mae",
         "emu_n", "emu_coverage", "emu_lo", "emu_mid", "emu_hi", "emu", "emu_bias", "emu_mae")
_COUNTS = frozenset({"n", "coverage_n", "coverage", "emu_n", "emu_coverage"})
_BLOCK = 1 << 16   # steps summed at a time: their [block, 17] terms (8.9 MB) stay below glibc's mmap threshold


def _as_sums(row: np.ndarray) -> dict:
    """A row of :func:`_sums_by_codes` as :func:`stat_sums`'s dict (counts as ints)."""
    return {name: int(round(v)) if name in _COUNTS else v for name, v in zip(_SUMS, row)}


def _sums_by_codes(lo, mid, hi, truth, emu, greedy, groupings: list) -> list[np.ndarray]:
    """For each grouping ``(codes, n_codes)``, ``[n_codes, len(_SUMS)]``: the :func:`stat_sums` of each code's
    steps; every grouping in one pass over the steps, a block at a time, each block's terms (:func:`_terms`)
    summed per code by one product with the codes' indicator matrix (a few passes instead of a gather and a
    dozen sums per code).  A block with a value that is not finite is summed code by code, so that it spoils
    only its own code's sums, as a sum over that code's steps would."""
    lo, mid, hi = (np.asarray(x, dtype=np.float64) for x in (lo, mid, hi))
    truth, emu = (np.asarray(x, dtype=None if np.asarray(x).dtype.kind == "f" else np.float64) for x in (truth, emu))
    totals = [np.zeros((n_codes, len(_SUMS))) for _, n_codes in groupings]
    for a in range(0, len(lo), _BLOCK):
        cut = slice(a, a + _BLOCK)
        terms = _terms(lo[cut], mid[cut], hi[cut], truth[cut], emu[cut], greedy[cut])
        finite = bool(np.isfinite(terms).all())
        for total, (codes, n_codes) in zip(totals, groupings):
            codes = np.asarray(codes[cut])
            if finite:
                total += (np.arange(n_codes)[:, None] == codes[None, :]).astype(np.float64) @ terms
            else:
                for code in range(n_codes):
                    total[code] += terms[codes == code].sum(axis=0)
    return totals


def _terms(lo, mid, hi, truth, emu, greedy) -> np.ndarray:
    """``[n, len(_SUMS)]``: what each step adds to each sum of :func:`stat_sums` (0 to the sums over steps with
    a truth where it has none, likewise the expectation's).  ``greedy`` marks the steps whose truth is the
    target step by step: MAE and coverage against the truth are over those."""
    out = np.zeros((len(lo), len(_SUMS)), order="F")
    has_t, has_e = ~np.isnan(truth), ~np.isnan(emu)
    for has, value, start, tolerance in ((has_t, truth, 0, 1e-9), (has_e, emu, 9, 1e-6)):
        if not has.any():
            continue   # a real server's steps have no expectation: its sums stay 0
        every = bool(has.all())

        def kept(v):
            return v if every else np.where(has, v, 0.0)

        x = kept(value.astype(np.float64))
        counted = has & greedy if start == 0 else has   # MAE and coverage against the truth: greedy steps
        err = kept(mid - x)
        covered = counted & (lo <= x + tolerance) & (x <= hi + tolerance)
        # truth: n, coverage_n, coverage, lo, mid, hi, truth, bias, mae; expectation: the same but coverage_n
        columns = ((has, counted, covered) if start == 0 else (has, covered)) + \
            (kept(lo), kept(mid), kept(hi), x, err, np.where(counted, np.abs(err), 0.0))
        for j, column in enumerate(columns, start):
            out[:, j] = column
    return out
