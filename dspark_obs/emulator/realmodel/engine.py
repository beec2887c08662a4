"""Continuous-batching DSpark engine over a real model (SmolLM2-135M and its layer-dropped drafter).

The same interface, records, endpoints and bookkeeping as the stochastic
``dspark_obs.emulator.engine.Engine`` (it subclasses it: submission, stepping
thread, lockstep refill, dump/clear, gauges), with real batched forwards:

* **prefill** packs the admitted prompts into one ragged forward of the target
  and the drafter; the first output token comes from it (``forward_ct``
  advances, the dumper sees a non-decode step), as in SGLang.
* **decode** runs the whole block for every request (anchor + gamma drafts,
  one token per request per forward), drafting autoregressively: at block
  position ``k`` the target's ``p_k`` and the drafter's ``q_k`` on the draft
  prefix give the realised token and the draft through :mod:`.coupling`, so
  the committed token at a position is the same in every mode.  Budget and
  windows come from ``dspark_obs.scheduler``; the mode only decides what is
  committed and recorded.  Running the full block in every mode is what lets
  the records carry the truth (``emu_block_accept``,
  ``emu_expected_given_window``), and keeps compact and cap-accept bitwise alike.

Time is measured: the rank's clock is wall time, ``step_gpu_ms`` the decode
step's forwards, ``draft_gpu_ms`` the drafter's own layers and head.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from dspark_obs.acceptance import expected_given_window
from dspark_obs.emulator import engine as base
from dspark_obs.emulator.realmodel import coupling
from dspark_obs.emulator.realmodel.pair import DEFAULT_DROP, Caches, ModelPair
from dspark_obs.scheduler import survival_from_confidence

MODEL_NAMES = ("smollm2-135m",)


@dataclass
class RealModelConfig(base.EngineConfig):
    model: str = "smollm2-135m"
    drop_layers: tuple[int, ...] = DEFAULT_DROP
    # (a, b): the head reports sigmoid(a * logit(q) + b) instead of q (a miscalibrated head).
    head_transform: Optional[tuple[float, float]] = None
    cache_dir: Optional[str] = None
    # torch intra-op threads. One by default: on 2 shared cores, measured at bs 16, two threads
    # made a decode step 10-20x slower whenever other work ran (barriers on every small op),
    # one thread stays near 1.5 s. DSPARK_OBS_TORCH_THREADS=2 for an otherwise idle machine.
    threads: int = field(default_factory=lambda: int(os.environ.get("DSPARK_OBS_TORCH_THREADS", "1")))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model not in MODEL_NAMES:
            raise ValueError(f"model {self.model!r} is not one of {', '.join(MODEL_NAMES)}")
        if self.dp_size != 1:
            raise ValueError(f"the real-model emulator serves one DP rank; got dp_size {self.dp_size}")
        if not 1 <= self.threads <= 2:
            raise ValueError(f"threads must be 1 or 2 (the machine has 2 cores), got {self.threads}")
        if self.estimate_path:
            raise ValueError("the real-model emulator does not write the block-accept estimator JSONL; "
                             "unset SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH")


@dataclass
class _Running(base.SpecCounters):
    req: base.GenerateRequest
    input_ids: list[int]
    sample_key: int
    caches: Optional[Caches]
    pool_index: int
    submitted_clock: float
    future: concurrent.futures.Future
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[tuple[list[int], list[float]]] = field(default_factory=list)
    finish_reason: dict[str, Any] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.req.temperature <= 0


class _Block:
    """One decode step's block for the batch: drafts, realised tokens and per-position truth."""

    def __init__(self, bs: int, gamma: int) -> None:
        self.drafts = np.zeros((bs, gamma), dtype=np.int64)
        self.q_draft = np.zeros((bs, gamma))  # drafter's probability of its draft (request temperature)
        self.accept_prob = np.zeros((bs, gamma))  # a_k on the draft prefix
        self.realised: list[list[int]] = [[] for _ in range(bs)]  # x_1.. while on the realised trajectory
        self.logprob: list[list[float]] = [[] for _ in range(bs)]
        self.tops: list[list[tuple[list[int], list[float]]]] = [[] for _ in range(bs)]
        self.block_accept = np.zeros(bs, dtype=np.int64)


