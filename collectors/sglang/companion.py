"""Replay a run's requests against a cap-accept server: the companion run.

A cap-accept server (``SGLANG_RAGGED_VERIFY_MODE=cap-accept``) verifies the
whole draft block but commits only up to the scheduled window, so it commits
what compact commits and exposes the full-block acceptance the compact run hid.
Replaying a compact run's requests there — same prompts, same sampling
parameters including the per-request ``sampling_seed`` — gives the truth the
ceiling estimate and the calibration labels are checked against.

This module prepares the replay; :mod:`collectors.sglang.companion_run` runs it and
measures the pairing:

* :func:`check_server` reads ``/server_info`` and :func:`require_cap_accept`
  refuses anything but a cap-accept server (the mode comes from the
  ``dspark_info_record`` payloads, else the server's ``env``);
* :func:`plan_replay` turns the run's requests into
  :class:`~collectors.sglang.driver.PlannedRequest` s: inputs from the stored
  ``requests`` rows, an SGLang request log or a prompts JSONL
  (:mod:`collectors.sglang.replay_inputs`), in the original submission order,
  optionally a seeded sample, at the run's concurrency;
* :func:`collect_options` makes the collection options (``companion_of`` set).

Rids: a replay keeps each request's rid (``rid_suffix=""``, the default) —
the companion runs on its own server, so nothing collides, the emulator's
lockstep routing and batching see the same keys, and both runs' logs read
alike.  A suffix (``--rid-suffix .cap``) is for a cap-accept server that sees
the same rids from elsewhere; ``companion_pairing`` maps them back.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx
import numpy as np

from collectors.sglang.driver import DriveSpec, PlannedRequest
from collectors.sglang.replay_inputs import InputSet, ReplayInput, from_requests, merge, read_prompts, read_request_log
from collectors.sglang.polling import first_server_info
from collectors.sglang.session import CollectOptions

MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"
CAP_ACCEPT = "cap-accept"
_INDEX = re.compile(r"(\d+)$")


class CompanionError(RuntimeError):
    """The replay cannot start; the message says how to fix it."""


# -- the server ----------------------------------------------------------------

@dataclass(frozen=True)
class ServerCheck:
    url: str
    mode: str  # '' when the server reports none
    mode_from: str  # dspark_info_record | env | ''
    gamma: int
    dp_size: int
    records_held: int
    model_path: Optional[str] = None
    random_seed: Optional[int] = None


def parse_server_info(url: str, body: bytes) -> ServerCheck:
    """What the companion needs from a ``/server_info`` body (pure)."""
    info, args = first_server_info(url, body, CompanionError, hint=f", and {MODE_ENV}={CAP_ACCEPT} for a companion")
    ranks = [r for r in info.ranks if r.gamma or r.mode]
    env = args.get("env") if isinstance(args.get("env"), dict) else {}
    payload_mode = next((r.mode for r in ranks if r.mode), "")
    mode, mode_from = (payload_mode, "dspark_info_record") if payload_mode else (
        (str(env[MODE_ENV]), "env") if env.get(MODE_ENV) else ("", ""))
    seed = args.get("random_seed")
    model = args.get("model_path")
    return ServerCheck(url=url, mode=mode, mode_from=mode_from, gamma=ranks[0].gamma if ranks else 0,
                       dp_size=len(info.ranks),
                       records_held=sum(len(r.records) + len(r.dead) for r in info.ranks),
                       model_path=model if isinstance(model, str) else None,
                       random_seed=seed if isinstance(seed, int) else None)


def check_server(url: str, *, timeout: float = 30.0) -> ServerCheck:
    """``GET /server_info`` of ``url``; :class:`CompanionError` if it cannot be read."""
    try:
        resp = httpx.get(f"{url}/server_info", timeout=timeout)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise CompanionError(f"cannot read {url}/server_info: {exc}. Is the cap-accept server up "
                             "(GET /health) and is --url right?") from exc
    return parse_server_info(url, resp.content)


def require_cap_accept(check: ServerCheck, *, gamma: Optional[int] = None) -> None:
    """Refuse a server that is not in cap-accept mode, or whose block size differs from the run's."""
    if check.mode != CAP_ACCEPT:
        seen = f"mode {check.mode!r} ({check.mode_from})" if check.mode else "no verify mode"
        raise CompanionError(
            f"{check.url} reports {seen}, not {CAP_ACCEPT!r}: a companion replays on a server launched "
            f"with {MODE_ENV}={CAP_ACCEPT} (same model, block size and server arguments as the original), "
            f"e.g. {MODE_ENV}={CAP_ACCEPT} python -m sglang.launch_server ... --port 30001; "
            f"then pass --url http://HOST:30001")
    if gamma and check.gamma and gamma != check.gamma:
        raise CompanionError(
            f"{check.url} drafts blocks of {check.gamma} tokens but the run drafted {gamma} "
            "(speculative_dspark_block_size): launch the cap-accept server with the original's block size")


