"""What a companion replay sends: each request's prompt and sampling parameters.

Three sources, one shape (:class:`ReplayInput`):

* the run's own ``requests`` rows (:func:`from_requests`) — runs whose traffic
  the collector drove store their prompts (``prompt_text``, ``input_ids``)
  and sampling parameters (``temperature``, ``max_new_tokens``,
  ``sampling_seed``);
* SGLang's request log (:func:`read_request_log`), written by a server
  launched with ``--log-requests --log-requests-format json
  --log-requests-level 3``: ``request.finished`` events carry the request as
  the server received it (``obj``: ``text`` / ``input_ids``, ``rid``, the
  full ``sampling_params``) and its output (``out.output_ids``), so runs
  observed in attach mode can be replayed too.  Level 2 truncates prompts and
  outputs longer than 2,048 items (``"..."``): such entries are reported, not
  replayed; levels 0 and 1 log no prompts at all;
* a prompts JSONL the user writes (:func:`read_prompts`), one object per line::

      {"rid": "req-17", "input_ids": [1, 2, 3]}            # or "text": "..."
      {"rid": "req-18", "text": "...", "sampling_params": {"temperature": 0.7, "sampling_seed": 42,
                                                          "max_new_tokens": 256},
       "output_ids": [5, 6, 7]}                           # optional: the original output

Token ids win over text where both are known (no tokenizer round trip).
A line or event that cannot be used is a *problem* (``where``, ``why``), never
an exception: the companion reports them and replays the rest.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
import pyarrow as pa

from collectors.lines import iter_lines

SOURCES = ("requests", "request-log", "prompts")
_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*")
_SAMPLING_NAMES = ("temperature", "max_new_tokens", "sampling_seed")
# SGLang's --log-requests-level 2 keeps the first and last 1,024 items around "...".
_LEVEL2_HALF = 1024
_TRUNCATED_HINT = "truncated by --log-requests-level 2; log with --log-requests-level 3"


@dataclass(frozen=True)
class ReplayInput:
    """One request as the original server received it.

    ``sampling_params`` holds every SGLang sampling parameter the source knew
    (a request log keeps the client's whole dict; stored rows only the three
    the driver sends); ``None`` values mean "the server's default".
    ``output_ids`` are the original's committed tokens when the source kept
    them (request logs, prompts files) — the identity check falls back on
    them when the run stored no ``tokens``.  ``order`` is the original
    submission time (POSIX seconds) when known: replays keep that order.
    """

    rid: str
    source: str
    text: Optional[str] = None
    input_ids: Optional[tuple[int, ...]] = None
    sampling_params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    workload: Optional[str] = None
    api: Optional[str] = None  # generate | completions | chat: the endpoint to replay on
    order: Optional[float] = None
    output_ids: Optional[tuple[int, ...]] = None

    @property
    def input_kind(self) -> Optional[str]:
        return "input_ids" if self.input_ids else ("text" if self.text is not None else None)

    def param(self, name: str) -> Any:
        return self.sampling_params.get(name)

    def with_sampling_from(self, other: "ReplayInput") -> "ReplayInput":
        """This prompt with ``other``'s sampling parameters where this source named none."""
        if self.sampling_params:
            return self
        return replace(self, sampling_params=dict(other.sampling_params))


@dataclass
class InputSet:
    """Inputs by rid, plus what could not be used (``(where, why)``) and foreign lines skipped."""

    source: str
    inputs: dict[str, ReplayInput] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)
    skipped: int = 0


# -- the run's own requests ----------------------------------------------------

def _float32_as_sent(value: Any) -> Any:
    """The decimal a float32 column stored: 0.699999988079071 -> 0.7 (the shortest that round-trips).

    ``requests.temperature`` is float32; replaying its widened value would
    sample at a slightly different temperature than the original.
    """
    if isinstance(value, float):
        return float(np.format_float_positional(np.float32(value), unique=True, trim="0"))
    return value


