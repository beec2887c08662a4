"""The drafter's random streams, a whole batch at a time, bit for bit numpy's.

``model.draft_block`` draws from ``np.random.default_rng([*draft_key, anchor_position])``:
a fresh PCG64 seeded through a SeedSequence for every request and step, about
60 us each in numpy.  ``model.draft_blocks`` needs the very same numbers for a
whole batch, so :func:`block_draws` computes them column-wise: SeedSequence's
entropy mixing (its documented algorithm; everything but the anchor position is
mixed once per request, see :class:`StreamKey`), PCG64's XSL-RR 128/64 generator
jumped ahead to each output with 128-bit arithmetic on uint64 halves,
``next_double``, and the fast path of numpy's ziggurat ``random_standard_normal``
(layer widths read from numpy itself).  A request with a normal off the fast
path (about 1.5% of normals) is redrawn by numpy from the same PCG64 state, so
every number is numpy's; a self-check against numpy at first use turns the
column path off entirely if a numpy version ever draws differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

__all__ = ["StreamKey", "BlockDraws", "block_draws"]

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
