"""SGLang's OpenAI-compatible endpoints: request bodies and response parsing.

``/v1/completions`` and ``/v1/chat/completions`` with
``return_spec_tokens_details: true`` return the finished request's DSpark
counters under ``sglext.spec_tokens_details`` (SGLang's ``SpecTokensDetails``:
absent counters read 0 / ``[]`` there, so a 0 mean cap length or block-accept
length means "not reported" and is stored as null).  ``return_token_ids``
gives the output token ids (``choices[i].token_ids`` for completions,
``choices[i].response_token_ids`` for chat); logprobs come as the OpenAI
shapes, whose top alternatives are keyed by token *text*, so ``top_ids`` is
null and ``top_logprobs`` holds the values in descending order.  ``seed`` is
SGLang's per-request ``sampling_seed``.
"""

from __future__ import annotations

from typing import Any, Optional

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
SPEC_FIELDS = ("spec_verify_ct", "spec_accept_length", "spec_accept_rate", "spec_num_correct_drafts",
               "spec_num_proposed_drafts", "spec_cap_length", "spec_block_accept_length")
_ZERO_MEANS_ABSENT = ("spec_cap_length", "spec_block_accept_length")


def request_body(api: str, *, model: str, text: str, rid: str, temperature: float, max_new_tokens: int,
                 sampling_seed: Optional[int], top_logprobs: int) -> dict[str, Any]:
    common = {"model": model, "temperature": temperature, "seed": sampling_seed, "rid": rid,
              "stream": False, "return_spec_tokens_details": True, "return_token_ids": True}
    if api == "completions":
        return {**common, "prompt": text, "max_tokens": max_new_tokens, "logprobs": top_logprobs}
    if api == "chat":
        return {**common, "messages": [{"role": "user", "content": text}],
                "max_completion_tokens": max_new_tokens, "logprobs": True, "top_logprobs": top_logprobs}
    raise ValueError(f"api {api!r} is not one of {', '.join(ENDPOINTS)}")


def spec_details(body: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """The ``spec_*`` counters of choice ``index`` from ``sglext.spec_tokens_details`` ({} if absent)."""
    ext = body.get("sglext")
    details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
    if isinstance(details, list):
        details = details[index] if index < len(details) else None
    if not isinstance(details, dict):
        return {}
    out = {}
    for name in SPEC_FIELDS:
        value = details.get(name)
        if name in _ZERO_MEANS_ABSENT and not value:
            value = None
        out[name] = value
    for name in ("spec_correct_drafts_histogram", "spec_cap_lens_histogram"):
        hist = details.get(name)
        out[name] = [int(v) for v in hist] if isinstance(hist, list) and hist else None
    return out


def parse_response(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """Normalise a non-streaming response: text, finish reason, usage, tokens and spec counters.

    Returns ``{text, finish_reason, prompt_tokens, completion_tokens, cached_tokens,
    token_ids, logprobs, top_logprobs, spec}``; raises ``ValueError`` for a body
    that is not a response of ``api``.
    """
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"{ENDPOINTS.get(api, api)} response has no choices: {str(body)[:200]}")
    choice = choices[0]
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    out: dict[str, Any] = {
        "finish_reason": choice.get("finish_reason"),
        "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": details.get("cached_tokens"), "spec": spec_details(body),
        "logprobs": None, "top_logprobs": None,
    }
    lp = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else None
    if api == "completions":
        out["text"] = choice.get("text")
        out["token_ids"] = choice.get("token_ids")
        if lp is not None:
            out["logprobs"] = lp.get("token_logprobs")
            tops = lp.get("top_logprobs")
            if isinstance(tops, list):
                out["top_logprobs"] = [sorted(map(float, t.values()), reverse=True) if isinstance(t, dict)
                                       else None for t in tops]
    else:
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        out["text"] = message.get("content")
        out["token_ids"] = choice.get("response_token_ids") or choice.get("token_ids")
        content = lp.get("content") if lp is not None else None
        if isinstance(content, list):
            out["logprobs"] = [c.get("logprob") if isinstance(c, dict) else None for c in content]
            out["top_logprobs"] = [
                sorted((float(t["logprob"]) for t in c.get("top_logprobs") or [] if isinstance(t, dict)),
                       reverse=True) if isinstance(c, dict) else None for c in content]
    return out
