"""The emulator's target model, drafter and confidence head.

Everything a DSpark server needs from its two models, with the one property a
companion run relies on: **the token committed at an output position depends
only on the prompt, the seed and the position**, never on the verify window.

How that is achieved without giving up speculative sampling.  Speculative
sampling draws ``d ~ q``, accepts with probability ``min(1, p(d)/q(d))`` and
otherwise resamples from the residual ``(p - q)+``; the committed token ``x`` is
then distributed as ``p``.  The same joint law of ``(d, x)`` is obtained by
drawing ``x ~ p`` first (a position-indexed stream) and then ``d`` from its
conditional given ``x``: ``d = x`` with probability ``min(p(x), q(x)) / p(x)``,
otherwise from ``(q - p)+``.  Acceptance is ``d == x``.  So compact,
cap-accept and static commit identical tokens for the same seed, and a
full-block verify would accept exactly the leading drafts equal to the
realised tokens — the emulator knows the hidden ceiling.

The drafter: ``q = (1 - rho) p + rho * delta(j*)`` with ``j*`` the target's
least likely candidate; ``rho`` is set so that the acceptance probability equals
the head's true confidence ``c``.  Greedy requests accept with probability ``c``
and otherwise draft ``j*``.  The head reports ``sigmoid((logit(c) + b_k) / T_k)``:
``T_k = 1, b_k = 0`` is calibrated, ``T_k < 1`` over-confident at position ``k``,
``b_k < 0`` under-confident everywhere (a bias no temperature can remove).

``draft_block`` drafts one request; the engine drafts a whole batch with
``draft_blocks``, which computes bit for bit the same numbers (the same random
draws, see :mod:`dspark_obs.emulator.streams`, and the same floating-point operations) for every
request at once.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dspark_obs.emulator.streams import StreamKey, block_draws
from dspark_obs.emulator.workloads import WorkloadProfile

NUM_CANDIDATES = 6
VOCAB_SIZE = 32_000
EOS_TOKEN_ID = 2
FIRST_WORD_ID = 100
# Beyond the end of a sequence the target has no continuation to agree with.
NO_TOKEN = -1
_CHUNK = 64
_PACKED_WIDTH = 2 * NUM_CANDIDATES + 2


def stable_hash(*parts: object) -> int:
    """A process-independent 32-bit hash (Python's ``hash`` is salted)."""
    return zlib.crc32("\x1f".join(str(p) for p in parts).encode())


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class TargetTrack:
    """The target's distributions and realised tokens for one request, by position.

    Grown lazily in chunks from streams keyed by (seed, prompt) and
    (seed, prompt, sampling key): position ``t`` always consumes the same draws,
    so its values do not depend on when it was first asked for.
    """

    def __init__(self, *, seed: int, prompt_key: int, sample_key: int, profile: WorkloadProfile,
                 temperature: float, natural_len: int) -> None:
        self._shape_rng = np.random.default_rng([seed, prompt_key, 1])
        self._sample_rng = np.random.default_rng([seed, prompt_key, sample_key, 2])
        self.profile = profile
        self.temperature = float(temperature)
        self.natural_len = int(natural_len)  # EOS sits at position natural_len - 1
        self.cand = np.zeros((0, NUM_CANDIDATES), dtype=np.int32)
        self.logp = np.zeros((0, NUM_CANDIDATES), dtype=np.float64)  # at the request temperature
        self.x_idx = np.zeros(0, dtype=np.int64)  # index of the realised token among candidates
        self.j_idx = np.zeros(0, dtype=np.int64)  # the decoy: least likely candidate
        # The same, side by side in one float64 array for the batch path (one slice per request):
        # logp | cand | x_idx | j_idx (ids and indices are exact in float64).
        self.packed = np.zeros((0, _PACKED_WIDTH))

    def ensure(self, upto: int) -> None:
        missing = upto - self.cand.shape[0]
        if missing > 0:
            self._grow(-(-missing // _CHUNK))

    def _grow(self, chunks: int = 1) -> None:
        """Append ``chunks`` chunks: each draws its candidates then its logits, as one chunk at a time did."""
        start = self.cand.shape[0]
        n, k = _CHUNK, NUM_CANDIDATES
        cands, raws = [], []
        for _ in range(chunks):
            cands.append(self._shape_rng.integers(FIRST_WORD_ID, VOCAB_SIZE, size=(n, k), dtype=np.int32))
            raws.append(self._shape_rng.normal(0.0, self.profile.target_sharpness, size=(n, k)))
        cand = np.concatenate(cands) if chunks > 1 else cands[0]
        raw = np.concatenate(raws) if chunks > 1 else raws[0]
        raw[:, 0] += self.profile.target_sharpness  # one clearly preferred continuation
        uniforms = self._sample_rng.random(n * chunks)  # the same doubles as one call per chunk
        pos = start + np.arange(n * chunks)
        eos_row = pos == self.natural_len - 1
        cand[eos_row, 0] = EOS_TOKEN_ID
        # The target ends where EOS is its top-1 (so a greedy output is the top-1 everywhere, as a real one is).
        raw[eos_row, 0] = np.maximum(raw[eos_row, 0], raw[eos_row, 1:].max(axis=1) + 0.5)
        temp = self.temperature if self.temperature > 0 else 1.0
        logp = np.log(_softmax(raw / temp))
        if self.temperature > 0:
            cdf = np.cumsum(np.exp(logp), axis=1)
            x_idx = np.minimum((uniforms[:, None] > cdf).sum(axis=1), k - 1)
        else:
            x_idx = np.argmax(logp, axis=1)
        # Past EOS nothing continues; at EOS the target emits it.
        x_idx = np.where(eos_row, 0, x_idx)
        j_idx = np.argmin(logp, axis=1)
        self.cand = np.concatenate([self.cand, cand])
        self.logp = np.concatenate([self.logp, logp])
        self.x_idx = np.concatenate([self.x_idx, x_idx])
        self.j_idx = np.concatenate([self.j_idx, j_idx])
        self.packed = np.concatenate([self.packed, np.column_stack([logp, cand, x_idx, j_idx])])

    def realised(self, positions: np.ndarray) -> np.ndarray:
        """Committed token ids at output ``positions`` (``NO_TOKEN`` past EOS)."""
        self.ensure(int(positions.max()) + 1)
        tok = self.cand[positions, self.x_idx[positions]]
        return np.where(positions >= self.natural_len, NO_TOKEN, tok)

    def logprob_of_realised(self, positions: np.ndarray) -> np.ndarray:
        self.ensure(int(positions.max()) + 1)
        return self.logp[positions, self.x_idx[positions]]

    def top(self, position: int, k: int) -> tuple[list[int], list[float]]:
        self.ensure(position + 1)
        order = np.argsort(-self.logp[position])[:k]
        return self.cand[position, order].tolist(), self.logp[position, order].tolist()


@dataclass
class DraftBlock:
    """One request's block: drafts, the head's confidences and the hidden truth."""

    draft_tokens: np.ndarray  # [gamma] int
    confidence: np.ndarray  # [gamma] float32, as the head reports it
    draft_logprob: np.ndarray  # [gamma] log q(d_k)
    block_accept: int  # drafts a full-block verify accepts (leading d_k == x)
    accept_prob: np.ndarray  # [gamma] a_k = min(1, p(d_k)/q(d_k)) (greedy: 1[d_k == argmax p])


def draft_block(track: TargetTrack, rng: np.random.Generator, *, first_pos: int, gamma: int,
                head_temperature: np.ndarray, greedy: bool, head_bias: np.ndarray | float = 0.0) -> DraftBlock:
    """Draft positions ``first_pos .. first_pos + gamma - 1`` after the anchor."""
    prof = track.profile
    pos = first_pos + np.arange(gamma)
    track.ensure(int(pos[-1]) + 1)
    logit_c = (prof.acceptance_logits(gamma) + rng.normal(0.0, prof.block_sigma)
               + rng.normal(0.0, prof.position_sigma, size=gamma))
    c_true = 1.0 / (1.0 + np.exp(-logit_c))
    u_acc, u_off = rng.random(gamma), rng.random(gamma)

    logp = track.logp[pos]
    p = np.exp(logp)
    x_idx, j_idx = track.x_idx[pos], track.j_idx[pos]
    rows = np.arange(gamma)
    p_j = p[rows, j_idx]
    alive = pos < track.natural_len  # positions with a target continuation
    if greedy:
        # The greedy decoy must differ from the target's argmax to be a rejection.
        j_idx = np.where(j_idx == x_idx, (x_idx + 1) % NUM_CANDIDATES, j_idx)
        accept = (u_acc < c_true) & alive
        rho = np.where(accept, 0.0, 1.0)
    else:
        rho = np.clip((1.0 - c_true) / np.maximum(1.0 - p_j, 1e-9), 0.0, 1.0)
        accept = ((x_idx == j_idx) | (u_acc < 1.0 - rho)) & alive
    q = (1.0 - rho)[:, None] * p
    q[rows, j_idx] += rho
    on_track = np.cumprod(accept) == 1
    first_reject = int(on_track.sum())  # == block_accept
    d_idx = np.where(accept, x_idx, j_idx)
    # After the first rejection the drafter's context has left the target's
    # trajectory: its later drafts are independent of the realised tokens.
    off = rows > first_reject
    if off.any():
        cdf = np.cumsum(q, axis=1)
        d_idx = np.where(off, np.minimum((u_off[:, None] > cdf).sum(axis=1), NUM_CANDIDATES - 1), d_idx)
    draft_tokens = track.cand[pos, d_idx]
    q_d = q[rows, d_idx]
    if greedy:
        a = (d_idx == x_idx) & alive
        a = a.astype(np.float64)
    else:
        a = np.where(alive, np.minimum(1.0, p[rows, d_idx] / np.maximum(q_d, 1e-12)), 0.0)
    confidence = 1.0 / (1.0 + np.exp(-(logit_c + head_bias) / head_temperature))
    return DraftBlock(
        draft_tokens=draft_tokens.astype(np.int64),
        confidence=confidence.astype(np.float32),
        draft_logprob=np.log(np.maximum(q_d, 1e-12)),
        block_accept=first_reject,
        accept_prob=a,
    )


def natural_length(rng: np.random.Generator, profile: WorkloadProfile) -> int:
    return int(max(8, rng.normal(profile.output_len_mean, profile.output_len_sd)))


@dataclass
class DraftBatch:
    """``draft_block`` for every request of a batch, row for row ([B, gamma] unless noted)."""

    draft_tokens: np.ndarray  # int64
    confidence: np.ndarray  # float32, as the head reports it
    draft_logprob: np.ndarray  # log q(d_k)
    block_accept: np.ndarray  # [B] int64
    accept_prob: np.ndarray  # float64 a_k per drafted position (see DraftBlock)
    realised: np.ndarray  # [B, gamma + 1] committed token ids at first_pos .. first_pos + gamma


def draft_blocks(tracks: Sequence[TargetTrack], keys: Sequence[StreamKey], first_pos: Sequence[int], *,
                 gamma: int, head_temperature: np.ndarray, greedy: Sequence[bool],
                 head_bias: np.ndarray | float = 0.0) -> DraftBatch:
    """``draft_block(tracks[i], default_rng([*keys[i].key, first_pos[i]]), ...)`` for every ``i`` at once.

    Bit for bit the same numbers as the per-request function (the same draws, the
    same floating-point operations in the same order), plus the realised tokens
    at the anchor's ``gamma + 1`` positions.

    Long: one vectorised pass whose draws must stay in the per-request function's order (the pins above);
    split, the intermediate arrays would pass through every piece.
    """
    n = len(tracks)
    pos0 = np.asarray(first_pos, dtype=np.int64)
    k = NUM_CANDIDATES
    windows = []
    for track, start in zip(tracks, pos0.tolist()):
        end = start + gamma + 1
        if track.packed.shape[0] < end:
            track.ensure(end)
        windows.append(track.packed[start:end])
    packed = np.concatenate(windows).reshape(n, gamma + 1, _PACKED_WIDTH) if windows else \
        np.zeros((0, gamma + 1, _PACKED_WIDTH))
    logp = np.ascontiguousarray(packed[:, :gamma, :k])
    cand = packed[:, :, k:2 * k].astype(np.int32)
    x_idx = packed[:, :, 2 * k].astype(np.int64)
    j_idx = packed[:, :gamma, 2 * k + 1].astype(np.int64)
    natural = np.array([t.natural_len for t in tracks], dtype=np.int64)
    # Per-profile values, gathered through a small table of the batch's distinct profiles.
    index: dict[int, int] = {}
    distinct: list[WorkloadProfile] = []
    which = np.empty(n, dtype=np.intp)
    for i, track in enumerate(tracks):
        k = index.get(id(track.profile))
        if k is None:
            k = index[id(track.profile)] = len(distinct)
            distinct.append(track.profile)
        which[i] = k
    acc_logits = np.array([p.acceptance_logits(gamma) for p in distinct]).reshape(-1, gamma)[which]
    block_noise, position_noise, u_acc, u_off = block_draws(
        keys, pos0, gamma, block_sigma=np.array([p.block_sigma for p in distinct], dtype=np.float64)[which],
        position_sigma=np.array([p.position_sigma for p in distinct], dtype=np.float64)[which])
    greedy = np.asarray(greedy, dtype=bool)[:, None]

    logit_c = acc_logits + block_noise[:, None] + position_noise
    c_true = 1.0 / (1.0 + np.exp(-logit_c))
    pos = pos0[:, None] + np.arange(gamma)
    p = np.exp(logp)
    xi = x_idx[:, :gamma]
    p_j = np.take_along_axis(p, j_idx[..., None], axis=2)[..., 0]
    alive = pos < natural[:, None]
    # greedy rows: the decoy must differ from the target's argmax; accept with c
    j_greedy = np.where(j_idx == xi, (xi + 1) % NUM_CANDIDATES, j_idx)
    accept_greedy = (u_acc < c_true) & alive
    with np.errstate(divide="ignore", invalid="ignore"):
        rho_sampled = np.clip((1.0 - c_true) / np.maximum(1.0 - p_j, 1e-9), 0.0, 1.0)
    accept_sampled = ((xi == j_idx) | (u_acc < 1.0 - rho_sampled)) & alive
    j_idx = np.where(greedy, j_greedy, j_idx)
    accept = np.where(greedy, accept_greedy, accept_sampled)
    rho = np.where(greedy, np.where(accept_greedy, 0.0, 1.0), rho_sampled)

    q = (1.0 - rho)[..., None] * p
    rows_b, rows_k = np.indices((n, gamma))
    q[rows_b, rows_k, j_idx] += rho
    first_reject = (np.cumprod(accept, axis=1) == 1).sum(axis=1)
    d_idx = np.where(accept, xi, j_idx)
    # After the first rejection the drafter's context has left the target's trajectory.
    off = rows_k > first_reject[:, None]
    cdf = np.cumsum(q, axis=2)
    d_idx = np.where(off, np.minimum((u_off[..., None] > cdf).sum(axis=2), NUM_CANDIDATES - 1), d_idx)
    draft_tokens = np.take_along_axis(cand[:, :gamma], d_idx[..., None], axis=2)[..., 0]
    q_d = np.take_along_axis(q, d_idx[..., None], axis=2)[..., 0]
    p_d = np.take_along_axis(p, d_idx[..., None], axis=2)[..., 0]
    a_greedy = ((d_idx == xi) & alive).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a_sampled = np.where(alive, np.minimum(1.0, p_d / np.maximum(q_d, 1e-12)), 0.0)
    a = np.where(greedy, a_greedy, a_sampled)
    confidence = 1.0 / (1.0 + np.exp(-(logit_c + head_bias) / head_temperature))
    realised_pos = pos0[:, None] + np.arange(gamma + 1)
    tok = np.take_along_axis(cand, x_idx[..., None], axis=2)[..., 0]
    return DraftBatch(
        draft_tokens=draft_tokens.astype(np.int64),
        confidence=confidence.astype(np.float32),
        draft_logprob=np.log(np.maximum(q_d, 1e-12)),
        block_accept=first_reject.astype(np.int64),
        accept_prob=a,
        realised=np.where(realised_pos >= natural[:, None], NO_TOKEN, tok),
    )