def clear_records(url: str, *, timeout: float = 30.0) -> bool:
    """Empty the server's record deque so that earlier traffic does not join the companion run."""
    try:
        resp = httpx.post(f"{url}/set_internal_state", json={"server_args": {"dspark_clear_info_records": True}},
                          timeout=timeout)
        resp.raise_for_status()
        body = resp.json()
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(body, dict) and bool(body.get("updated"))


# -- the plan --------------------------------------------------------------------

@dataclass
class ReplayPlan:
    """What a companion sends, in order, and what it knows about the original run."""

    of_run: str
    requests: list[PlannedRequest]
    inputs: dict[str, ReplayInput]  # selected requests' inputs, by original rid
    no_inputs: list[str]  # the run's rids without a known prompt
    run_requests: int
    concurrency: int
    concurrency_source: str
    sample: str
    rid_suffix: str
    gamma: Optional[int]
    run_labels: dict[str, str] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sampling_without_seed: int = 0

    @property
    def companion_rids(self) -> dict[str, str]:
        return {rid: rid + self.rid_suffix for rid in self.inputs}


def _run_row(store, run: str) -> dict[str, Any]:
    rows = store.read("runs", run).to_pylist()
    return rows[-1] if rows else {}


def _labels(run: dict[str, Any]) -> dict[str, str]:
    """``runs.labels`` as a dict (Arrow reads a map as a list of pairs)."""
    labels = run.get("labels") or {}
    pairs = labels.items() if isinstance(labels, dict) else labels
    return {str(k): str(v) for k, v in pairs}


def _step_rids(con, run: str) -> dict[str, int]:
    """``rid -> first forward_ct`` of the run's request-steps."""
    return dict(con.execute("SELECT rid, min(forward_ct) FROM step_reqs WHERE run_id = $run AND rid IS NOT NULL "
                            "GROUP BY rid", {"run": run}).fetchall())


def _steps_concurrency(con, run: str) -> Optional[int]:
    """Requests in flight, from the steps: the sum over DP ranks of the median running requests."""
    rows = con.execute(
        "SELECT dp_rank, median(CASE WHEN num_running_reqs >= 0 THEN num_running_reqs ELSE bs END) FROM steps "
        "WHERE run_id = $run AND (num_running_reqs >= 0 OR bs >= 0) GROUP BY dp_rank", {"run": run}).fetchall()
    total = sum(float(m) for _, m in rows if m is not None)
    return max(1, int(round(total))) if rows else None


def resolve_concurrency(requests_concurrency: list, labels: dict, steps_median: Optional[int],
                        given: Optional[int] = None) -> tuple[int, str]:
    """The replay's concurrency and where it came from (``--concurrency`` first, then the run's record).

    >>> resolve_concurrency([8, 8, None], {}, 5)
    (8, 'requests.concurrency')
    >>> resolve_concurrency([], {"concurrency": "24"}, 5, given=None)
    (24, 'runs.labels')
    """
    if given is not None:
        if given < 1:
            raise CompanionError(f"--concurrency must be >= 1, got {given}")
        return given, "--concurrency"
    known = Counter(int(c) for c in requests_concurrency if c is not None and int(c) > 0)
    if known:
        return known.most_common(1)[0][0], "requests.concurrency"
    label = (labels or {}).get("concurrency")
    if label is not None and str(label).isdigit() and int(label) > 0:
        return int(label), "runs.labels"
    if steps_median:
        return steps_median, "steps (median running requests)"
    raise CompanionError("the run records no concurrency (requests.concurrency, runs.labels, steps): "
                         "pass --concurrency C, the number of requests the original had in flight")


