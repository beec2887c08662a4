"""Drive traffic at a server and turn each finished request into rows.

Closed-loop load: ``concurrency`` requests in flight, each ``POST /generate``
(or, with ``api="completions"``/``"chat"``, SGLang's OpenAI endpoints with
``return_spec_tokens_details``; see ``collectors.sglang.openai``) with
logprobs (top-5 by default) so that the target's view of every committed
token is stored.  Request ``i`` belongs to workload ``workloads[i % n]`` and
gets the rid ``<workload>-<i:06d>`` and an explicit ``sampling_seed``, so the
same request can later be replayed token for token (companion runs).

**Request ids are unique per run**: with ``rid_scope`` set (the collector sets
it to the run id) the rid is ``<workload>-<i:06d>@<run_id>``, so two driven
runs on one server never share a rid and a request's steps are joined by
(run, rid) only — before, run ``second`` re-used ``gsm8k-000000`` and its
steps merged with the first run's.  A cap-accept companion collected with the
same spec (``CollectOptions.companion_of``) takes its compact run's scope, so
its rids equal the ones it replays.

**Connection errors are retried** with bounded exponential backoff
(``retries`` attempts after the first, ``retry_backoff_s`` doubling up to
``retry_backoff_max_s``): the request was never answered, and SGLang refuses
a second request with a rid it still runs, so a retry cannot duplicate work.
A request still failing after that — or cancelled because the run stopped —
goes to ``on_error`` and the collector stores it as a ``request_failed`` gap.

``drive(..., planned=[...])`` sends a given list of requests instead of the
planned traffic (``collectors.sglang.companion`` replays a run this way): a
request may carry its prompt as token ids (``input_ids``, sent instead of
``text``), further SGLang ``sampling_params`` and its own endpoint (``api``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import httpx
import numpy as np
import pyarrow as pa

from collectors.sglang import openai
from dspark_obs import schema
from dspark_obs.emulator.workloads import PROFILES

APIS = ("generate", "completions", "chat")

_WORDS = ("the", "a", "of", "to", "and", "in", "is", "it", "that", "for", "on", "with", "as", "was",
          "by", "number", "sum", "line", "verse", "answer", "explain", "write", "why", "how", "step")


@dataclass(frozen=True)
class PlannedRequest:
    """One request to send.  ``None`` sampling values are left to the server's defaults.

    ``input_ids`` (prompt token ids) are sent instead of ``text`` when given
    (SGLang takes one or the other); ``sampling_params`` adds further SGLang
    sampling parameters (a replay from a request log keeps all of them);
    ``api`` overrides ``DriveSpec.api`` for this request.
    """

    index: int
    rid: str
    workload: Optional[str]
    text: Optional[str]
    temperature: Optional[float]
    max_new_tokens: Optional[int]
    sampling_seed: Optional[int]
    input_ids: Optional[tuple[int, ...]] = None
    sampling_params: Optional[dict[str, Any]] = field(default=None, compare=False, hash=False)
    api: Optional[str] = None


@dataclass
class DriveSpec:
    workloads: list[str]
    requests: int
    concurrency: int = 32
    temperature: float = 0.0
    max_new_tokens: int = 256
    top_logprobs: int = 5
    seed: int = 0
    redact_text: bool = False
    api: str = "generate"  # generate | completions | chat
    model: Optional[str] = None  # OpenAI "model"; default: the server's served_model_name
    rid_scope: Optional[str] = None  # appended to every planned rid as "@<scope>" (the run id)
    retries: int = 5  # connection-error retries per request (0: none)
    retry_backoff_s: float = 0.25  # first backoff; doubles per retry
    retry_backoff_max_s: float = 4.0

    def __post_init__(self) -> None:
        if self.api == "openai":
            self.api = "completions"
        if self.api not in APIS:
            raise ValueError(f"api {self.api!r} is not one of {', '.join(APIS)} (or openai = completions)")
        if self.retries < 0 or self.retry_backoff_s < 0 or self.retry_backoff_max_s < self.retry_backoff_s:
            raise ValueError(f"retries {self.retries} and backoff {self.retry_backoff_s} s (max "
                             f"{self.retry_backoff_max_s} s) must be >= 0 with max >= first; e.g. --request-retries 5")

    @property
    def endpoint(self) -> str:
        return "/generate" if self.api == "generate" else openai.ENDPOINTS[self.api]


def plan_requests(spec: DriveSpec) -> list[PlannedRequest]:
    """Deterministic prompts: the workload tag first, then filler words."""
    if not spec.workloads:
        raise ValueError("at least one workload is needed, e.g. --workload gsm8k,arena-hard,poetry")
    rng = np.random.default_rng([spec.seed, 11])
    planned = []
    for i in range(spec.requests):
        workload = spec.workloads[i % len(spec.workloads)]
        lo, hi = PROFILES[workload].prompt_len_range if workload in PROFILES else (64, 256)
        n_words = int(rng.integers(lo, hi + 1))
        words = rng.choice(len(_WORDS), size=n_words)
        text = f"[{workload}] request {i}: " + " ".join(_WORDS[w] for w in words)
        rid = f"{workload}-{i:06d}" + (f"@{spec.rid_scope}" if spec.rid_scope else "")
        planned.append(PlannedRequest(i, rid, workload, text, spec.temperature,
                                      spec.max_new_tokens, int(rng.integers(0, 2**31 - 1))))
    return planned


def sampling_params(req: PlannedRequest) -> dict[str, Any]:
    """SGLang ``sampling_params`` of ``req``: its extra parameters, then the three it names (None left out)."""
    params = dict(req.sampling_params or {})
    for name in ("temperature", "max_new_tokens", "sampling_seed"):
        value = getattr(req, name)
        if value is not None:
            params[name] = value
        elif params.get(name) is None:
            params.pop(name, None)
    return params


def generate_body(req: PlannedRequest, *, top_logprobs: int) -> dict[str, Any]:
    prompt = {"input_ids": list(req.input_ids)} if req.input_ids else {"text": req.text}
    return {
        **prompt,
        "rid": req.rid,
        "sampling_params": sampling_params(req),
        "return_logprob": True,
        "top_logprobs_num": top_logprobs,
        "logprob_start_len": -1,
        "stream": False,
    }


def openai_body(req: PlannedRequest, api: str, *, model: str, top_logprobs: int) -> dict[str, Any]:
    """An OpenAI request for ``req``; completions take token ids as the prompt when known."""
    body = openai.request_body(api, model=model, text=req.text or "", rid=req.rid,
                               temperature=req.temperature, max_new_tokens=req.max_new_tokens,
                               sampling_seed=req.sampling_seed, top_logprobs=top_logprobs)
    if api == "completions" and req.input_ids:
        body["prompt"] = list(req.input_ids)
    for name in ("temperature", "max_tokens", "max_completion_tokens", "seed"):
        if name in body and body[name] is None:
            del body[name]
    return body


def _hist(value: Any) -> Optional[list[int]]:
    return [int(v) for v in value] if isinstance(value, list) else None


def response_rows(req: PlannedRequest, body: dict[str, Any], *, concurrency: int,
                  submitted_at: dt.datetime, finished_at: dt.datetime,
                  redact_text: bool) -> tuple[dict[str, Any], pa.Table]:
    """One ``requests`` row and the ``tokens`` rows of a finished ``/generate``."""
    meta = body.get("meta_info") or {}
    fr = meta.get("finish_reason")
    row: dict[str, Any] = {
        "rid": req.rid, "workload": req.workload, "api": "generate",
        "prompt_tokens": meta.get("prompt_tokens"), "completion_tokens": meta.get("completion_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "finish_reason": fr.get("type") if isinstance(fr, dict) else fr,
        "temperature": req.temperature, "max_new_tokens": req.max_new_tokens,
        "sampling_seed": req.sampling_seed, "e2e_latency_s": meta.get("e2e_latency"),
        "ttft_s": meta.get("emu_first_token_latency"),
        "submitted_at": submitted_at, "finished_at": finished_at, "concurrency": concurrency,
        "prompt_text": None if redact_text else req.text,
        "input_ids": None if redact_text or not req.input_ids else list(req.input_ids),
        "output_text": None if redact_text else body.get("text"),
    }
    for name in ("spec_verify_ct", "spec_accept_length", "spec_accept_rate", "spec_num_correct_drafts",
                 "spec_num_proposed_drafts", "spec_cap_length", "spec_block_accept_length"):
        row[name] = meta.get(name)
    row["spec_correct_drafts_histogram"] = _hist(meta.get("spec_correct_drafts_histogram"))
    row["spec_cap_lens_histogram"] = _hist(meta.get("spec_cap_lens_histogram"))

    lps = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs") or []
    ids = body.get("output_ids")
    n = len(lps) if lps else (len(ids) if ids else 0)
    top_ids, top_lps = [], []
    for p in range(n):
        entry = tops[p] if p < len(tops) and tops[p] else None
        top_ids.append([int(e[1]) for e in entry] if entry else None)
        top_lps.append([float(e[0]) for e in entry] if entry else None)
    tokens = pa.Table.from_pydict({
        "rid": [req.rid] * n,
        "pos": list(range(n)),
        "token_id": [int(e[1]) for e in lps] if lps else [int(t) for t in ids[:n]],
        "logprob": [float(e[0]) if e[0] is not None else None for e in lps] if lps else [None] * n,
        "top_ids": top_ids,
        "top_logprobs": top_lps,
    }, schema=schema.schema_for("tokens"))
    return row, tokens


def openai_rows(req: PlannedRequest, body: dict[str, Any], *, api: str, concurrency: int,
                submitted_at: dt.datetime, finished_at: dt.datetime,
                redact_text: bool) -> tuple[dict[str, Any], pa.Table]:
    """One ``requests`` row and the ``tokens`` rows of a finished OpenAI request."""
    parsed = openai.parse_response(api, body)
    row: dict[str, Any] = {
        "rid": req.rid, "workload": req.workload, "api": api,
        "prompt_tokens": parsed["prompt_tokens"], "completion_tokens": parsed["completion_tokens"],
        "cached_tokens": parsed["cached_tokens"], "finish_reason": parsed["finish_reason"],
        "temperature": req.temperature, "max_new_tokens": req.max_new_tokens,
        "sampling_seed": req.sampling_seed, "e2e_latency_s": (finished_at - submitted_at).total_seconds(),
        "submitted_at": submitted_at, "finished_at": finished_at, "concurrency": concurrency,
        "prompt_text": None if redact_text else req.text,
        "input_ids": None if redact_text or not req.input_ids else list(req.input_ids),
        "output_text": None if redact_text else parsed["text"],
        **parsed["spec"],
    }
    ids = parsed["token_ids"] if isinstance(parsed["token_ids"], list) else []
    lps = parsed["logprobs"] or []
    tops = parsed["top_logprobs"] or []
    n = len(ids)
    tokens = pa.Table.from_pydict({
        "rid": [req.rid] * n, "pos": list(range(n)), "token_id": [int(t) for t in ids],
        "logprob": [float(lps[p]) if p < len(lps) and lps[p] is not None else None for p in range(n)],
        "top_ids": [None] * n,
        "top_logprobs": [tops[p] if p < len(tops) else None for p in range(n)],
    }, schema=schema.schema_for("tokens"))
    return row, tokens


@dataclass
class DriveResult:
    finished: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


async def drive(client: httpx.AsyncClient, spec: DriveSpec,
                on_result: Callable[[dict[str, Any], pa.Table], None],
                on_progress: Callable[[int], None] = lambda n: None,
                on_error: Callable[[PlannedRequest, str], None] = lambda r, e: None,
                *, planned: Optional[list[PlannedRequest]] = None) -> DriveResult:
    """Send every planned request, ``spec.concurrency`` at a time, in order.

    ``planned`` replaces ``plan_requests(spec)`` (a replay); ``spec`` still
    gives the concurrency, the endpoint, logprobs and redaction.
    """
    result = DriveResult()
    queue: asyncio.Queue[PlannedRequest] = asyncio.Queue()
    for req in plan_requests(spec) if planned is None else planned:
        queue.put_nowait(req)

    async def worker() -> None:
        while True:
            try:
                req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            submitted = dt.datetime.now(dt.timezone.utc)
            api = req.api or spec.api
            try:
                if api == "generate":
                    payload = generate_body(req, top_logprobs=spec.top_logprobs)
                else:
                    payload = openai_body(req, api, model=spec.model or "default", top_logprobs=spec.top_logprobs)
                resp = await _post_with_retries(client, "/generate" if api == "generate" else openai.ENDPOINTS[api],
                                                payload, spec)
                resp.raise_for_status()
                body = resp.json()
                if not isinstance(body, dict):
                    raise ValueError(f"response is not a JSON object: {str(body)[:200]}")
                finished = dt.datetime.now(dt.timezone.utc)
                if api == "generate":
                    row, tokens = response_rows(req, body, concurrency=spec.concurrency, submitted_at=submitted,
                                                finished_at=finished, redact_text=spec.redact_text)
                else:
                    row, tokens = openai_rows(req, body, api=api, concurrency=spec.concurrency,
                                              submitted_at=submitted, finished_at=finished,
                                              redact_text=spec.redact_text)
                on_result(row, tokens)
                result.finished += 1
            except (httpx.HTTPError, OSError, ValueError, KeyError, TypeError, IndexError, AttributeError,
                    pa.ArrowException) as exc:
                result.failed += 1
                msg = f"{req.rid}: {type(exc).__name__}: {exc}"
                result.errors.append(msg)
                on_error(req, msg)
            except asyncio.CancelledError:  # the run stopped with this request in flight: say so, then stop
                result.failed += 1
                on_error(req, f"{req.rid}: cancelled: the run stopped before the request finished")
                raise
            on_progress(1)

    await asyncio.gather(*(worker() for _ in range(max(1, spec.concurrency))))
    return result


# Errors where no answer came: the connection was refused, timed out connecting, or dropped (a server
# going down mid-request).  An HTTP error status is an answer and is not retried.
_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
              httpx.WriteError)


async def _post_with_retries(client: httpx.AsyncClient, path: str, payload: dict, spec: DriveSpec) -> httpx.Response:
    """POST, retrying connection errors ``spec.retries`` times with doubling, bounded backoff."""
    delay = spec.retry_backoff_s
    for attempt in range(spec.retries + 1):
        try:
            return await client.post(path, json=payload)
        except _RETRYABLE:
            if attempt == spec.retries:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, spec.retry_backoff_max_s)
    raise AssertionError("unreachable")
