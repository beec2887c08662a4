"""Continuous-batching DSpark engine: the three verify modes on the emulator model.

Per DP rank: waiting requests are admitted by a prefill batch (which advances
``forward_ct`` like SGLang's scheduler, and yields each request's first token),
then every running request takes part in each decode step.  A decode step
drafts a block per request, plans the budget from survivals ``lag_steps``
decode steps old and the windows from the current ones (``dspark_obs.scheduler``),
verifies per mode, commits, and hands the step to the rank's ``InfoDumper``.

Time is virtual by default: each step advances a per-rank clock by the true
cost model's step time, so a long run takes seconds of wall time.

With ``estimate_path`` set and ``folded_proposal`` off (SGLang:
``SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH`` with
``SGLANG_DSPARK_FOLDED_PROPOSAL=0``) DP rank 0 also writes SGLang's
block-accept estimator JSONL (``estimator_jsonl.BlockAcceptRecorder``), row for row as
``dspark_block_accept_estimator.py`` does.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import deque
from typing import Any, Optional

import numpy as np

from dspark_obs import costtable as ct
from dspark_obs.acceptance import expected_given_window
from dspark_obs.emulator import model
from dspark_obs.emulator.dumper import InfoDumper
from dspark_obs.emulator.estimator_jsonl import BlockAcceptRecorder
from dspark_obs.emulator.methods import decode_without_speculation, forced_budget
from dspark_obs.emulator.streams import StreamKey
from dspark_obs.emulator.workloads import profile_for
from dspark_obs.emulator.config import (  # noqa: F401 - the engine's public names, as callers import them
    DEFAULT_HEAD_TEMPERATURE, MODES, EngineConfig, GenerateRequest, RunningRequest, default_capture_tiers)
from dspark_obs.emulator.sglang_fields import (  # noqa: F401 - likewise
    SpecCounters, bump_histogram, decode_step_record, detokenize, round6, spec_meta_info, tokenize)
from dspark_obs.scheduler import ScheduleConfig, survival_from_confidence, verify_lens_topk, verify_token_budget

class Rank:
    """One DP rank: its own queue, batch, forward counter, clock and dumper."""

    def __init__(self, engine: "Engine", index: int) -> None:
        cfg = engine.cfg
        self.engine, self.index = engine, index
        self.clock = 0.0
        self.forward_ct = 0
        self.waiting: deque[RunningRequest] = deque()
        self.running: list[RunningRequest] = []
        self.free_slots = list(range(cfg.max_running_requests - 1, -1, -1))
        # (row of each rid, survivals [bs, gamma]) of the last lag_steps decode steps
        self.survival_history: deque[tuple[dict[str, int], np.ndarray]] = deque(maxlen=max(cfg.lag_steps, 1))
        self.dumper = InfoDumper(gamma=cfg.gamma, mode=cfg.mode, components=cfg.components,
                                 max_records=cfg.max_records, clock=lambda: self.clock,
                                 track_produced=cfg.track_produced)
        self.noise_rng = np.random.default_rng([cfg.seed, index, 7])
        self.recent: deque[tuple[int, int, int, int]] = deque(maxlen=512)
        self.verify_calls = 0
        # SGLang's recorder lives on TP rank 0 only: with DP attention, DP rank 0.
        self.estimator: Optional[BlockAcceptRecorder] = None
        if cfg.estimate_path and index == 0:
            self.estimator = BlockAcceptRecorder(cfg.estimate_path, gamma=cfg.gamma)

    # -- prefill -----------------------------------------------------------
    def prefill(self) -> bool:
        cfg = self.engine.cfg
        admitted: list[RunningRequest] = []
        while self.waiting and self.free_slots:
            admitted.append(self.waiting.popleft())
        if cfg.lockstep_concurrency:
            admitted.sort(key=lambda r: r.req.rid)  # arrival order within a step is HTTP noise
        for r in admitted:
            r.pool_index = self.free_slots.pop()
        if not admitted:
            return False
        self.forward_ct += 1
        self.dumper.note_non_decode_step()
        if self.estimator is not None:
            self.estimator.flush()  # SGLang flushes the recorder on every prefill step
        prompt_tokens = sum(len(r.input_ids) for r in admitted)
        self.clock += cfg.true_cost.bias_seconds + 2.0e-6 * prompt_tokens
        for r in admitted:
            # Every position the request's steps will read, grown at once (the values
            # at a position do not depend on when it is grown).
            r.track.ensure(r.end + cfg.gamma + 1)
            r.output.append(int(r.track.realised(np.array([0]))[0]))
            r.first_token_clock = self.clock
            if len(r.output) >= r.end:
                self.engine.finish_request(self, r)
            else:
                self.running.append(r)
        return True

    # -- decode ------------------------------------------------------------
    def plan_windows(self, rids: list[str], surv: np.ndarray) -> tuple[np.ndarray, Any]:
        """``(verify_len [bs], budget decision or None)`` of one decode step, as SGLang's planner makes them.

        The budget comes from the survivals ``lag_steps`` decode steps back
        (fresh requests count as survival 1), the windows from the current ones;
        static mode verifies every block whole.  Both engines plan through here.
        """
        cfg = self.engine.cfg
        gamma, bs = cfg.gamma, len(rids)
        sched = ScheduleConfig(gamma=gamma)
        decision = None
        if cfg.mode == "static":
            verify_lens = np.full(bs, gamma + 1, dtype=np.int32)
        else:
            hist = np.ones((bs, gamma), dtype=np.float32)
            if len(self.survival_history) == cfg.lag_steps:
                lagged_index, lagged_surv = self.survival_history[0]
                at = [(i, j) for i, j in enumerate(map(lagged_index.get, rids)) if j is not None]
                if at:
                    hist[[i for i, _ in at]] = lagged_surv[[j for _, j in at]]
            table = cfg.sps_table or ct.uninitialized_table(max_batch_tokens=cfg.max_running_requests * (gamma + 1))
            decision = verify_token_budget(hist, table, sched)
            if cfg.force_budget_frac is not None:
                decision = forced_budget(decision, bs=bs, gamma=gamma, frac=cfg.force_budget_frac)
            verify_lens = verify_lens_topk(surv, decision.budget, sched)
            if cfg.force_budget_frac is not None and decision.budget >= bs * gamma:
                # a forced budget of every slot verifies every block whole (no-trim), drafts under the 1e-6 cut too
                verify_lens = np.full(bs, gamma + 1, dtype=np.int32)
        # Each request's survival row by rid (the last row wins for a repeated rid).
        self.survival_history.append((dict(zip(rids, range(bs))), surv))
        return verify_lens, decision

    def decode(self) -> bool:
        """One decode step of the rank, in SGLang's order: draft, plan budget and windows, verify per mode, commit, record.

        Long: the phases share a dozen per-step arrays, and the emulator's pins
        (tests/test_emulator_determinism.py) hold its exact order of random draws; split, every phase would
        take and return them all.
        """
        if not self.running:
            return False
        if not self.engine.cfg.speculative:
            for removed, (i, r) in enumerate(decode_without_speculation(self)):
                del self.running[i - removed]
                self.engine.finish_request(self, r)
            return True
        eng, cfg = self.engine, self.engine.cfg
        gamma, batch = cfg.gamma, self.running
        bs = len(batch)
        self.forward_ct += 1
        head_t = np.asarray(cfg.head_temperature[:gamma], dtype=np.float64)
        if cfg.sts_temperatures is not None:
            head_t = head_t * np.asarray(cfg.sts_temperatures[:gamma], dtype=np.float64)
        # The drafter's randomness is keyed by the anchor position, so a block
        # drafted at the same anchor is identical in every mode and run: a
        # companion step pairs with its compact step by (rid, prefix_len).
        # The whole batch is drafted at once; it draws exactly what
        # model.draft_block draws from default_rng([*draft_key, anchor]).
        positions = [len(r.output) for r in batch]
        rids = [r.req.rid for r in batch]
        drafts = model.draft_blocks([r.track for r in batch], [r.stream_key for r in batch], positions,
                                    gamma=gamma, head_temperature=head_t,
                                    greedy=[r.req.temperature <= 0 for r in batch],
                                    head_bias=np.asarray(cfg.head_bias[:gamma], dtype=np.float64))
        # The head's output is quantised to what the record shows, so a replay of
        # the logged confidences plans exactly what the engine planned.
        conf = np.round(drafts.confidence.astype(np.float64), 4).astype(np.float32)
        surv = survival_from_confidence(conf)
        verify_lens, decision = self.plan_windows(rids, surv)

        total_verify = int(verify_lens.sum())
        if cfg.mode == "compact":
            tiers = eng.capture_tiers
            num_verify_tokens = next((t for t in tiers if t >= total_verify), total_verify)
            run_tokens = num_verify_tokens
        elif cfg.mode == "cap-accept":
            num_verify_tokens, run_tokens = total_verify, bs * (gamma + 1)
        else:
            num_verify_tokens = run_tokens = bs * (gamma + 1)

        # Python values of the batch's arrays, converted once (round(float32, 4) as
        # np.round on float64: float32 * 10**4 is exact in double, so both round alike).
        window_a = verify_lens.astype(np.int64) - 1
        correct_a = np.minimum(drafts.block_accept, window_a)
        cap_accept = cfg.mode == "cap-accept"
        cap_trim_a = drafts.block_accept - correct_a if cap_accept else np.zeros_like(correct_a)
        windows, corrects, cap_trims = window_a.tolist(), correct_a.tolist(), cap_trim_a.tolist()
        block_accepts = drafts.block_accept.tolist()
        expected = round6(expected_given_window(drafts.accept_prob, window_a, correct_a))
        draft_lists = drafts.draft_tokens.tolist()
        realised = drafts.realised.tolist()
        sent = cfg.mode != "static"
        conf_lists = np.round(conf.astype(np.float64), 4).tolist() if sent else None
        surv_lists = np.round(surv.astype(np.float64), 4).tolist() if sent else None
        truth = cfg.expose_truth
        estimating = self.estimator is not None and not cfg.folded_proposal
        prefix_total = 0
        reqs: list[dict[str, Any]] = []
        estimator_rows: list[dict[str, Any]] = []
        finished: list[tuple[int, RunningRequest]] = []
        for i, r in enumerate(batch):
            n = positions[i]
            prefix_len = len(r.input_ids) + n - 1
            prefix_total += prefix_len
            window = windows[i]
            correct = corrects[i]
            cap_trim = cap_trims[i]
            committed = realised[i][: correct + 1]
            bonus = committed[-1]
            detail: dict[str, Any] = {
                "req_pool_index": r.pool_index, "prefix_len": prefix_len,
                "verify_len": window + 1, "acc_len": correct + 1,
                "correct_drafts": correct, "cap_trim": cap_trim, "bonus_token": bonus,
                "draft_tokens": draft_lists[i], "rid": rids[i],
            }
            if sent:
                detail["confidence"] = conf_lists[i]
                detail["survival"] = surv_lists[i]
            if truth:
                detail["emu_block_accept"] = block_accepts[i]
                detail["emu_expected_given_window"] = expected[i]
            reqs.append(detail)
            if estimating:
                estimator_rows.append({
                    "rid": r.req.rid, "greedy": r.req.temperature <= 0, "seq_len": prefix_len,
                    "window": window, "cl": correct, "ct": cap_trim, "bonus": bonus,
                    "drafts": list(draft_lists[i]), "q_all": drafts.draft_logprob[i].tolist(),
                    "p_lp": self._target_logprob_at(r, n)})
            r.count_verify(correct, window, sent=sent, cap_accept=cap_accept, cap_trim=cap_trim)
            left = r.end - n
            r.output.extend(committed if left > correct else committed[: max(0, left)])
            if left <= correct + 1:  # the output reached its end
                finished.append((i, r))
        # Only the last recent.maxlen rows survive in the deque, as if appended one by one.
        tail = max(0, bs - (self.recent.maxlen or bs))
        self.recent.extend(zip((c + 1 for c in corrects[tail:]), corrects[tail:],
                               (w + 1 for w in windows[tail:]),
                               (c + 1 + t for c, t in zip(corrects[tail:], cap_trims[tail:]))))
        self.verify_calls += bs

        tc = cfg.true_cost
        true_s = float(tc.step_seconds(num_reqs=bs, budget=run_tokens - bs)) + cfg.context_seconds_per_token * prefix_total
        step_s = true_s * float(np.exp(self.noise_rng.normal(0.0, cfg.step_noise)))
        draft_s = tc.bias_seconds * 0.25 + 2.0e-5 * bs
        self.clock += step_s + cfg.host_overhead_seconds
        step = decode_step_record(self, bs=bs, decision=decision, num_verify_tokens=num_verify_tokens,
                                  step_s=step_s, draft_s=draft_s, reqs=reqs)
        self.dumper.observe_decode_step(step)
        if estimator_rows:
            self.estimator.observe_step(self.forward_ct, estimator_rows)
        # ``batch`` is ``self.running``: drop each finished request by its index (identity,
        # not dataclass equality, which compares every field), one at a time as before.
        for removed, (i, r) in enumerate(finished):
            del self.running[i - removed]
            eng.finish_request(self, r)
            if self.estimator is not None:
                self.estimator.note_request_finished(r.req.rid, natural_stop=r.finish_reason["type"] == "stop")
        if cfg.real_time > 0:
            time.sleep(step_s * cfg.real_time)
        return True


    @staticmethod
    def _target_logprob_at(r: "RunningRequest", n: int):
        """``p_lp(row, token)``: the target's logprob of ``token`` at output position ``n + row``."""
        def p_lp(row: int, token: int) -> float:
            pos = n + row
            r.track.ensure(pos + 1)
            hits = np.flatnonzero(r.track.cand[pos] == token)
            return float(r.track.logp[pos, hits[0]]) if hits.size else float(np.log(1e-12))
        return p_lp


