"""Semantic validation of decoded records, and recovery of a body one record spoiled.

Why: the decoder checks SGLang's *contract* (field names and types).  A record
can fit the contract and still be impossible — confidence 7.0, survival 2.0,
``verify_len`` 99 with gamma 6, ``acc_len`` 500, ``correct_drafts`` -3, draft
lists of the wrong length, negative token ids, mode ``static`` in a compact run
— and such records used to be stored as valid.  Worse, one record could
poison the cursor (a ``forward_ct`` of 2^62 made every later record look old;
one out-of-order record faked a restart), and one ``NaN`` — not JSON, so the
whole body failed to parse — made every poll lose everything while the record
stayed in the deque.  This module:

* :func:`recover_body` — when a body does not parse, parse it leniently
  (Python's ``json`` reads ``NaN``/``Infinity``), dead-letter each record that
  holds a non-finite number, and hand back the rest re-encoded;
* :func:`order_records` — within one body a rank's records must have strictly
  increasing ``forward_ct`` in (0, 2^53); duplicates, records out of order and
  absurd counters are dead-lettered before the cursor sees them;
* :func:`check_tables` — range and length checks of every step and
  request-step against the run's gamma and mode (vectorised, on the Arrow
  tables the store would receive); a step with any bad request-step is
  rejected whole, with every reason;
* :class:`SeenOnce` — a bad record still in the deque is dead-lettered once,
  not at every poll.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Optional

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["recover_body", "order_records", "check_tables", "SeenOnce", "MAX_FORWARD_CT"]

MAX_FORWARD_CT = 2**53
"""Largest plausible forward_ct (a step counter; beyond it the value is noise, not a count)."""


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def recover_body(body: bytes) -> tuple[Optional[bytes], list[tuple[str, bytes]]]:
    """``(re-encoded body without the spoiling records, dead letters)``; ``(None, [])`` if unrecoverable."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, []
    if not isinstance(value, dict) or not isinstance(value.get("internal_states"), list):
        return None, []
    dead = []
    for i, state in enumerate(value["internal_states"]):
        payload = state.get("dspark_info_record") if isinstance(state, dict) else None
        if not isinstance(payload, dict) or not isinstance(payload.get("records"), list):
            continue
        kept = []
        for rec in payload["records"]:
            if _finite(rec):
                kept.append(rec)
            else:
                fct = rec.get("forward_ct") if isinstance(rec, dict) else None
                dead.append((f"dp_rank {i}: forward_ct {fct}: record holds NaN or Infinity, which is not JSON "
                             "(the rest of the body was kept)", json.dumps(rec, allow_nan=True).encode()))
        payload["records"] = kept
    if not _finite(value):  # a non-finite number outside the records: nothing to recover record by record
        return None, []
    try:
        return msgspec.json.encode(value), dead
    except (TypeError, OverflowError, msgspec.EncodeError):
        return None, []


def order_records(rank) -> list[tuple[str, bytes]]:
    """Keep a rank's records with strictly increasing forward_ct in (0, 2^53); the rest as dead letters."""
    records, raws = rank.records, rank.raws
    aligned = len(raws) == len(records)
    kept, kept_raws, dead = [], [], []
    last = 0
    for i, rec in enumerate(records):
        fct = rec.forward_ct
        reason = None
        if not 0 < fct < MAX_FORWARD_CT:
            reason = f"forward_ct {fct} is outside (0, 2^53)"
        elif fct <= last:
            reason = (f"forward_ct {fct} repeats one earlier in the same body" if fct == last else
                      f"forward_ct {fct} comes after {last} in the same body (out of order)")
        if reason is not None:
            raw = raws[i] if aligned else msgspec.json.encode(rec)
            dead.append((f"dp_rank {rank.dp_rank}: {reason}; the deque holds records oldest first", bytes(raw)))
            continue
        last = fct
        kept.append(rec)
        if aligned:
            kept_raws.append(raws[i])
    if dead:
        rank.records = kept
        rank.raws = kept_raws if aligned else rank.raws[:0]
    return dead


def _lengths(col: pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False)


