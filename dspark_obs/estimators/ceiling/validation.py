"""Validation of per-step ceilings against truth: the ``ceiling_validation`` rows.

Bias of ``mid`` against the realised full-block acceptance, and on greedy steps
MAE and coverage of ``[lo, hi]``, per group of censored steps (sampling,
category, workload, equal-count bins of ``mid``); in the emulator, also against
its expectation given the drafts.  Everything is kept as sums that add over
chunks of steps, so each chunk is summed where it was estimated.
"""

from __future__ import annotations

import numpy as np

from dspark_obs.estimators.ceiling.stats import ALL, label_codes

__all__ = ["validate", "validate_parts", "label_group_sums", "add_label_group_sums", "validation_rows", "bin_sums",
           "ranked_bin_sums", "no_bin_sums", "stat_sums", "add_stat_sums", "equal_count_bins", "N_BINS"]

N_BINS = 8


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
    """The sums behind one validation row, over ``mask``: they add up across chunks of steps.

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
    """A validation row's statistics from :func:`stat_sums`."""
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
    return validation_rows(all_steps, groups, ranked_bin_sums(lo, mid, hi, truth, emu, greedy, n_bins))


def label_group_sums(lo, mid, hi, truth, emu, *, category, workload, greedy, category_names=None,
                     workload_names=None) -> dict:
    """``{(group_kind, group): stat sums}`` of censored steps with a truth or an expectation, for the groups
    of :func:`validate` that are labels (``overall``, ``sampling``, ``category``, ``workload``; not the bins,
    which rank every step of the run): they add over chunks of steps (:func:`add_label_group_sums`), so each
    chunk's are summed where it was estimated.  Arguments as :func:`validate_parts`'s."""
    greedy = np.asarray(greedy, dtype=bool)
    sampling = (np.array(["greedy", "temperature"]), (~greedy).astype(np.int8))   # the names sorted, as text
    kinds = {"sampling": sampling, "category": label_codes(category, category_names),
             "workload": label_codes(workload, workload_names)}
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


def ranked_bin_sums(lo, mid, hi, truth, emu, greedy, n_bins: int = N_BINS) -> np.ndarray:
    """:func:`bin_sums` of steps held in one place, in run order: their own equal-count bins of ``mid``."""
    codes = equal_count_bins(np.asarray(mid, dtype=np.float64), n_bins)
    return bin_sums(lo, mid, hi, truth, emu, greedy, codes, int(codes.max()) + 1 if codes.size else 0)


def no_bin_sums() -> np.ndarray:
    """:func:`bin_sums` of no step (no bin)."""
    return np.zeros((0, len(_SUMS)))


def bin_sums(lo, mid, hi, truth, emu, greedy, codes, n_codes: int) -> np.ndarray:
    """``[n_codes, ...]``: the :func:`stat_sums` of each bin's steps, ``codes`` the steps' bins
    (:func:`equal_count_bins` of the whole run's ``mid``), as :func:`validation_rows` takes them; sums of
    disjoint sets of steps add."""
    (total,) = _sums_by_codes(lo, mid, hi, truth, emu, np.asarray(greedy, dtype=bool),
                              [(np.asarray(codes), n_codes)])
    return total


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
