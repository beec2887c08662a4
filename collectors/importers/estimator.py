"""SGLang's block-accept estimator JSONL (``SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH``) -> ``estimator_records``.

Rows as ``dspark_block_accept_estimator.py`` writes them with ``json.dumps``:
``{rid, fct, w, cl, ct[, trimmed_tokens, q_lp][, pg]}`` per request-step and
``{rid, eos_end: [fct, ...]}`` markers.  ``pg`` entries are
``[block_fct, offset, p_lp, token, realized]``.  ``json.dumps`` writes a
``-inf`` logprob as ``-Infinity``; it is read back as ``-inf``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import msgspec

from collectors.importers import ImportResult, TableSink, iter_json_documents

I16 = Annotated[int, msgspec.Meta(ge=-(2**15), le=2**15 - 1)]
I32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class StepRow(msgspec.Struct):
    rid: str
    fct: I64
    w: I16
    cl: I16
    ct: I16
    trimmed_tokens: Optional[list[I32]] = None
    q_lp: Optional[list[float]] = None
    pg: Optional[list[tuple[I64, I16, float, I32, I32]]] = None


class EosRow(msgspec.Struct):
    rid: str
    eos_end: list[I64]


def estimator_row(value: object, line: int) -> dict:
    """The ``estimator_records`` row of one parsed JSONL value; ValueError names what is wrong."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    try:
        if "eos_end" in value:
            eos = msgspec.convert(value, EosRow)
            return {"kind": "eos_end", "rid": eos.rid, "eos_end": eos.eos_end, "source_line": line}
        row = msgspec.convert(value, StepRow)
    except msgspec.ValidationError as exc:
        raise ValueError(f"does not match SGLang's estimator row: {exc}") from exc
    if row.trimmed_tokens is not None and row.q_lp is not None and len(row.trimmed_tokens) != len(row.q_lp):
        raise ValueError(f"trimmed_tokens ({len(row.trimmed_tokens)}) and q_lp ({len(row.q_lp)}) differ in length")
    return {
        "kind": "step", "rid": row.rid, "forward_ct": row.fct, "window": row.w, "correct_drafts": row.cl,
        "cap_trim": row.ct, "trimmed_tokens": row.trimmed_tokens, "q_logprob": row.q_lp,
        "pending_gathers": None if row.pg is None else [
            {"block_forward_ct": g[0], "offset": g[1], "p_logprob": g[2], "token": g[3], "realized": g[4]}
            for g in row.pg],
        "source_line": line,
    }


def import_estimator_jsonl(store, run_id: str, path: str | Path, *, redact_text: bool = False) -> ImportResult:
    result = ImportResult("estimator-jsonl")
    sink = TableSink(store, run_id, result, redact_text=redact_text)
    source = f"estimator-jsonl:{Path(path).name}"
    for line, value, error, text in iter_json_documents(path):
        if error is None:
            try:
                row = estimator_row(value, line)
            except ValueError as exc:
                error = str(exc)
        if error is not None:
            sink.dead(f"{source}:{line}", error, text)
            continue
        result.rids.add(row["rid"])
        sink.add("estimator_records", row)
    sink.close()
    return result
