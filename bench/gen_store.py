"""A fast generator of large, realistic stores for the benchmarks.

The emulator's model, vectorised over thousands of requests at once instead of
served step by step: each request gets a workload profile (``emulator.workloads``),
a sampling temperature, an output length, a prompt length and its committed
tokens; then every request advances one decode step per iteration, all of them in
numpy arrays:

* the drafter's true conditional acceptance per position is
  ``sigmoid(profile logits + block noise + position noise)`` and the head reports it
  through the emulator's default miscalibration (``DEFAULT_HEAD_TEMPERATURE``),
  rounded to 4 decimals as the engine does; survival is its running product, recorded rounded to
  4 decimals as SGLang's dumper records it (the window is planned on the unrounded one);
* a full block would accept the leading drafts that pass (``emu_block_accept``);
* the window is what DSpark's budget gives on average: the positions whose
  survival clears a per-step threshold (a stand-in for the global top-k);
* the committed tokens, drafts and bonus agree with the ``tokens`` table, so the
  estimators walk censored tails against real evidence, and the truth is known.

``continuous batching``: requests run on ``dp_size * batch`` slots, one after the
other per slot; all slots of a rank step together, so ``forward_ct`` and the
``steps`` table (bs per step) come out like a real server's.

    python -m bench.gen_store OUT --rows 1000000 [--seed 0]

writes runs, steps, step_reqs, requests and tokens of one compact run (``bench``):
about 120k request-steps per second with their ~4 tokens each (10M in ~80 s on one core).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dspark_obs.acceptance import expected_given_window  # noqa: E402
from dspark_obs.emulator.engine import DEFAULT_HEAD_TEMPERATURE  # noqa: E402
from dspark_obs.emulator.workloads import PROFILES  # noqa: E402
from dspark_obs.store import Store  # noqa: E402

RUN_ID = "bench"
WORKLOADS = ("gsm8k", "arena-hard", "poetry")
TOP_K = 5
EOS = 2
_THRESHOLD = 0.42  # survival a position needs to be verified: mean windows near the write-up's


def _block(rng: np.random.Generator, first: int, n_req: int, gamma: int) -> dict:
    """Requests ``first .. first + n_req - 1``: their step rows, tokens and request rows."""
    wl = (first + np.arange(n_req)) % len(WORKLOADS)
    profs = [PROFILES[w] for w in WORKLOADS]
    pick = lambda f: np.array([f(p) for p in profs])[wl]  # noqa: E731
    temperature = np.where(rng.random(n_req) < 0.5, 0.0, 0.7).astype(np.float32)
    natural = np.maximum(8, rng.normal(pick(lambda p: p.output_len_mean), pick(lambda p: p.output_len_sd))).astype(np.int64)
    lo, hi = pick(lambda p: p.prompt_len_range[0]), pick(lambda p: p.prompt_len_range[1])
    prompt = (lo + rng.random(n_req) * (hi - lo)).astype(np.int64)
    width = int(natural.max()) + gamma + 2
    tokens = rng.integers(100, 32000, size=(n_req, width), dtype=np.int64)
    tokens[np.arange(n_req), natural - 1] = EOS
    acc_logits = np.stack([p.acceptance_logits(gamma) for p in profs])[wl]
    block_sigma, pos_sigma = pick(lambda p: p.block_sigma), pick(lambda p: p.position_sigma)
    head_t = np.asarray(DEFAULT_HEAD_TEMPERATURE[:gamma] + (DEFAULT_HEAD_TEMPERATURE[-1],) * max(0, gamma - 8))[:gamma]

    pos = np.ones(n_req, dtype=np.int64)  # output position of the next anchor+1 (0 came from prefill)
    step_of = np.zeros(n_req, dtype=np.int64)
    out: dict[str, list] = {k: [] for k in ("req", "step", "prefix", "window", "correct", "bonus", "drafts",
                                            "conf", "surv", "block", "expected")}
    k = np.arange(gamma)
    active = np.flatnonzero(pos < natural)
    while active.size:
        n = active.size
        logit = acc_logits[active] + rng.normal(0, block_sigma[active])[:, None] \
            + rng.normal(0, 1, (n, gamma)) * pos_sigma[active, None]
        c_true = 1.0 / (1.0 + np.exp(-logit))
        conf = np.round(1.0 / (1.0 + np.exp(-logit / head_t)), 4).astype(np.float32)
        surv = np.cumprod(conf.astype(np.float64), axis=1).astype(np.float32)
        p = pos[active]
        alive = (p[:, None] + k) < natural[active, None]
        passed = (rng.random((n, gamma)) < c_true) & alive
        block = np.cumprod(passed, axis=1).sum(axis=1)
        window = np.clip((surv >= _THRESHOLD).sum(axis=1), 1, gamma)
        correct = np.minimum(block, window)
        expected = expected_given_window(np.where(alive, c_true, 0.0), window, correct)
        realised = tokens[active[:, None], p[:, None] + k]
        other = (realised + 1 + rng.integers(0, 1000, (n, gamma))) % 31900 + 100
        drafts = np.where(k < block[:, None], realised, other)
        out["req"].append(active)
        out["step"].append(step_of[active])
        out["prefix"].append(prompt[active] + p - 1)
        out["window"].append(window)
        out["correct"].append(correct)
        out["bonus"].append(tokens[active, p + correct])
        out["drafts"].append(drafts)
        out["conf"].append(conf)
        out["surv"].append(surv)
        out["block"].append(block)
        out["expected"].append(expected)
        pos[active] = p + correct + 1
        step_of[active] += 1
        active = active[pos[active] < natural[active]]
    cat = {key: np.concatenate(v) for key, v in out.items()}
    cat["n_steps"] = step_of
    cat.update(natural=natural, prompt=prompt, temperature=temperature, workload=wl, tokens=tokens)
    return cat


def _batch_positions(rank: np.ndarray, fct: np.ndarray, per_rank_bs: list[np.ndarray]) -> np.ndarray:
    """Each row's position in its step's batch: after the step's rows of earlier writes (``per_rank_bs``,
    rows so far per rank and forward_ct), then in the order of this write."""
    out = np.empty(rank.size, dtype=np.int32)
    for r, before in enumerate(per_rank_bs):
        mine = np.flatnonzero(rank == r)
        order = mine[np.argsort(fct[mine], kind="stable")]
        f = fct[order]
        within = np.arange(f.size) - np.searchsorted(f, f, side="left")
        prior = np.where(f < before.size, before[np.minimum(f, max(before.size - 1, 0))], 0) if before.size else 0
        out[order] = prior + within
    return out


def _lists(values: np.ndarray, type_: pa.DataType) -> pa.ListArray:
    n, width = values.shape
    return pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int32)),
                                    pa.array(values.ravel(), type=type_))


def generate(root: str | Path, *, rows: int, gamma: int = 6, seed: int = 0, dp_size: int = 4, batch: int = 256,
             block_requests: int = 20_000) -> dict:
    """Write a compact run of about ``rows`` request-steps into ``root``; returns what was written."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    store = Store(root)
    for table in ("runs", "steps", "step_reqs", "requests", "tokens"):
        store.drop_run(table, RUN_ID)
    slots = dp_size * batch
    slot_clock = np.zeros(slots, dtype=np.int64)  # next free forward_ct of each slot
    per_rank_bs: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in range(dp_size)]
    written = first = 0
    n_tokens = 0
    block_requests = max(64, min(block_requests, rows // 40))
    while written < rows:
        b = _block(rng, first, block_requests, gamma)
        n_req = block_requests
        order = np.lexsort((b["step"], b["req"]))
        keep = order
        cum = np.cumsum(b["n_steps"])
        if written + len(order) > rows:  # only whole requests, as many as fit
            n_req = max(1, int(np.searchsorted(cum, rows - written, side="right")))
            keep = order[b["req"][order] < n_req]
        req, step = b["req"][keep], b["step"][keep]
        gid = first + np.arange(n_req)
        slot = gid % slots
        # Requests on a slot run one after the other; a prefill step sits between them.
        start = np.empty(n_req, dtype=np.int64)
        for s_idx in np.unique(slot):
            mine = np.flatnonzero(slot == s_idx)
            lengths = b["n_steps"][mine] + 1
            start[mine] = slot_clock[s_idx] + np.concatenate(([0], np.cumsum(lengths)[:-1])) + 1
            slot_clock[s_idx] += lengths.sum()
        rank = (slot // batch).astype(np.int16)
        fct = start[req] + step + 1
        rids = pa.array([f"{WORKLOADS[w]}-{g:08d}" for w, g in zip(b["workload"][:n_req], gid)])
        rid_col = rids.take(pa.array(req))
        store.write("step_reqs", RUN_ID, pa.table({
            "dp_rank": pa.array(rank[req]), "forward_ct": pa.array(fct), "segment": pa.array(np.zeros(len(req), np.int32)),
            "rid": rid_col, "req_pool_index": pa.array((slot[req] % batch).astype(np.int32)),
            "batch_index": pa.array(_batch_positions(rank[req], fct, per_rank_bs)),
            "prefix_len": pa.array(b["prefix"][keep].astype(np.int32)),
            "verify_len": pa.array((b["window"][keep] + 1).astype(np.int16)),
            "acc_len": pa.array((b["correct"][keep] + 1).astype(np.int16)),
            "correct_drafts": pa.array(b["correct"][keep].astype(np.int16)),
            "cap_trim": pa.array(np.zeros(len(req), np.int16)),
            "bonus_token": pa.array(b["bonus"][keep].astype(np.int32)),
            "draft_tokens": _lists(b["drafts"][keep].astype(np.int32), pa.int32()),
            "confidence": _lists(b["conf"][keep], pa.float32()),
            "survival": _lists(np.round(b["surv"][keep].astype(np.float64), 4).astype(np.float32), pa.float32()),
            "emu_block_accept": pa.array(b["block"][keep].astype(np.int16)),
            "emu_expected_given_window": pa.array(np.round(b["expected"][keep], 6).astype(np.float32)),
        }))
        for r in range(dp_size):
            f = fct[rank[req] == r]
            if f.size:
                counts = np.bincount(f)
                if counts.size > per_rank_bs[r].size:
                    counts[: per_rank_bs[r].size] += per_rank_bs[r]
                    per_rank_bs[r] = counts
                else:
                    per_rank_bs[r][: counts.size] += counts
        natural = b["natural"][:n_req]
        store.write("requests", RUN_ID, pa.table({
            "rid": rids, "workload": pa.array([WORKLOADS[w] for w in b["workload"][:n_req]]),
            "api": pa.array(["generate"] * n_req), "prompt_tokens": pa.array(b["prompt"][:n_req].astype(np.int32)),
            "completion_tokens": pa.array(natural.astype(np.int32)), "cached_tokens": pa.array(np.zeros(n_req, np.int32)),
            "finish_reason": pa.array(["stop"] * n_req), "temperature": pa.array(b["temperature"][:n_req]),
            "max_new_tokens": pa.array(np.full(n_req, 1024, np.int32)),
            "sampling_seed": pa.array(gid.astype(np.int64)),
            "spec_verify_ct": pa.array(b["n_steps"][:n_req].astype(np.int32)),
        }))
        # tokens: every committed output token with the target's logprob and top-5
        lens = natural
        tok_req = np.repeat(np.arange(n_req), lens)
        tok_pos = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
        ids = b["tokens"][tok_req, tok_pos]
        logits = np.sort(rng.normal(0, 1.5, (ids.size, TOP_K)), axis=1)[:, ::-1]
        logits[:, 0] += 2.0
        top_lp = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True) + 0.05)).astype(np.float32)
        top_ids = (ids[:, None] + 7 * np.arange(TOP_K)) % 31900 + 100
        top_ids[:, 0] = ids
        store.write("tokens", RUN_ID, pa.table({
            "rid": rids.take(pa.array(tok_req)), "pos": pa.array(tok_pos.astype(np.int32)),
            "token_id": pa.array(ids.astype(np.int32)), "logprob": pa.array(top_lp[:, 0]),
            "top_ids": _lists(top_ids.astype(np.int32), pa.int32()), "top_logprobs": _lists(top_lp, pa.float32()),
        }))
        n_tokens += ids.size
        written += len(req)
        first += n_req
    for r in range(dp_size):
        fcts = np.flatnonzero(per_rank_bs[r])
        bs = per_rank_bs[r][fcts]
        store.write("steps", RUN_ID, pa.table({
            "dp_rank": pa.array(np.full(fcts.size, r, np.int16)), "forward_ct": pa.array(fcts.astype(np.int64)),
            "segment": pa.array(np.zeros(fcts.size, np.int32)), "bs": pa.array(bs.astype(np.int32)),
            "num_running_reqs": pa.array(bs.astype(np.int32)), "mode": pa.array(["compact"] * fcts.size),
            "budget": pa.array((bs * 3).astype(np.int32)), "lag_steps": pa.array(np.full(fcts.size, 2, np.int32)),
            "num_verify_tokens": pa.array((bs * 4).astype(np.int32)),
            "verify_tokens_local": pa.array((bs * 4).astype(np.int32)),
            "verify_tokens_dp_synced": pa.array(np.full(fcts.size, -1, np.int32)),
            "verify_tokens_graph_key": pa.array((bs * 4).astype(np.int32)),
            "step_gpu_ms": pa.array(20.0 + 0.05 * bs + rng.normal(0, 0.5, fcts.size)),
        }))
    now = dt.datetime.now(dt.timezone.utc)
    store.upsert_run(RUN_ID, started_at=now, ended_at=now, source="emulator", mode="compact", gamma=gamma,
                     dp_size=dp_size, labels={"generator": "bench.gen_store", "seed": str(seed)}, seed=seed,
                     end_reason="completed")
    return {"rows": written, "requests": first, "tokens": n_tokens, "seconds": time.perf_counter() - t0,
            "run_id": RUN_ID, "root": str(root)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="data root to write (the run 'bench' is replaced)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="request-step rows (step_reqs)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    info = generate(args.out, rows=args.rows, seed=args.seed)
    print(f"{info['rows']:,} request-steps, {info['requests']:,} requests, {info['tokens']:,} tokens "
          f"in {info['seconds']:.1f} s -> {info['root']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
