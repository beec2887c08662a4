"""Finished requests from files -> ``requests`` and ``tokens``.

* ``--generate``: JSON lines, each a ``/generate`` response body (or a list of
  them, as a batch request returns);
* ``--request-log``: SGLang's ``--log-requests --log-requests-format json``
  lines — ``[time] {"timestamp", "event", "rid", "obj", "out"}`` from its
  logging handler (the ``[time] `` prefix is optional); ``request.finished``
  events become rows, other events and non-JSON log lines are skipped — and
  ``--export-metrics-to-file`` lines (``{"request_parameters": "<json>",
  **meta_info}``), told apart by their keys.  Token rows are written only when
  the log kept every ``output_token_logprobs`` entry (``--log-requests-level 3``;
  lower levels truncate long lists with ``"..."``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from collectors.importers import ImportResult, TableSink, iter_json_documents
from collectors.lines import iter_lines
from collectors.sglang.responses import finished_rows, parse_log_line


def _rows(sink: TableSink, body: dict, **kw: Any) -> None:
    row, tokens = finished_rows(body, **kw)
    sink.add("requests", row)
    sink.add_table("tokens", tokens)
    sink.result.rids.add(row["rid"])


def import_generate(store, run_id: str, path: str | Path, *, workload: Callable[[str], Any],
                    redact_text: bool = False) -> ImportResult:
    result = ImportResult("generate")
    sink = TableSink(store, run_id, result, redact_text=redact_text)
    source = f"generate-file:{Path(path).name}"
    for line, value, error, text in iter_json_documents(path):
        bodies = value if isinstance(value, list) else [value]
        for body in bodies:
            try:
                if error is not None:
                    raise ValueError(error)
                if not isinstance(body, dict):
                    raise ValueError(f"expected a /generate response object, got {type(body).__name__}")
                _rows(sink, body, rid=None, workload=workload, api="generate", sampling={}, prompt=None,
                      redact=redact_text)
            except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
                sink.dead(f"{source}:{line}", str(exc), text)
    sink.close()
    return result


def import_request_log(store, run_id: str, path: str | Path, *, workload: Callable[[str], Any],
                       redact_text: bool = False) -> ImportResult:
    result = ImportResult("request-log")
    sink = TableSink(store, run_id, result, redact_text=redact_text)
    source = f"request-log:{Path(path).name}"
    for line, raw in iter_lines(path):
        try:
            entry = parse_log_line(raw)
            if entry is None:
                result.skipped += 1
                continue
            _rows(sink, entry["body"], rid=entry["rid"], workload=workload, api="log", sampling=entry["sampling"],
                  prompt=entry["prompt"], redact=redact_text)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            sink.dead(f"{source}:{line}", str(exc), raw)
    sink.close()
    return result
