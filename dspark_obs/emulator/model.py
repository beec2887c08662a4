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
and otherwise draft ``j*``.  The head reports ``sigmoid(logit(c) / T_k)``:
``T_k = 1`` is calibrated, ``T_k < 1`` over-confident at position ``k``.

``draft_block`` drafts one request; the engine drafts a whole batch with
``draft_blocks``, which computes bit for bit the same numbers (the same random
draws, see ``block_draws``, and the same floating-point operations) for every
request at once.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

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
    expected_block_accept: float  # sum_k prod_{i<=k} min(1, p(d_i)/q(d_i))


def draft_block(track: TargetTrack, rng: np.random.Generator, *, first_pos: int, gamma: int,
                head_temperature: np.ndarray, greedy: bool) -> DraftBlock:
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
    confidence = 1.0 / (1.0 + np.exp(-logit_c / head_temperature))
    return DraftBlock(
        draft_tokens=draft_tokens.astype(np.int64),
        confidence=confidence.astype(np.float32),
        draft_logprob=np.log(np.maximum(q_d, 1e-12)),
        block_accept=first_reject,
        expected_block_accept=float(np.cumprod(a).sum()),
    )


def natural_length(rng: np.random.Generator, profile: WorkloadProfile) -> int:
    return int(max(8, rng.normal(profile.output_len_mean, profile.output_len_sd)))


# -- the drafter's random streams, a whole batch at a time -----------------------------
#
# ``draft_block`` draws from ``np.random.default_rng([*draft_key, anchor_position])``:
# a fresh PCG64 seeded through a SeedSequence for every request and step, about
# 60 us each in numpy.  ``draft_blocks`` needs the very same numbers for a whole
# batch, so it computes them column-wise: SeedSequence's entropy mixing (its
# documented algorithm; everything but the anchor position is mixed once per
# request, see ``StreamKey``), PCG64's XSL-RR 128/64 generator jumped ahead to each
# output with 128-bit arithmetic on uint64 halves, ``next_double``, and the fast
# path of numpy's ziggurat ``random_standard_normal`` (layer widths read from numpy
# itself).  A request with a normal off the fast path (about 1.5% of normals) is
# redrawn by numpy from the same PCG64 state, so every number is numpy's; a
# self-check against numpy at first use turns the column path off entirely if a
# numpy version ever draws differently.

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_M128 = (1 << 128) - 1
_SS_INIT_A, _SS_MULT_A = 0x43B0D7E5, 0x931E8875
_SS_INIT_B, _SS_MULT_B = 0x8B51F9DD, 0x58F38DED
_SS_MIX_L, _SS_MIX_R, _SS_XSHIFT = 0xCA01F9DD, 0x4973F715, 16
_SS_POOL = 4
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_U64 = np.uint64
_LO32 = np.uint64(_M32)


def _u32_words(values: Sequence[int]) -> list[int]:
    """SeedSequence's entropy words: each non-negative int as 32-bit words, low first."""
    out: list[int] = []
    for v in values:
        v = int(v)
        if v < 0:
            raise ValueError(f"seed entropy must be non-negative, got {v}")
        if v == 0:
            out.append(0)
        while v:
            out.append(v & _M32)
            v >>= 32
    return out


@dataclass(frozen=True)
class StreamKey:
    """A draft key's SeedSequence pool with every word but the anchor position mixed in."""

    key: tuple[int, ...]
    mixer: Optional[tuple[int, int, int, int]]  # None: the key is too short to premix
    hash_calls: int

    @classmethod
    def of(cls, key: Sequence[int]) -> "StreamKey":
        """Premix ``key``; a key numpy would reject (or too short to premix) is left to numpy."""
        if not all(isinstance(v, (int, np.integer)) for v in key):
            return cls(tuple(key), None, 0)
        try:
            words = _u32_words(key)
        except ValueError:
            return cls(tuple(key), None, 0)
        if len(words) < _SS_POOL:
            return cls(tuple(key), None, 0)
        h = _SS_INIT_A
        calls = 0

        def hashmix(v: int) -> int:
            nonlocal h, calls
            v ^= h
            h = (h * _SS_MULT_A) & _M32
            v = (v * h) & _M32
            calls += 1
            return v ^ (v >> _SS_XSHIFT)

        def mix(x: int, y: int) -> int:
            r = (_SS_MIX_L * x - _SS_MIX_R * y) & _M32
            return r ^ (r >> _SS_XSHIFT)

        mixer = [hashmix(words[i]) for i in range(_SS_POOL)]
        for src in range(_SS_POOL):
            for dst in range(_SS_POOL):
                if src != dst:
                    mixer[dst] = mix(mixer[dst], hashmix(mixer[src]))
        for w in words[_SS_POOL:]:
            for dst in range(_SS_POOL):
                mixer[dst] = mix(mixer[dst], hashmix(w))
        return cls(tuple(key), (mixer[0], mixer[1], mixer[2], mixer[3]), calls)