def _order_key(rid: str, entry: ReplayInput, first_fct: dict[str, int]) -> tuple:
    m = _INDEX.search(rid)
    return (entry.order is None, entry.order or 0.0, first_fct.get(rid, np.iinfo(np.int64).max),
            int(m.group(1)) if m else -1, rid)


def _planned(index: int, entry: ReplayInput, rid: str) -> PlannedRequest:
    """The request to send for ``entry`` under ``rid``; unknown sampling values stay the server's defaults."""
    sp = dict(entry.sampling_params)
    temperature, max_new, seed = (sp.pop(n, None) for n in ("temperature", "max_new_tokens", "sampling_seed"))
    return PlannedRequest(index, rid, entry.workload, entry.text,
                          float(temperature) if temperature is not None else None,
                          int(max_new) if max_new is not None else None, int(seed) if seed is not None else None,
                          input_ids=entry.input_ids, sampling_params=sp or None, api=entry.api)


def select(rids: list[str], *, sample: Optional[int] = None, fraction: Optional[float] = None,
           seed: int = 0) -> tuple[list[str], str]:
    """A seeded uniform sample of ``rids`` in their order, and how it was drawn.

    >>> select(["a", "b", "c", "d"], sample=2, seed=1)[1]
    '2 of 4 (seed 1)'
    """
    if sample is not None and fraction is not None:
        raise CompanionError("give --sample N or --fraction F, not both")
    total = len(rids)
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise CompanionError(f"--fraction must be in (0, 1], got {fraction}")
        sample = max(1, int(round(fraction * total))) if total else 0
    if sample is None or sample >= total:
        return list(rids), "all"
    if sample < 1:
        raise CompanionError(f"--sample must be >= 1, got {sample}")
    picked = np.sort(np.random.default_rng(seed).choice(total, size=sample, replace=False))
    return [rids[i] for i in picked], f"{sample} of {total} (seed {seed})"