def from_requests(requests: pa.Table) -> InputSet:
    """Inputs from stored ``requests`` rows (token ids where stored, else the prompt text).

    Rows without either (``--redact-text`` runs, imports that kept no prompt)
    give no input; ``api`` ``log`` (imported requests) replays on ``/generate``.
    The float32 ``temperature`` is read back as the decimal that was sent.
    """
    out = InputSet("requests")
    cols = set(requests.column_names)
    for row in requests.to_pylist():
        rid = row.get("rid")
        ids = row.get("input_ids") if "input_ids" in cols else None
        text = row.get("prompt_text") if "prompt_text" in cols else None
        if not isinstance(rid, str) or (not ids and text is None):
            continue
        submitted = row.get("submitted_at")
        api = row.get("api")
        out.inputs[rid] = ReplayInput(
            rid=rid, source="requests", text=text, input_ids=tuple(int(t) for t in ids) if ids else None,
            sampling_params={n: _float32_as_sent(row.get(n)) for n in _SAMPLING_NAMES if row.get(n) is not None},
            workload=row.get("workload"), api=api if api in ("generate", "completions", "chat") else "generate",
            order=submitted.timestamp() if isinstance(submitted, dt.datetime) else None)
    return out


# -- SGLang's request log --------------------------------------------------------

def _token_list(value: Any) -> Optional[tuple[int, ...]]:
    """Token ids from a logged list; None for anything else (including truncated lists)."""
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return tuple(value)
    return None


def _truncated(value: Any) -> bool:
    if isinstance(value, list):
        return any(v == "..." for v in value)
    return (isinstance(value, str) and len(value) == 2 * _LEVEL2_HALF + 3
            and value[_LEVEL2_HALF:_LEVEL2_HALF + 3] == "...")


def _timestamp(value: Any) -> Optional[float]:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _prompt(obj: dict[str, Any]) -> tuple[Optional[str], Optional[tuple[int, ...]], Optional[str]]:
    """``(text, input_ids, problem)`` of a logged ``GenerateReqInput``."""
    ids, text = obj.get("input_ids"), obj.get("text")
    if (isinstance(ids, list) and ids and isinstance(ids[0], list)) or isinstance(text, list):
        return None, None, "a batch request (text or input_ids is a list of prompts): replay its parts separately"
    token_ids = _token_list(ids)
    if token_ids is not None:
        return (text if isinstance(text, str) and not _truncated(text) else None), token_ids, None
    if isinstance(text, str) and not _truncated(text):
        return text, None, None
    if _truncated(ids) or _truncated(text):
        return None, None, f"prompt {_TRUNCATED_HINT}"
    return None, None, ("no prompt in the entry: SGLang logs text and input_ids from --log-requests-level 2 "
                        "on (use 3, which also keeps long prompts whole)")


def _output_ids(out: Any) -> Optional[tuple[int, ...]]:
    if not isinstance(out, dict):
        return None
    ids = _token_list(out.get("output_ids"))
    if ids is not None:
        return ids
    meta = out.get("meta_info") if isinstance(out.get("meta_info"), dict) else {}
    lps = meta.get("output_token_logprobs")
    if isinstance(lps, list) and lps and all(isinstance(e, list) and len(e) >= 2 for e in lps):
        return _token_list([e[1] for e in lps])
    return None


def _sampling(value: Any) -> dict[str, Any]:
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else {}


