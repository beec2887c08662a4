"""The run's fit as sums over parts of its sample, so the parts can stay where they were read.

The acceptance model, the drafter map and the choice between them are fitted by
optimisers that need only sums over the fitting sample's verified drafts: the
loss with its gradient and Hessian (damped Newton), the loss with its gradient
(L-BFGS), log-likelihood totals and counts.  The sample is cut into parts and every sum is the sum of
per-part terms added in part order.  The parts are fixed by the sample alone
(:func:`~dspark_obs.estimators.chunks.sample_parts`: rid ranges of about 25k steps), so the
fit does not depend on the chunk size or the number of workers.  So the fit is the same numbers whether the
parts sit in this process (:class:`LocalParts`) or on the Ray workers that read
them (:mod:`~dspark_obs.estimators.ceiling.ray`): each optimiser step sends the
coefficients out and gets the parts' sums back, and the passes over the sample
run in parallel.

A part's terms are computed with one BLAS thread (:func:`one_thread`):
OpenBLAS splits a matrix product differently with two threads than with one,
which moves the last bits, and a Ray worker runs with one.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

__all__ = ["FitPart", "Parts", "LocalParts", "one_thread", "summed", "map_parts"]


@dataclass(eq=False)
class FitPart:
    """One part of the fitting sample: ``[n, gamma]`` arrays (NaN / 0 unknown) and ``[n]`` per step."""

    conf: np.ndarray          # the head's confidence
    window: np.ndarray
    correct: np.ndarray
    greedy: np.ndarray
    p_topk: np.ndarray        # target probability of the draft from the top-k
    topk_state: np.ndarray    # 0 no top-k, 1 in it, 2 below it
    p_draft: np.ndarray       # target probability of the draft (any source)
    cache: dict = field(default_factory=dict, repr=False)   # design matrices, built once where the part lives

    @property
    def gamma(self) -> int:
        return int(self.conf.shape[1])

    def rows(self, start: int, stop: int) -> "FitPart":
        """Steps ``start:stop`` as a part of their own."""
        return FitPart(*(getattr(self, name)[start:stop] for name in
                         ("conf", "window", "correct", "greedy", "p_topk", "topk_state", "p_draft")))

    def cached(self, key, build: Callable[[], object]):
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]


class Parts(Protocol):
    """Where a fit's parts are: ``map(fn, *args)`` is ``[fn(part, *args) for part in parts]`` in part order."""

    def map(self, fn: Callable, *args) -> list: ...


_CONTROLLER: list = []   # threadpoolctl's view of the loaded BLAS, found once per process


@contextmanager
def one_thread():
    """BLAS on one thread (see the module docstring)."""
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController  # at call time: it inspects the loaded BLAS libraries

        _CONTROLLER.append(ThreadpoolController())
    with _CONTROLLER[0].limit(limits=1, user_api="blas"):
        yield


def map_parts(parts: list, fn: Callable, *args) -> list:
    """``[fn(part, *args) for part in parts]`` with one BLAS thread: what every holder of parts runs."""
    with one_thread():
        return [fn(part, *args) for part in parts]


class LocalParts:
    """The parts in this process."""

    def __init__(self, parts: list[FitPart]):
        self.parts = list(parts)

    def map(self, fn: Callable, *args) -> list:
        return map_parts(self.parts, fn, *args)


def summed(values: list):
    """The per-part terms added in part order (tuples element-wise)."""
    if not values:
        raise ValueError("no parts to sum")
    total = values[0]
    for v in values[1:]:
        total = tuple(a + b for a, b in zip(total, v)) if isinstance(total, tuple) else total + v
    return total