def _hash_consts(init: int, mult: int, skip: int, n: int) -> list[tuple[np.uint32, np.uint32]]:
    """(xor, multiply) constants of ``n`` hash calls after ``skip`` of them."""
    h = (init * pow(mult, skip, 1 << 32)) & _M32
    out = []
    for _ in range(n):
        nxt = (h * mult) & _M32
        out.append((np.uint32(h), np.uint32(nxt)))
        h = nxt
    return out


def _seed_states(mixers: np.ndarray, hash_calls: int, position: np.ndarray) -> list[np.ndarray]:
    """SeedSequence(key + [position]).generate_state(4, uint64) per row, as 4 uint64 columns.

    ``mixers`` is [B, 4] uint32 (``StreamKey.mixer``, all with ``hash_calls``), ``position`` [B] < 2**32.
    """
    pool = [mixers[:, i].copy() for i in range(_SS_POOL)]
    word = position.astype(np.uint32)
    shift = np.uint32(_SS_XSHIFT)
    mix_l, mix_r = np.uint32(_SS_MIX_L), np.uint32(_SS_MIX_R)
    for dst, (hx, hm) in enumerate(_hash_consts(_SS_INIT_A, _SS_MULT_A, hash_calls, _SS_POOL)):
        v = (word ^ hx) * hm
        v ^= v >> shift
        r = mix_l * pool[dst] - mix_r * v
        pool[dst] = r ^ (r >> shift)
    words = []
    for i, (hx, hm) in enumerate(_hash_consts(_SS_INIT_B, _SS_MULT_B, 0, 2 * _SS_POOL)):
        v = (pool[i % _SS_POOL] ^ hx) * hm
        words.append((v ^ (v >> shift)).astype(np.uint64))
    return [words[2 * j] | (words[2 * j + 1] << _U64(32)) for j in range(4)]