def read_request_log(path: str | Path, *, workload=None) -> InputSet:
    """Inputs from SGLang's JSON request log (``request.finished`` events; ``request.received`` fills in).

    ``workload(rid)`` names each request's workload (e.g. a
    :class:`collectors.workloads.WorkloadResolver`).  The replay order is the
    ``request.received`` time, else the finished time minus ``e2e_latency``.
    """
    out = InputSet("request-log")
    received: dict[str, tuple[float | None, dict]] = {}
    finished: dict[str, tuple[int, dict, Any, Optional[float]]] = {}
    name = Path(path).name
    for line, raw in iter_lines(path):
        text = _LOG_PREFIX.sub("", raw, count=1)
        if not text.startswith("{"):
            out.skipped += 1
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            out.problems.append((f"{name}:{line}", f"not JSON: {exc}"))
            continue
        event = data.get("event") if isinstance(data, dict) else None
        if event not in ("request.received", "request.finished"):
            out.skipped += 1
            continue
        obj = data.get("obj") if isinstance(data.get("obj"), dict) else {}
        rid = data.get("rid") if isinstance(data.get("rid"), str) else obj.get("rid")
        if not isinstance(rid, str):
            out.problems.append((f"{name}:{line}", f"{event} without a single string rid (got {rid!r})"))
            continue
        stamp = _timestamp(data.get("timestamp"))
        if event == "request.received":
            received[rid] = (stamp, obj)
        else:
            finished[rid] = (line, obj, data.get("out"), stamp)
    for rid in list(finished) + [r for r in received if r not in finished]:
        line, obj, result, stamp = finished.get(rid, (0, None, None, None))
        when, received_obj = received.get(rid, (None, {}))
        obj = obj if obj is not None else received_obj
        where = f"{name}:{line}" if line else f"{name} (request.received of {rid})"
        text, ids, problem = _prompt(obj)
        if problem is not None and received_obj and received_obj is not obj:
            text, ids, again = _prompt(received_obj)  # the received event may have kept the prompt
            problem = problem if again is not None else None
        if problem is not None:
            out.problems.append((where, f"rid {rid}: {problem}"))
            continue
        if when is None and stamp is not None:
            meta = result.get("meta_info") if isinstance(result, dict) and isinstance(result.get("meta_info"), dict) else {}
            latency = meta.get("e2e_latency")
            when = stamp - latency if isinstance(latency, (int, float)) else stamp
        out.inputs[rid] = ReplayInput(
            rid=rid, source="request-log", text=text, input_ids=ids,
            sampling_params=_sampling(obj.get("sampling_params")) or _sampling(received_obj.get("sampling_params")),
            workload=workload(rid) if workload else None, api="generate", order=when,
            output_ids=_output_ids(result))
    return out


# -- a prompts JSONL -------------------------------------------------------------

def read_prompts(path: str | Path, *, workload=None) -> InputSet:
    """Inputs from a JSONL of ``{rid, text | input_ids, sampling_params?, output_ids?, workload?}`` objects.

    Without ``sampling_params`` the run's stored parameters apply (see
    :func:`merge`), else the server's defaults.
    """
    out = InputSet("prompts")
    name = Path(path).name
    for line, raw in iter_lines(path):
        where = f"{name}:{line}"
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            out.problems.append((where, f"not JSON: {exc}"))
            continue
        if not isinstance(data, dict):
            out.problems.append((where, f"expected a JSON object, got {type(data).__name__}"))
            continue
        rid = data.get("rid")
        if not isinstance(rid, str) or not rid:
            out.problems.append((where, "no \"rid\" string: the rid pairs the replay with the run's steps"))
            continue
        ids = _token_list(data.get("input_ids"))
        text = data.get("text") if isinstance(data.get("text"), str) else None
        if ids is None and text is None:
            out.problems.append((where, f"rid {rid}: needs \"text\" (a string) or \"input_ids\" (a list of ints)"))
            continue
        sp = data.get("sampling_params")
        if sp is not None and not isinstance(sp, dict):
            out.problems.append((where, f"rid {rid}: \"sampling_params\" must be an object, got {type(sp).__name__}"))
            continue
        wl = data.get("workload") if isinstance(data.get("workload"), str) else (workload(rid) if workload else None)
        out.inputs[rid] = ReplayInput(rid=rid, source="prompts", text=text, input_ids=ids,
                                      sampling_params=_sampling(sp), workload=wl, api="generate",
                                      order=None, output_ids=_token_list(data.get("output_ids")))
    return out


def merge(base: InputSet, overrides: Iterable[InputSet]) -> dict[str, ReplayInput]:
    """``base``'s inputs with each override's entries on top (later sources win).

    An override without sampling parameters keeps the stored ones; without a
    workload or an order, it keeps those too.
    """
    merged = dict(base.inputs)
    for source in overrides:
        for rid, entry in source.inputs.items():
            old = merged.get(rid)
            if old is not None:
                entry = entry.with_sampling_from(old)
                entry = replace(entry, workload=entry.workload or old.workload,
                                order=entry.order if entry.order is not None else old.order,
                                output_ids=entry.output_ids or old.output_ids)
            merged[rid] = entry
    return merged