class Engine:
    """All DP ranks, a submission queue, and a stepping thread."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.capture_tiers = default_capture_tiers(cfg.max_running_requests * (cfg.gamma + 1))
        self.ranks = [Rank(self, i) for i in range(cfg.dp_size)]
        self.lock = threading.RLock()
        self._wake = threading.Condition(self.lock)
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self._submitted = 0
        # lockstep: how many were in flight before the last forward finished some (C at start)
        self._in_flight_before_finish = cfg.lockstep_concurrency
        self._last_submit = time.monotonic()
        self.requests_finished = 0
        self._lockstep_total = 0  # set_lockstep: requests a closed-loop client will send
        self._lockstep_finished_base = 0

    # -- submission ----------------------------------------------------------
    def submit(self, req: GenerateRequest) -> concurrent.futures.Future:
        if req.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {req.max_new_tokens}")
        if req.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {req.temperature}")
        input_ids = list(req.input_ids) if req.input_ids else tokenize(req.text or "")
        prof = profile_for(req.text, req.rid)
        prompt_key = model.stable_hash(*input_ids)
        sample_key = req.sampling_seed if req.sampling_seed is not None else model.stable_hash(req.rid)
        seed = self.cfg.seed
        natural = model.natural_length(np.random.default_rng([seed, prompt_key, 0]), prof)
        track = model.TargetTrack(seed=seed, prompt_key=prompt_key, sample_key=sample_key, profile=prof,
                                  temperature=req.temperature, natural_len=natural)
        end = min(natural, req.max_new_tokens)
        reason = ({"type": "stop", "matched": model.EOS_TOKEN_ID} if natural <= req.max_new_tokens
                  else {"type": "length", "length": req.max_new_tokens})
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            if self.cfg.lockstep_concurrency:  # routing must not depend on arrival order either
                rank = self.ranks[model.stable_hash(req.rid) % len(self.ranks)]
            else:
                rank = self.ranks[self._submitted % len(self.ranks)]
            self._submitted += 1
            run = RunningRequest(req=req, input_ids=input_ids, track=track,
                           draft_key=(seed, prompt_key, sample_key, 3),
                           stream_key=StreamKey.of((seed, prompt_key, sample_key, 3)),
                           end=end, finish_reason=reason, pool_index=-1,
                           submitted_clock=rank.clock, future=fut)
            rank.waiting.append(run)
            self._last_submit = time.monotonic()
            self._wake.notify()
        return fut

    def set_lockstep(self, concurrency: int, total: int = 0) -> None:
        """Hold each forward for a closed-loop client at ``concurrency`` (0 = off); see ``_await_closed_loop_refill``.

        With ``total`` (the requests the client will send from now on) the engine
        knows how many should be in flight — ``min(concurrency, total - finished)`` —
        and waits for exactly that, so the drain at the end costs no waiting.
        """
        with self.lock:
            self.cfg.lockstep_concurrency = max(0, int(concurrency))
            self._in_flight_before_finish = self.cfg.lockstep_concurrency
            self._lockstep_total = max(0, int(total))
            self._lockstep_finished_base = self.requests_finished
            self._wake.notify_all()

    def finish_request(self, rank: Rank, r: RunningRequest) -> None:
        if self.cfg.lockstep_concurrency and not self._in_flight_before_finish:
            self._in_flight_before_finish = sum(len(x.waiting) + len(x.running) for x in self.ranks) + 1
        rank.free_slots.append(r.pool_index)
        self.requests_finished += 1
        r.future.set_result(self._result(rank, r))

    def _result(self, rank: Rank, r: RunningRequest) -> dict[str, Any]:
        out = r.output[: r.end]
        completion = len(out)
        meta: dict[str, Any] = {
            "id": r.req.rid, "finish_reason": r.finish_reason,
            "prompt_tokens": len(r.input_ids), "completion_tokens": completion, "cached_tokens": 0,
            "e2e_latency": round(rank.clock - r.submitted_clock, 6),
        }
        if r.first_token_clock is not None:  # emulator only: SGLang's non-streaming meta_info has no TTFT
            meta["emu_first_token_latency"] = round(r.first_token_clock - r.submitted_clock, 6)
        meta.update(spec_meta_info(r, gamma=self.cfg.gamma, mode=self.cfg.mode, completion=completion))
        if r.req.return_logprob:
            pos = np.arange(completion)
            lps = r.track.logprob_of_realised(pos) if completion else np.zeros(0)
            meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(lps, out)]
            if r.req.top_logprobs_num > 0:
                tops = []
                for p in range(completion):
                    ids, lp = r.track.top(p, r.req.top_logprobs_num)
                    tops.append([[float(v), int(i), None] for v, i in zip(lp, ids)])
                meta["output_top_logprobs"] = tops
        return {"text": detokenize(out), "output_ids": out, "meta_info": meta}

    # -- stepping -----------------------------------------------------------
    def step(self) -> bool:
        """One prefill or decode forward on every rank with work; False when idle."""
        did = False
        with self.lock:
            for rank in self.ranks:
                if rank.waiting and rank.free_slots:
                    did |= rank.prefill()
                else:
                    did |= rank.decode()
        return did

    def run_until_idle(self) -> None:
        while self.step():
            pass

    def start(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="dspark-emulator-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self.lock:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for rank in self.ranks:
            if rank.estimator is not None:
                rank.estimator.close()

    def _loop(self) -> None:
        while not self._stop:
            self._await_closed_loop_refill()
            if not self.step():
                with self.lock:
                    if not self._stop and not any(r.waiting or r.running for r in self.ranks):
                        self._wake.wait(timeout=0.5)
            else:
                time.sleep(0)  # let request handlers in between steps

    def _await_closed_loop_refill(self) -> None:
        """Lockstep: hold the next forward until a closed-loop client has refilled.

        With ``lockstep_concurrency = C`` the engine waits (real time, at most
        ``lockstep_wait_s``) while fewer than C requests are in flight, so the
        batch a step sees does not depend on HTTP latency: the same traffic
        replayed against another mode meets the same batches, the same budgets
        and the same windows, and every compact step has a companion step.
        """
        target = self.cfg.lockstep_concurrency
        if not target:
            return
        if self._lockstep_total:
            self._await_known_refill(target)
            return
        with self.lock:
            # Refill what the last forward finished (C at start), while arrivals keep
            # coming: give up once none has arrived for lockstep_wait_s.
            want = min(target, self._in_flight_before_finish)
            began = time.monotonic()
            while not self._stop:
                in_flight = sum(len(r.waiting) + len(r.running) for r in self.ranks)
                quiet = time.monotonic() - max(self._last_submit, began)
                if in_flight >= want or (in_flight > 0 and quiet >= self.cfg.lockstep_wait_s):
                    self._in_flight_before_finish = 0
                    return
                self._wake.wait(timeout=self.cfg.lockstep_wait_s if in_flight else 0.5)

    def _await_known_refill(self, target: int) -> None:
        """Lockstep with a known total: wait until ``min(C, total - finished)`` requests are in flight."""
        with self.lock:
            began = time.monotonic()
            while not self._stop:
                left = self._lockstep_total - (self.requests_finished - self._lockstep_finished_base)
                in_flight = sum(len(r.waiting) + len(r.running) for r in self.ranks)
                quiet = time.monotonic() - max(self._last_submit, began)
                if in_flight >= min(target, left) or quiet >= self.cfg.lockstep_wait_s:
                    return
                self._wake.wait(timeout=self.cfg.lockstep_wait_s)

    # -- introspection --------------------------------------------------------
    def dump(self) -> list[Optional[dict]]:
        with self.lock:
            return [rank.dumper.dump() for rank in self.ranks]

    def clear_records(self) -> None:
        with self.lock:
            for rank in self.ranks:
                rank.dumper.clear()

    def spec_gauges(self) -> dict[str, float]:
        """Recent-window averages named like SGLang's ``sglang:spec_*`` gauges."""
        with self.lock:
            recent = [x for rank in self.ranks for x in rank.recent]
            calls = sum(rank.verify_calls for rank in self.ranks)
        if not recent:
            return {"spec_verify_calls_total": float(calls)}
        arr = np.asarray(recent, dtype=np.float64)
        gauges = {
            "spec_accept_length": float(arr[:, 0].mean()),
            "spec_accept_rate": float(arr[:, 1].mean() / self.cfg.gamma),
            "spec_num_steps": float(len(recent)),
            "spec_num_draft_tokens": float(self.cfg.gamma + 1),
            "spec_verify_calls_total": float(calls),
        }
        if self.cfg.mode != "static":
            gauges["spec_cap_length"] = float(arr[:, 2].mean())
        if self.cfg.mode == "cap-accept":
            gauges["spec_block_accept_length"] = float(arr[:, 3].mean())
        return gauges
