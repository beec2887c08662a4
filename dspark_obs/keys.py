"""The one stable 64-bit key of a request id (or any resampling unit), used everywhere a rid is hashed.

The bootstrap's per-request weights (:mod:`dspark_obs.estimators.stats`), the
chunks' samples and shards (:mod:`dspark_obs.estimators.chunks`), the held-out
split of ``recalibration`` and the fleet layout's clustering
(:mod:`dspark_obs.fleet`) all key a request by this hash, so they agree on any
machine and in any process.

>>> stable_keys(["gsm8k-1"]).tolist() == stable_keys(["gsm8k-1"]).tolist(), stable_keys([None]).tolist() == stable_keys([""]).tolist()
(True, True)
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["stable_keys"]


def stable_keys(values) -> np.ndarray:
    """BLAKE2b (8 bytes, little-endian) of each value's text as uint64; ``None`` hashes as the empty string."""
    blake2b = hashlib.blake2b
    digests = b"".join([blake2b(("" if v is None else str(v)).encode(), digest_size=8).digest() for v in values])
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)   # one buffer, no Python int per value
