"""Loops compiled with numba, for the per-cell work numpy can only do in many whole-array passes.

numba is imported on the first call of a compiled function, so a command that runs none does not
load LLVM (about 0.4 CPU s and 120 MB); its machine code is cached beside the function's module.
"""

from __future__ import annotations

import functools
from typing import Callable

__all__ = ["jit", "warm"]


@functools.cache
def jit(func: Callable) -> Callable:
    """``func`` compiled in nopython mode, on its first use (a module-level function of plain arrays)."""
    import numba  # here, not at the top: LLVM loads only for a command that runs a compiled loop

    try:
        return numba.njit(cache=True, nogil=True)(func)
    except RuntimeError:   # no place to cache it (a read-only install and home): compiled in each process
        return numba.njit(nogil=True)(func)


def warm() -> None:
    """Load numba and its compiler's runtime now (about 0.5 CPU s, most of it the first compiled call of a
    process, whichever loop it is; the next loops load from the cache in milliseconds): a ``--jobs`` worker
    does this while the command plans, instead of in its first task."""
    jit(_first)(0)


def _first(x):
    return x
