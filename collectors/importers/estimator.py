"""SGLang's block-accept estimator JSONL (``SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH``) -> ``estimator_records``.

Rows as ``dspark_block_accept_estimator.py`` writes them with ``json.dumps``
(declared in :mod:`dspark_obs.records`, which the emulator writes with):
``{rid, fct, w, cl, ct[, trimmed_tokens, q_lp][, pg]}`` per request-step and
``{rid, eos_end: [fct, ...]}`` markers.  ``pg`` entries are
``[block_fct, offset, p_lp, token, realized]``.  ``json.dumps`` writes a
``-inf`` logprob as ``-Infinity``; it is read back as ``-inf``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from collectors.contract import column_struct
from collectors.importers import ImportResult, TableSink, iter_json_documents
from dspark_obs import records, schema

# The rows' columns in ``estimator_records``: SGLang's short keys, spelt out.
COLUMN_OF = {"fct": "forward_ct", "w": "window", "cl": "correct_drafts", "ct": "cap_trim", "q_lp": "q_logprob",
             "pg": "pending_gathers"}
# SGLang's rows (dspark_obs.records), each integer narrowed to its column's range.
StepRow = column_struct(records.BlockAcceptRow, "StepRow", schema.ESTIMATOR_RECORDS, module=__name__,
                        column_of=COLUMN_OF, omit_defaults=False)
EosRow = column_struct(records.BlockAcceptEosRow, "EosRow", schema.ESTIMATOR_RECORDS, module=__name__)
_GATHER_FIELDS = schema.ESTIMATOR_RECORDS.field("pending_gathers").type.value_type.names


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
    out = {"kind": "step", **{COLUMN_OF.get(name, name): getattr(row, name) for name in StepRow.__struct_fields__}}
    if row.pg is not None:
        out["pending_gathers"] = [dict(zip(_GATHER_FIELDS, g)) for g in row.pg]
    return {**out, "source_line": line}


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