class _RealRank(base.Rank):
    """One rank over the real model: the stochastic rank's queues and dumper, real forwards."""

    def __init__(self, engine: "RealModelEngine", index: int) -> None:
        super().__init__(engine, index)
        self.pair = engine.pair
        self.clock_base = time.perf_counter()
        self.clock = 0.0

    def _tick(self) -> None:
        self.clock = time.perf_counter() - self.clock_base

    def _record_token(self, r: _Running, logp_row: torch.Tensor, token: int) -> None:
        r.logprobs.append(float(logp_row[token]))
        k = r.req.top_logprobs_num if r.req.return_logprob else 0
        if k > 0:
            vals, ids = torch.topk(logp_row, k)
            r.tops.append((ids.tolist(), vals.tolist()))

    # -- prefill -----------------------------------------------------------
    def prefill(self) -> bool:
        cfg, eng = self.engine.cfg, self.engine
        admitted: list[_Running] = []
        while self.waiting and self.free_slots:
            admitted.append(self.waiting.popleft())
        if not admitted:
            return False
        if cfg.lockstep_concurrency:
            admitted.sort(key=lambda r: r.req.rid)
        for r in admitted:
            r.pool_index = self.free_slots.pop()
            r.caches = self.pair.new_caches(len(r.input_ids) + r.req.max_new_tokens + cfg.gamma + 2)
        self.forward_ct += 1
        self.dumper.note_non_decode_step()
        with torch.inference_mode():
            target, _, _ = self.pair.forward([r.input_ids for r in admitted], [r.caches for r in admitted],
                                             drafter=False, last_only=True)
            temps = torch.tensor([r.req.temperature if not r.greedy else 1.0 for r in admitted], dtype=torch.float64)
            logp = coupling.log_probs(target, temps)
            u = coupling.uniforms(cfg.seed, [r.sample_key for r in admitted], [0] * len(admitted), "target")
            sampled = coupling.inverse_cdf(logp.exp(), u)
            greedy = logp.argmax(-1)
            for i, r in enumerate(admitted):
                x = int(greedy[i] if r.greedy else sampled[i])
                r.output.append(x)
                self._record_token(r, logp[i], x)
        self._tick()
        for r in admitted:
            if self._finished(r):
                eng.finish_request(self, r)
            else:
                self.running.append(r)
        return True

    def _finished(self, r: _Running) -> bool:
        """Trim the output at EOS or ``max_new_tokens``; True when the request is done."""
        for i, tok in enumerate(r.output):
            if tok in self.pair.eos_ids:
                del r.output[i + 1:], r.logprobs[i + 1:], r.tops[i + 1:]
                r.finish_reason = {"type": "stop", "matched": tok}
                return True
        if len(r.output) >= r.req.max_new_tokens:
            n = r.req.max_new_tokens
            del r.output[n:], r.logprobs[n:], r.tops[n:]
            r.finish_reason = {"type": "length", "length": n}
            return True
        return False

    # -- the block -------------------------------------------------------------
    def _draft_block(self, batch: list[_Running]) -> tuple[_Block, float]:
        """Run anchor + gamma drafts through target and drafter; couple drafts to realised tokens.

        Long: one batched pass through target and drafter per draft position, keeping the tensors on the
        stack; split, the caches and logits would pass through every piece.
        """
        cfg = self.engine.cfg
        gamma, bs, seed = cfg.gamma, len(batch), cfg.seed
        blk = _Block(bs, gamma)
        keys = [r.sample_key for r in batch]
        n0 = [len(r.output) for r in batch]  # output position of draft 1
        greedy = torch.tensor([r.greedy for r in batch])
        temps = torch.tensor([1.0 if r.greedy else r.req.temperature for r in batch], dtype=torch.float64)
        on_track = np.ones(bs, dtype=bool)
        alive = np.ones(bs, dtype=bool)
        feed = [[r.output[-1]] for r in batch]
        draft_s = 0.0
        rows_all = torch.arange(bs)
        for k in range(gamma + 1):
            last = k == gamma
            idx = np.flatnonzero(on_track) if last else np.arange(bs)
            if idx.size == 0:
                break
            target, draft, ds = self.pair.forward([feed[i] for i in idx], [batch[i].caches for i in idx],
                                                  drafter=not last)
            draft_s += ds
            pos = [n0[i] + k for i in idx]
            sel = torch.as_tensor(idx)
            logp = coupling.log_probs(target, temps[sel])
            p = logp.exp()
            x_greedy = logp.argmax(-1)
            x_sampled = coupling.inverse_cdf(p, coupling.uniforms(seed, [keys[i] for i in idx], pos, "target"))
            x = torch.where(greedy[sel], x_greedy, x_sampled)
            if not last:
                logq = coupling.log_probs(draft, temps)
                q = logq.exp()
                d_on = coupling.couple(p, q, x, coupling.uniforms(seed, keys, pos, "couple"),
                                       coupling.uniforms(seed, keys, pos, "residual"))
                d_off = coupling.inverse_cdf(q, coupling.uniforms(seed, keys, pos, "draft"))
                d_sampled = torch.where(torch.as_tensor(on_track), d_on, d_off)
                d = torch.where(greedy, logq.argmax(-1), d_sampled)
                qd, pd = q[rows_all, d], p[rows_all, d]
                a = torch.where(greedy, (d == x_greedy).to(torch.float64),
                                torch.clamp(pd / qd.clamp(min=1e-300), max=1.0))
                blk.drafts[:, k] = d.numpy()
                blk.q_draft[:, k] = qd.numpy()
                blk.accept_prob[:, k] = np.where(alive, a.numpy(), 0.0)
            x_list = x.tolist()
            for j, i in enumerate(idx.tolist()):
                if not on_track[i]:
                    continue
                r, xi = batch[i], x_list[j]
                blk.realised[i].append(xi)
                blk.logprob[i].append(float(logp[j, xi]))
                tk = r.req.top_logprobs_num if r.req.return_logprob else 0
                if tk > 0:
                    vals, ids = torch.topk(logp[j], tk)
                    blk.tops[i].append((ids.tolist(), vals.tolist()))
                if not last:
                    # A draft is accepted while the realised trajectory is alive (no EOS before it);
                    # after an accepted EOS the next position is the bonus and ends the block.
                    if alive[i] and int(blk.drafts[i, k]) == xi:
                        blk.block_accept[i] += 1
                    else:
                        on_track[i] = False
                    if xi in self.pair.eos_ids:
                        alive[i] = False
            if not last:
                for i in range(bs):
                    feed[i] = [int(blk.drafts[i, k])]
        return blk, draft_s

    # -- decode ------------------------------------------------------------
    def decode(self) -> bool:
        """One decode step of the real-model rank, in the order of the stochastic engine's (draft, plan, verify, commit, record).

        Long: as the stochastic engine's ``decode``, its phases share the step's arrays and tensors.
        """
        if not self.running:
            return False
        eng, cfg = self.engine, self.engine.cfg
        gamma, batch = cfg.gamma, self.running
        bs = len(batch)
        self.forward_ct += 1
        t_start = time.perf_counter()
        starts = [r.caches.length for r in batch]
        with torch.inference_mode():
            blk, draft_s = self._draft_block(batch)
        sts = np.asarray(cfg.sts_temperatures[:gamma]) if cfg.sts_temperatures is not None else None
        raw_conf = coupling.head_confidence(blk.q_draft, cfg.head_transform, sts)
        conf = np.round(raw_conf, 4).astype(np.float32)
        surv = survival_from_confidence(conf)
        rids = [r.req.rid for r in batch]
        verify_lens, decision = self.plan_windows(rids, surv)
        total_verify = int(verify_lens.sum())
        if cfg.mode == "compact":
            num_verify_tokens = next((t for t in eng.capture_tiers if t >= total_verify), total_verify)
        elif cfg.mode == "cap-accept":
            num_verify_tokens = total_verify
        else:
            num_verify_tokens = bs * (gamma + 1)
        window = verify_lens.astype(np.int64) - 1
        correct = np.minimum(blk.block_accept, window)
        cap_accept = cfg.mode == "cap-accept"
        cap_trim = blk.block_accept - correct if cap_accept else np.zeros_like(correct)
        expected = expected_given_window(blk.accept_prob, window, correct)
        sent = cfg.mode != "static"
        reqs, finished, prefix_total = [], [], 0
        for i, r in enumerate(batch):
            c, w = int(correct[i]), int(window[i])
            prefix_len = len(r.input_ids) + len(r.output) - 1
            prefix_total += prefix_len
            committed = blk.realised[i][: c + 1]
            detail: dict[str, Any] = {
                "req_pool_index": r.pool_index, "prefix_len": prefix_len, "verify_len": w + 1,
                "acc_len": c + 1, "correct_drafts": c, "cap_trim": int(cap_trim[i]),
                "bonus_token": committed[-1], "draft_tokens": blk.drafts[i].tolist(), "rid": rids[i],
            }
            if sent:
                detail["confidence"] = np.round(conf[i].astype(np.float64), 4).tolist()
                detail["survival"] = np.round(surv[i].astype(np.float64), 4).tolist()
            if cfg.expose_truth:
                detail["emu_block_accept"] = int(blk.block_accept[i])
                detail["emu_expected_given_window"] = round(float(expected[i]), 6)
            reqs.append(detail)
            r.count_verify(c, w, sent=sent, cap_accept=cap_accept, cap_trim=int(cap_trim[i]))
            r.output.extend(committed)
            r.logprobs.extend(blk.logprob[i][: c + 1])
            r.tops.extend(blk.tops[i][: c + 1])
            r.caches.truncate(starts[i] + 1 + c)
            if self._finished(r):
                finished.append((i, r))
        self.recent.extend((int(c) + 1, int(c), int(w) + 1, int(c) + 1 + int(t))
                           for c, w, t in zip(correct, window, cap_trim))
        self.verify_calls += bs
        step_s = time.perf_counter() - t_start
        self._tick()
        step = base.decode_step_record(self, bs=bs, decision=decision, num_verify_tokens=num_verify_tokens,
                                       step_s=step_s, draft_s=draft_s, reqs=reqs)
        self.dumper.observe_decode_step(step)
        for removed, (i, r) in enumerate(finished):
            del self.running[i - removed]
            r.caches = None
            eng.finish_request(self, r)
        return True


