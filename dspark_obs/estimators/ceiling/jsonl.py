"""Draft and target logprobs from SGLang's block-accept estimator JSONL.

SGLang writes one row per request-step of pure-temperature requests to
``SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH`` (needs ``SGLANG_DSPARK_FOLDED_PROPOSAL=0``)::

    {rid, fct, w, cl, ct, trimmed_tokens?, q_lp?, pg?: [[block_fct, offset, p_lp, token, realized]]}
    {rid, eos_end: [fct, ...]}

``q_lp`` (censored steps only) is the drafter's logprob ``log q(d_k)`` of each
trimmed draft ``k = w+1..gamma``; ``pg`` entries of later rows give the target's
``log p(d_k)`` at the trimmed offset ``k`` of block ``block_fct`` (at the
request temperature).  With both, ``a_k = min(1, exp(p_lp - q_lp))`` is exact.

:func:`logprobs_from_sglang_jsonl` turns parsed rows into one Arrow row per
censored step, keyed by ``(rid, forward_ct)``, with ``gamma``-long lists
(NaN where the JSONL says nothing).  It parses; it does not read files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

__all__ = ["logprobs_from_sglang_jsonl", "SGLANG_LOGPROBS_SCHEMA"]

SGLANG_LOGPROBS_SCHEMA = pa.schema([
    ("rid", pa.string()),
    ("forward_ct", pa.int64()),
    ("q_logprob", pa.list_(pa.float64())),
    ("p_logprob", pa.list_(pa.float64())),
])


def logprobs_from_sglang_jsonl(records: Iterable[dict[str, Any]], *, gamma: int) -> pa.Table:
    """One row per censored step of the JSONL: ``rid, forward_ct, q_logprob[gamma], p_logprob[gamma]``.

    ``records`` are the parsed JSON lines, in any order.  Offsets are 1-based
    in SGLang; list index ``k - 1`` holds offset ``k``.  A malformed row is a
    ValueError naming its position and the field.

    >>> t = logprobs_from_sglang_jsonl([
    ...     {"rid": "a", "fct": 5, "w": 1, "cl": 1, "ct": 0, "trimmed_tokens": [7, 8], "q_lp": [-0.1, -0.2],
    ...      "pg": [[5, 2, -0.3, 7, 7]]}], gamma=3)
    >>> t.column("q_logprob").to_pylist()[0][1:], t.column("p_logprob").to_pylist()[0][1]
    ([-0.1, -0.2], -0.3)
    """
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    q: dict[tuple[str, int], list[float]] = {}
    p: dict[tuple[str, int], list[float]] = {}
    nan = math.nan
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or "rid" not in rec:
            raise ValueError(f"JSONL row {i}: expected an object with 'rid', got {str(rec)[:80]!r}")
        if "cl" not in rec:  # {rid, eos_end: [...]}: SGLang's analyzer only needs finish reasons, which we have
            continue
        rid = str(rec["rid"])
        try:
            if "q_lp" in rec:
                w = int(rec["w"])
                q_lp = [float(v) for v in rec["q_lp"]]
                if w + len(q_lp) != gamma:
                    raise ValueError(f"w={w} plus {len(q_lp)} q_lp values is not gamma={gamma}")
                q[(rid, int(rec["fct"]))] = [nan] * w + q_lp
            for entry in rec.get("pg", []):
                block_fct, offset, p_lp = int(entry[0]), int(entry[1]), float(entry[2])
                if not 1 <= offset <= gamma:
                    raise ValueError(f"pg offset {offset} outside 1..{gamma}")
                p.setdefault((rid, block_fct), [nan] * gamma)[offset - 1] = p_lp
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise ValueError(f"JSONL row {i} (rid {rid!r}): {exc}; is --gamma the server's block size?") from exc
    keys = sorted(q)
    return pa.table({
        "rid": [k[0] for k in keys],
        "forward_ct": [k[1] for k in keys],
        "q_logprob": [q[k] for k in keys],
        "p_logprob": [p.get(k, [nan] * gamma) for k in keys],
    }, schema=SGLANG_LOGPROBS_SCHEMA)