def _mul64(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Full 64 x 64 -> 128-bit product of uint64 arrays, as (high, low)."""
    a0, a1 = a & _LO32, a >> _U64(32)
    b0, b1 = b & _LO32, b >> _U64(32)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> _U64(32)) + (p01 & _LO32) + (p10 & _LO32)
    return p11 + (p01 >> _U64(32)) + (p10 >> _U64(32)) + (mid >> _U64(32)), (p00 & _LO32) | (mid << _U64(32))


def _mul128(ahi, alo, bhi, blo):
    hi, lo = _mul64(alo, blo)
    return hi + ahi * blo + alo * bhi, lo


def _add128(ahi, alo, bhi, blo):
    lo = alo + blo
    return ahi + bhi + (lo < alo).astype(np.uint64), lo


def _split128(values: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([v >> 64 for v in values], dtype=np.uint64)[None, :],
            np.array([v & _M64 for v in values], dtype=np.uint64)[None, :])


_JUMPS: dict[int, tuple] = {}


def _jumps(n: int) -> tuple:
    """Per output k = 1..n: (M**(k+1), 1 + M + ... + M**k) mod 2**128 as uint64 halves."""
    if n not in _JUMPS:
        powers, sums, p, s = [], [], 1, 0
        for j in range(n + 2):
            if j >= 2:
                powers.append(p)
                sums.append(s)
            s = (s + p) & _M128
            p = (p * _PCG_MULT) & _M128
        _JUMPS[n] = (*_split128(powers), *_split128(sums))
    return _JUMPS[n]


def _pcg_outputs(state: list[np.ndarray], n: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The first ``n`` PCG64 outputs per row after numpy's seeding with ``state`` (4 uint64 columns).

    Returns ``[B, n]`` uint64 and the 128-bit ``(T, inc)`` halves the outputs were jumped from.
    """
    shi, slo, ihi, ilo = state
    inc_hi = (ihi << _U64(1)) | (ilo >> _U64(63))
    inc_lo = (ilo << _U64(1)) | _U64(1)
    thi, tlo = _add128(inc_hi, inc_lo, shi, slo)  # state after the first seeding step, plus initstate
    phi, plo, chi, clo = _jumps(n)
    ahi, alo = _mul128(thi[:, None], tlo[:, None], phi, plo)
    bhi, blo = _mul128(inc_hi[:, None], inc_lo[:, None], chi, clo)
    hi, lo = _add128(ahi, alo, bhi, blo)
    x = hi ^ lo
    rot = hi >> _U64(58)
    return (x >> rot) | (x << ((_U64(64) - rot) & _U64(63))), (thi, tlo, inc_hi, inc_lo)


class _Ziggurat:
    """numpy's ``random_standard_normal`` fast path: ``x = rabs * wi[idx]`` when ``rabs < ki[idx]``."""

    def __init__(self) -> None:
        self.wi = np.array([self._probe(i | (1 << 9)) for i in range(256)])  # rabs = 1: x = wi[idx]
        ki = np.zeros(256)
        ki[0] = self.wi[255] / self.wi[0] * 2.0**52
        ki[2:] = self.wi[1:-1] / self.wi[2:] * 2.0**52  # ki[1] = 0: layer 1 is always the slow path
        # A margin far above the rounding of this estimate: a draw near a threshold is left to numpy.
        self.ki_fast = np.maximum(ki - 4096.0, 0.0).astype(np.uint64)

    @staticmethod
    def _probe(raw: int) -> float:
        """numpy's standard normal when the next PCG64 output is ``raw``."""
        bg = np.random.PCG64(0)
        inc = bg.state["state"]["inc"]
        pre = ((raw - inc) * pow(_PCG_MULT, -1, 1 << 128)) & _M128  # steps to high half 0, low half raw
        bg.state = {"bit_generator": "PCG64", "state": {"state": pre, "inc": inc}, "has_uint32": 0, "uinteger": 0}
        return float(np.random.Generator(bg).standard_normal())

    def normals(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Standard normals from one output each, and where that is certainly numpy's value."""
        idx = (raw & _U64(0xFF)).astype(np.intp)
        rabs = (raw >> _U64(9)) & _U64(0x000FFFFFFFFFFFFF)
        x = rabs.astype(np.float64) * self.wi[idx]
        x = np.where(((raw >> _U64(8)) & _U64(1)).astype(bool), -x, x)
        return x, rabs < self.ki_fast[idx]


def _doubles(raw: np.ndarray) -> np.ndarray:
    return (raw >> _U64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


@dataclass
class BlockDraws:
    """The four draws of ``draft_block`` for a batch: [B], [B, gamma], [B, gamma], [B, gamma]."""

    block_normal: np.ndarray  # standard normals (scale applied by the caller)
    position_normal: np.ndarray
    u_accept: np.ndarray
    u_off: np.ndarray


_ZIGGURAT: Optional[_Ziggurat] = None
_COLUMN_PATH_OK: Optional[bool] = None


def _numpy_draws(gen: np.random.Generator, gamma: int, block_sigma: float, position_sigma: float):
    nb = gen.normal(0.0, block_sigma)
    npos = gen.normal(0.0, position_sigma, size=gamma)
    return nb, npos, gen.random(gamma), gen.random(gamma)


def block_draws(keys: Sequence[StreamKey], positions: np.ndarray, gamma: int, *,
                block_sigma: np.ndarray, position_sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What ``default_rng([*key, position])`` draws in ``draft_block``, for every row at once.

    Returns ``(block_noise [B], position_noise [B, gamma], u_accept [B, gamma], u_off [B, gamma])``
    with the sigmas applied exactly as ``Generator.normal(0.0, sigma)`` applies them.
    """
    global _ZIGGURAT, _COLUMN_PATH_OK
    if _COLUMN_PATH_OK is None:
        _ZIGGURAT = _Ziggurat()
        _COLUMN_PATH_OK = True
        _COLUMN_PATH_OK = _self_check()
    n = len(keys)
    positions = np.asarray(positions, dtype=np.int64)
    nb = np.empty(n)
    npos = np.empty((n, gamma))
    u_acc = np.empty((n, gamma))
    u_off = np.empty((n, gamma))
    exact = np.zeros(n, dtype=bool)
    if _COLUMN_PATH_OK and n:
        groups: dict[int, list[int]] = {}
        for i, k in enumerate(keys):
            if k.mixer is not None and 0 <= positions[i] <= _M32:
                groups.setdefault(k.hash_calls, []).append(i)
        for calls, rows in groups.items():
            rows_a = np.asarray(rows, dtype=np.intp)
            mixers = np.array([keys[i].mixer for i in rows], dtype=np.uint32).reshape(-1, _SS_POOL)
            raw, (thi, tlo, ihi, ilo) = _pcg_outputs(_seed_states(mixers, calls, positions[rows_a]), 1 + 3 * gamma)
            z, fast = _ZIGGURAT.normals(raw[:, : 1 + gamma])
            u = _doubles(raw[:, 1 + gamma:])
            # Generator.normal(0.0, sigma) is 0.0 + sigma * z in double, as here.
            nb[rows_a] = 0.0 + block_sigma[rows_a] * z[:, 0]
            npos[rows_a] = 0.0 + position_sigma[rows_a, None] * z[:, 1:]
            u_acc[rows_a] = u[:, :gamma]
            u_off[rows_a] = u[:, gamma:]
            exact[rows_a] = True
            slow = np.flatnonzero(~fast.all(axis=1))
            if slow.size:  # a normal off the fast path: numpy redraws the row from the same seeded state
                z_slow, u_slow = [], []
                for th, tl, ih, il in zip(thi[slow].tolist(), tlo[slow].tolist(), ihi[slow].tolist(),
                                          ilo[slow].tolist()):
                    inc = (ih << 64) | il
                    gen = _seeded_generator((((th << 64) | tl) * _PCG_MULT + inc) & _M128, inc)
                    z_slow.append(gen.standard_normal(1 + gamma))
                    u_slow.append(gen.random(2 * gamma))
                z, u = np.stack(z_slow), np.stack(u_slow)
                at = rows_a[slow]
                nb[at] = 0.0 + block_sigma[at] * z[:, 0]
                npos[at] = 0.0 + position_sigma[at, None] * z[:, 1:]
                u_acc[at] = u[:, :gamma]
                u_off[at] = u[:, gamma:]
    for i in np.flatnonzero(~exact):
        gen = np.random.default_rng([*keys[i].key, int(positions[i])])
        nb[i], npos[i], u_acc[i], u_off[i] = _numpy_draws(gen, gamma, float(block_sigma[i]),
                                                         float(position_sigma[i]))
    return nb, npos, u_acc, u_off


_BITGEN = np.random.PCG64(0)
_GENERATOR = np.random.Generator(_BITGEN)


def _seeded_generator(state: int, inc: int) -> np.random.Generator:
    """numpy's generator in the PCG64 state ``(state, inc)`` (one shared instance)."""
    _BITGEN.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc},
                     "has_uint32": 0, "uinteger": 0}
    return _GENERATOR


def _self_check() -> bool:
    """The column path draws what numpy draws (checked once per process, on a few hundred keys)."""
    rng = np.random.default_rng(12345)
    keys = [StreamKey.of((int(a), int(b), int(c), 3)) for a, b, c in rng.integers(0, 2**32, size=(256, 3))]
    positions = rng.integers(0, 4096, size=256)
    sig_b, sig_p = np.full(256, 2.2), np.full(256, 0.5)
    got = block_draws(keys, positions, 6, block_sigma=sig_b, position_sigma=sig_p)
    for i, k in enumerate(keys):
        want = _numpy_draws(np.random.default_rng([*k.key, int(positions[i])]), 6, 2.2, 0.5)
        if not all(np.array_equal(np.asarray(g[i]), np.asarray(w)) for g, w in zip(got, want)):
            return False
    return True


@dataclass
class DraftBatch:
    """``draft_block`` for every request of a batch, row for row ([B, gamma] unless noted)."""

    draft_tokens: np.ndarray  # int64
    confidence: np.ndarray  # float32, as the head reports it
    draft_logprob: np.ndarray  # log q(d_k)
    block_accept: np.ndarray  # [B] int64
    expected_block_accept: np.ndarray  # [B] float64
    realised: np.ndarray  # [B, gamma + 1] committed token ids at first_pos .. first_pos + gamma


def draft_blocks(tracks: Sequence[TargetTrack], keys: Sequence[StreamKey], first_pos: Sequence[int], *,
                 gamma: int, head_temperature: np.ndarray, greedy: Sequence[bool]) -> DraftBatch:
    """``draft_block(tracks[i], default_rng([*keys[i].key, first_pos[i]]), ...)`` for every ``i`` at once.

    Bit for bit the same numbers as the per-request function (the same draws, the
    same floating-point operations in the same order), plus the realised tokens
    at the anchor's ``gamma + 1`` positions.
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
    confidence = 1.0 / (1.0 + np.exp(-logit_c / head_temperature))
    realised_pos = pos0[:, None] + np.arange(gamma + 1)
    tok = np.take_along_axis(cand, x_idx[..., None], axis=2)[..., 0]
    return DraftBatch(
        draft_tokens=draft_tokens.astype(np.int64),
        confidence=confidence.astype(np.float32),
        draft_logprob=np.log(np.maximum(q_d, 1e-12)),
        block_accept=first_reject.astype(np.int64),
        expected_block_accept=np.cumprod(a, axis=1).sum(axis=1),
        realised=np.where(realised_pos >= natural[:, None], NO_TOKEN, tok),
    )