def plan_replay(store, con, of_run: str, *, log_requests: Optional[str | Path] = None,
                prompts: Optional[str | Path] = None, sample: Optional[int] = None,
                fraction: Optional[float] = None, seed: int = 0, concurrency: Optional[int] = None,
                rid_suffix: str = "", workload=None) -> ReplayPlan:
    """The requests of ``of_run`` to replay, in their original order.

    Inputs: the run's stored ``requests`` rows, overridden by ``log_requests``
    (an SGLang JSON request log) and then ``prompts`` (a JSONL) where given.
    Requests the run knows (``requests`` rows and ``step_reqs`` rids) without
    any input are listed in ``no_inputs``.  ``con`` is a
    :func:`dspark_obs.sql.connect` connection over the same store.
    """
    if rid_suffix and not re.fullmatch(r"[A-Za-z0-9._:~+-]+", rid_suffix):
        raise CompanionError(f"--rid-suffix {rid_suffix!r}: use letters, digits and . _ : ~ + -")
    run = _run_row(store, of_run)
    requests = store.read("requests", of_run)
    first_fct = _step_rids(con, of_run)
    if not run and requests.num_rows == 0 and not first_fct:
        known = ", ".join(sorted(set(store.runs()))[:20]) or "none"
        raise CompanionError(f"run {of_run!r} is not in {store.root}: no runs, requests or step_reqs rows "
                             f"(runs there: {known})")
    run_rids = set(first_fct) | {r for r in requests.column("rid").to_pylist() if r is not None}
    if not run_rids:
        raise CompanionError(f"run {of_run!r} has no request ids (step_reqs.rid and requests are empty): "
                             "nothing to replay or pair")
    sources: list[InputSet] = []
    if log_requests is not None:
        sources.append(read_request_log(log_requests, workload=workload))
    if prompts is not None:
        sources.append(read_prompts(prompts, workload=workload))
    merged = merge(from_requests(requests), sources)
    problems = [p for s in sources for p in s.problems]
    notes = []
    outside = sum(1 for s in sources for rid in s.inputs if rid not in run_rids)
    if outside:
        notes.append(f"{outside} input entries name rids the run does not know: ignored")
    usable = {rid: e for rid, e in merged.items() if rid in run_rids}
    no_inputs = sorted(run_rids - set(usable))
    if not usable:
        hint = ("the run stored no prompts (--redact-text, or attach mode): give --log-requests FILE "
                "(SGLang --log-requests --log-requests-format json --log-requests-level 3) or --prompts FILE")
        raise CompanionError(f"none of the {len(run_rids)} requests of run {of_run!r} has a known prompt: {hint}")
    ordered = sorted(usable, key=lambda rid: _order_key(rid, usable[rid], first_fct))
    chosen, sample_desc = select(ordered, sample=sample, fraction=fraction, seed=seed)
    labels = _labels(run)
    conc_values = requests.column("concurrency").to_pylist() if "concurrency" in requests.column_names else []
    steps_median = None
    if not any(c for c in conc_values) and "concurrency" not in labels and concurrency is None:
        steps_median = _steps_concurrency(con, of_run)
    conc, conc_source = resolve_concurrency(conc_values, labels, steps_median, concurrency)
    planned = [_planned(i, usable[rid], rid + rid_suffix) for i, rid in enumerate(chosen)]
    without_seed = sum(1 for r in planned if (r.temperature is None or r.temperature > 0) and r.sampling_seed is None)
    if without_seed:
        notes.append(f"{without_seed} sampling requests carry no sampling_seed: their replays may diverge "
                     "(the collector's driver sends one; have other clients set sampling_params.sampling_seed)")
    return ReplayPlan(
        of_run=of_run, requests=planned, inputs={rid: usable[rid] for rid in chosen}, no_inputs=no_inputs,
        run_requests=len(run_rids), concurrency=conc, concurrency_source=conc_source, sample=sample_desc,
        rid_suffix=rid_suffix, gamma=run.get("gamma"), run_labels=labels, problems=problems, notes=notes,
        sampling_without_seed=without_seed)


def collect_options(plan: ReplayPlan, *, url: str, run_id: str, labels: Optional[dict[str, str]] = None,
                    poll_interval: float = 1.0, flush_interval: float = 5.0, top_logprobs: int = 5,
                    redact_text: bool = False, request_timeout: float = 600.0) -> CollectOptions:
    """Collection options for the replay: the planned requests at the plan's concurrency, ``companion_of`` set."""
    apis = Counter(r.api or "generate" for r in plan.requests)
    workloads = sorted({r.workload for r in plan.requests if r.workload}) or ["replay"]
    spec = DriveSpec(workloads, len(plan.requests), concurrency=plan.concurrency, top_logprobs=top_logprobs,
                     redact_text=redact_text, api=apis.most_common(1)[0][0] if apis else "generate")
    temps = sorted({r.temperature for r in plan.requests if r.temperature is not None})
    run_labels = {
        "workloads": plan.run_labels.get("workloads", ",".join(workloads)),
        "temperature": plan.run_labels.get("temperature", ",".join(f"{t:g}" for t in temps) or "default"),
        "concurrency": str(plan.concurrency),
        "concurrency_source": plan.concurrency_source,
        "sample": plan.sample,
        "rid_suffix": plan.rid_suffix,
        **(labels or {}),
    }
    return CollectOptions(url=url, run_id=run_id, poll_interval=poll_interval, flush_interval=flush_interval,
                          drive=spec, planned=plan.requests, labels=run_labels, companion_of=plan.of_run,
                          redact_text=redact_text, request_timeout=request_timeout)