class RealModelEngine(base.Engine):
    """``Engine``'s interface over the real model; ``server.EmulatorApp`` hosts it unchanged."""

    def __init__(self, cfg: RealModelConfig) -> None:
        torch.set_num_threads(cfg.threads)
        self.pair = ModelPair.get(drop=cfg.drop_layers, cache_dir=cfg.cache_dir)
        super().__init__(cfg)
        self.ranks = [_RealRank(self, i) for i in range(cfg.dp_size)]

    @property
    def model_path(self) -> str:
        return self.cfg.model

    def tokenize(self, text: str) -> list[int]:
        return self.pair.encode(text)

    def detokenize(self, ids: list[int]) -> str:
        return self.pair.decode(ids)

    def submit(self, req: base.GenerateRequest) -> concurrent.futures.Future:
        if req.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {req.max_new_tokens}")
        if req.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {req.temperature}")
        input_ids = [int(t) for t in req.input_ids] if req.input_ids else self.pair.encode(req.text or "")
        if not input_ids:
            raise ValueError("the prompt is empty")
        vocab = self.pair.shape.vocab
        if min(input_ids) < 0 or max(input_ids) >= vocab:
            raise ValueError(f"input_ids must lie in [0, {vocab}), got {min(input_ids)}..{max(input_ids)}")
        key = req.sampling_seed if req.sampling_seed is not None else base.model.stable_hash(req.rid)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            rank = self.ranks[0]
            self._submitted += 1
            rank.waiting.append(_Running(req=req, input_ids=input_ids, sample_key=int(key), caches=None,
                                         pool_index=-1, submitted_clock=rank.clock, future=fut))
            self._last_submit = time.monotonic()
            self._wake.notify()
        return fut

    def _result(self, rank: _RealRank, r: _Running) -> dict[str, Any]:
        out = list(r.output)
        completion = len(out)
        meta: dict[str, Any] = {
            "id": r.req.rid, "finish_reason": r.finish_reason,
            "prompt_tokens": len(r.input_ids), "completion_tokens": completion, "cached_tokens": 0,
            "e2e_latency": round(rank.clock - r.submitted_clock, 6),
        }
        meta.update(base.spec_meta_info(r, gamma=self.cfg.gamma, mode=self.cfg.mode, completion=completion))
        if r.req.return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(r.logprobs, out)]
            if r.req.top_logprobs_num > 0:
                meta["output_top_logprobs"] = [[[v, i, None] for i, v in zip(ids, vals)] for ids, vals in r.tops]
        return {"text": self.pair.decode(out), "output_ids": out, "meta_info": meta}

