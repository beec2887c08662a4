"""SGLang's finished-request formats -> ``requests`` and ``tokens`` rows.

A ``/generate`` response body (``meta_info`` with ``output_token_logprobs``),
a request-log line (``--log-requests --log-requests-format json``:
``[time] {"timestamp", "event", "rid", "obj", "out"}``) or an
``--export-metrics-to-file`` line.  One reading of each, for ``ingest
--generate/--request-log`` and for ``collect --request-log`` alike.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Optional

from collectors.sglang.driver import PlannedRequest, response_rows

_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*")


def finished_rows(body: dict, *, rid: Optional[str], workload: Callable, api: str, sampling: dict,
                  prompt: Optional[str], redact: bool) -> tuple[dict, Any]:
    """A finished request's ``requests`` row and ``tokens`` table (logprobs only when the log kept them all)."""
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise ValueError("no meta_info object")
    rid = rid or meta.get("id")
    if not isinstance(rid, str):
        raise ValueError(f"no request id (rid or meta_info.id), got {rid!r}")
    lps = meta.get("output_token_logprobs")
    complete = isinstance(lps, list) and all(isinstance(e, list) and len(e) >= 2 for e in lps)
    if lps is not None and not complete:
        body = {**body, "meta_info": {k: v for k, v in meta.items()
                                      if k not in ("output_token_logprobs", "output_top_logprobs")}}
        body.pop("output_ids", None)
    temp = sampling.get("temperature")
    req = PlannedRequest(0, rid, workload(rid), prompt if isinstance(prompt, str) else None,
                         temp if isinstance(temp, (int, float)) and not isinstance(temp, bool) else None,
                         sampling.get("max_new_tokens") if isinstance(sampling.get("max_new_tokens"), int) else None,
                         sampling.get("sampling_seed") if isinstance(sampling.get("sampling_seed"), int) else None)
    row, tokens = response_rows(req, body, concurrency=None, submitted_at=None, finished_at=None,
                                redact_text=redact)
    row["api"] = api
    return row, tokens


def parse_log_line(raw: str) -> Optional[dict[str, Any]]:
    """One request-log line -> ``{body, rid, sampling, prompt}`` of a finished request; None for other lines.

    A ``request.finished`` event (``--log-requests-format json``) or an
    ``--export-metrics-to-file`` line; any other event or an ordinary log line
    gives None; a line that looks like one but is not raises ValueError.
    Shared by ``ingest --request-log`` and ``collect --request-log``.
    """
    text = _LOG_PREFIX.sub("", raw, count=1)
    if not text.startswith("{"):
        return None  # an ordinary log line
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    if "request_parameters" in data:  # --export-metrics-to-file
        params = data.get("request_parameters")
        params = json.loads(params) if isinstance(params, str) else (params or {})
        if not isinstance(params, dict):
            raise ValueError("request_parameters is not a JSON object")
        meta = {k: v for k, v in data.items() if k != "request_parameters"}
        sp = params.get("sampling_params") if isinstance(params.get("sampling_params"), dict) else {}
        return {"body": {"meta_info": meta}, "rid": params.get("rid") if isinstance(params.get("rid"), str) else None,
                "sampling": sp, "prompt": params.get("text")}
    if "event" in data:
        if data["event"] != "request.finished":
            return None
        obj = data.get("obj") if isinstance(data.get("obj"), dict) else {}
        out = data.get("out")
        if not isinstance(out, dict):
            raise ValueError("request.finished without an 'out' object")
        sp = obj.get("sampling_params") if isinstance(obj.get("sampling_params"), dict) else {}
        return {"body": out, "rid": data.get("rid") if isinstance(data.get("rid"), str) else None,
                "sampling": sp, "prompt": obj.get("text")}
    raise ValueError("neither a request log event nor an exported metrics line")
