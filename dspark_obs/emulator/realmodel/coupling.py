"""Keyed uniforms and the draft/target coupling of the real-model emulator.

The property a companion run relies on: **the token committed at an output
position depends only on the prompt, the seed, the sampling key and the
position**, never on the verify window.  So the realised token is drawn from
the target first, ``x_t ~ p_t`` by inverse CDF with a uniform keyed by
``(seed, sampling key, absolute position, "target")`` — exactly what plain
sampling from the target with those uniforms would produce — and the draft is
drawn from its conditional given ``x_t`` under the maximal coupling of ``q_t``
and ``p_t``: ``d = x`` with probability ``min(p(x), q(x)) / p(x)``, otherwise
from ``(q - p)+`` normalised.  The draft's marginal is then ``q_t`` and
``P(accept | d) = min(1, p(d) / q(d))``, as under speculative sampling, and a
full-block verify accepts exactly the leading drafts equal to the realised
tokens.  Once a draft is rejected the drafter is off the realised trajectory:
later drafts come from ``q`` on the draft prefix with their own uniform.
Greedy requests: ``x = argmax p``, ``d = argmax q``.

Everything here is vectorised over a batch's rows at one block position.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import torch

PURPOSES = {"target": 0, "couple": 1, "residual": 2, "draft": 3}


def keyed_uniform(seed: int, key: int, position: int, purpose: str) -> float:
    """A uniform in [0, 1) from a hash of ``(seed, key, position, purpose)`` (process-independent)."""
    digest = hashlib.blake2b(f"{seed}|{key}|{position}|{PURPOSES[purpose]}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) / float(1 << 53)


def uniforms(seed: int, keys: Sequence[int], positions: Sequence[int], purpose: str) -> torch.Tensor:
    return torch.tensor([keyed_uniform(seed, k, p, purpose) for k, p in zip(keys, positions)],
                        dtype=torch.float64)


def inverse_cdf(prob: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row-wise sample of ``prob`` ``[B, V]`` (rows need not be normalised) at uniforms ``u`` ``[B]``."""
    cdf = torch.cumsum(prob, dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp_(max=prob.shape[-1] - 1)


def log_probs(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """float64 log-softmax of ``logits / T`` per row (``T`` is 1 for greedy rows)."""
    return torch.log_softmax(logits.to(torch.float64) / temperature[:, None], dim=-1)


def couple(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u_couple: torch.Tensor,
           u_residual: torch.Tensor) -> torch.Tensor:
    """Draft given the realised ``x``: ``x`` w.p. ``min(p(x), q(x)) / p(x)``, else from ``(q - p)+``."""
    rows = torch.arange(p.shape[0])
    px, qx = p[rows, x], q[rows, x]
    keep = u_couple * px < torch.minimum(px, qx)
    residual = (q - p).clamp_(min=0.0)
    other = inverse_cdf(residual, u_residual)
    # (q - p)+ is empty only when q == p, where keep is certain anyway.
    return torch.where(keep | (residual.sum(-1) <= 0), x, other)


def head_confidence(q_draft: np.ndarray, transform: tuple[float, float] | None,
                    sts: np.ndarray | None) -> np.ndarray:
    """What the head reports: ``q(d)``, or ``sigmoid(a logit q + b)`` with ``transform = (a, b)``;
    then SGLang's STS, ``sigmoid(logit(c) / T_k)``, when temperatures are loaded."""
    c = np.clip(np.asarray(q_draft, dtype=np.float64), 1e-6, 1 - 1e-6)
    if transform is not None:
        a, b = transform
        c = 1.0 / (1.0 + np.exp(-(a * np.log(c / (1 - c)) + b)))
    if sts is not None:
        c = np.clip(c, 1e-6, 1 - 1e-6)
        c = 1.0 / (1.0 + np.exp(-np.log(c / (1 - c)) / sts[None, : c.shape[1]]))
    return c