def _bad_values(col: pa.ChunkedArray, lo: float, hi: float) -> np.ndarray:
    """Per row: True when a non-null list holds a value outside [lo, hi] (or NaN)."""
    n = len(col)
    flat = pc.list_flatten(col)
    if len(flat) == 0:
        return np.zeros(n, dtype=bool)
    parents = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
    values = flat.to_numpy(zero_copy_only=False).astype(float)
    wrong = ~((values >= lo) & (values <= hi))  # NaN compares False: wrong
    out = np.zeros(n, dtype=bool)
    out[parents[wrong]] = True
    return out


def check_tables(steps: pa.Table, reqs: pa.Table, *, gamma: int, mode: str
                 ) -> tuple[pa.Table, pa.Table, dict[int, list[str]]]:
    """``(good steps, good step_reqs, {forward_ct: reasons})`` against the run's gamma and mode.

    ``gamma`` 0 or ``mode`` '' (unknown) skip the checks that need them.
    """
    bad: dict[int, list[str]] = {}

    def flag(fcts: np.ndarray, mask: np.ndarray, what: str) -> None:
        for f in fcts[mask]:
            bad.setdefault(int(f), []).append(what)

    if steps.num_rows and mode:
        sm = steps.column("mode").to_numpy(zero_copy_only=False)
        flag(steps.column("forward_ct").to_numpy(), (sm != "") & (sm != mode),
             f"step mode differs from the run's mode {mode!r}")
    if reqs.num_rows:
        col = lambda name: pc.fill_null(reqs.column(name), 0).to_numpy(zero_copy_only=False).astype(np.int64)  # noqa: E731
        fct = reqs.column("forward_ct").to_numpy()
        v, a, c, t = col("verify_len"), col("acc_len"), col("correct_drafts"), col("cap_trim")
        top = gamma + 1 if gamma else np.iinfo(np.int64).max
        flag(fct, (v < 1) | (v > top), f"verify_len outside [1, gamma+1 = {top}]")
        flag(fct, (c < 0) | (c > v - 1), "correct_drafts outside [0, verify_len - 1]")
        flag(fct, a != c + 1, "acc_len is not correct_drafts + 1")
        flag(fct, (t < 0) | ((c + t > gamma) if gamma else False), "cap_trim outside [0, gamma - correct_drafts]")
        if mode and mode != "cap-accept":
            flag(fct, t != 0, f"cap_trim is not 0 in a {mode} run")
        # bonus_token -1 is "no token" (the step that committed the end of sequence); below that is noise
        flag(fct, (col("prefix_len") < 0) | (col("bonus_token") < -1), "negative prefix_len, or bonus_token below -1")
        if gamma:
            flag(fct, _lengths(reqs.column("draft_tokens")) != gamma, f"draft_tokens is not {gamma} long")
            for name in ("confidence", "survival"):
                n = _lengths(reqs.column(name))
                flag(fct, (n != -1) & (n != gamma), f"{name} is not {gamma} long")
        flag(fct, _bad_values(reqs.column("draft_tokens"), 0, np.inf), "negative draft token id")
        for name in ("confidence", "survival"):
            flag(fct, _bad_values(reqs.column(name), -1e-6, 1.0 + 1e-6), f"{name} outside [0, 1]")
    if not bad:
        return steps, reqs, bad
    rejected = pa.array(sorted(bad), pa.int64())
    keep_steps = pc.invert(pc.is_in(steps.column("forward_ct"), value_set=rejected))
    keep_reqs = pc.invert(pc.is_in(reqs.column("forward_ct"), value_set=rejected))
    bad = {f: sorted(set(r)) for f, r in bad.items()}
    return steps.filter(keep_steps), reqs.filter(keep_reqs), bad


class SeenOnce:
    """Digests of dead-lettered payloads: a record still in the deque is dead-lettered once per run."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit, self._seen = limit, set()

    def first(self, reason: str, payload: Optional[bytes]) -> bool:
        """True the first time this (reason, payload) is seen."""
        if payload is None:
            return True
        key = hashlib.blake2b(reason.encode()[:200] + b"\0" + payload, digest_size=12).digest()
        if key in self._seen:
            return False
        if len(self._seen) >= self.limit:
            self._seen.clear()  # bounded memory; at worst a record is dead-lettered again
        self._seen.add(key)
        return True
