"""Allocator settings for what the commands do: many large numpy arrays, each living for one chunk.

A quarter of ``dspark-obs estimate``'s and ``calibrate``'s CPU time was system time, spent faulting
fresh memory in (1M-row store: 3.0–4.5 of 13–19 CPU s; 22.5 of 94.5 at 10M). Two defaults cause it:

* numpy asks for transparent huge pages on every array of 4 MB or more (``madvise(MADV_HUGEPAGE)``);
  where the kernel's THP ``defrag`` setting is ``madvise`` (a common default) each such first touch
  may compact memory synchronously to find a 2 MB page;
* glibc serves each allocation above its mmap threshold (dynamic, 128 kB up to 32 MB) by a fresh
  ``mmap`` and unmaps it on free, so every chunk's arrays fault in anew (13.7k ``mmap`` and 12.8k
  ``munmap`` calls in one 1M-row ``estimate``).

:func:`tune_for_chunked_arrays` turns both off for the command's process and the processes it
starts: ``NUMPY_MADVISE_HUGEPAGE=0`` (numpy reads it when it is imported, so this runs first),
glibc's ``M_MMAP_THRESHOLD`` at its 32 MB maximum and ``M_TRIM_THRESHOLD`` at 256 MB, by
``mallopt`` here and as ``MALLOC_*_`` variables for spawned children (forked ones inherit the
settings). Freed chunk memory then stays in the heap for the next chunk.

Arrow's own allocations go to its jemalloc pool instead of the wheels' default, mimalloc
(``ARROW_DEFAULT_MEMORY_POOL=jemalloc``, and :func:`pyarrow.set_memory_pool` here): taking a 10M-row
``step_reqs`` table into step order for the schedule replay cost 14.1 CPU s with mimalloc, 12.8 of
them system time faulting fresh pages in, and 3.3–3.6 s with jemalloc (4.1 s with the system allocator).

The pool is named in ``ARROW_DEFAULT_MEMORY_POOL`` before pyarrow is imported, so Arrow never starts the
mimalloc pool at all (it did at import, then kept what it had reserved: 17 MB more at the peak of an
``ingest``).  A command that holds one document at a time (:data:`ONE_DOCUMENT_COMMANDS`: ``ingest``
decodes an 18 MB ``/server_info`` body, builds its tables, writes them, frees them, reads the next) takes
the system allocator instead: jemalloc kept the pages a body's tables freed for its own reuse beside
glibc's heap, and the two sets added up (ten bodies: peak 180 against 171 MB, the same CPU time).

Such a command also gives freed heap back sooner (:data:`ONE_DOCUMENT_TRIM_THRESHOLD`, 4 MB): a body's
parse frees lists and joined texts of a few MB each while its records are still alive, and with 256 MB
of free heap kept they stayed resident into the next body's peak (ten bodies of 18.3 MB: peak 171 against
160 MB, the same CPU time; a 128 kB threshold saved no more and cost 0.3 s of system time in trims).

A value the user set in the environment is left as it is. ``bench/RESULTS.md`` has the before/after
figures.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["tune_for_chunked_arrays", "give_back_freed_heap", "MMAP_THRESHOLD", "TRIM_THRESHOLD",
           "ONE_DOCUMENT_COMMANDS", "ONE_DOCUMENT_TRIM_THRESHOLD"]

MMAP_THRESHOLD = 32 * 1024 * 1024    # glibc's largest: arrays of a chunk (150k x gamma float64 = 7 MB) fit below
TRIM_THRESHOLD = 256 * 1024 * 1024   # free heap kept for the next chunk before it is given back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's malloc.h
ONE_DOCUMENT_COMMANDS = frozenset({"ingest"})
"""Commands whose Arrow allocations go to the system allocator (see the module docstring)."""
ONE_DOCUMENT_TRIM_THRESHOLD = 4 * 1024 * 1024
"""Free heap kept by :data:`ONE_DOCUMENT_COMMANDS` before it is given back (the others keep 256 MB)."""


def tune_for_chunked_arrays(environ=os.environ, *, command: str | None = None) -> dict[str, bool]:
    """Apply the settings above to this process and its future children; say which took effect here.
    ``command``: the command about to run (its Arrow pool, :data:`ONE_DOCUMENT_COMMANDS`).

    ``numpy_hugepage_off`` is False when numpy was imported before (its setting is then fixed for
    this process; children still get it); ``malloc`` is False off glibc or where the user set the
    variables.
    """
    numpy_off = "NUMPY_MADVISE_HUGEPAGE" not in environ and "numpy" not in sys.modules
    environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    user_malloc = "MALLOC_MMAP_THRESHOLD_" in environ or "MALLOC_TRIM_THRESHOLD_" in environ
    applied = False
    one_document = command in ONE_DOCUMENT_COMMANDS
    if not user_malloc:
        trim = ONE_DOCUMENT_TRIM_THRESHOLD if one_document else TRIM_THRESHOLD
        environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
        environ["MALLOC_TRIM_THRESHOLD_"] = str(trim)
        applied = _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and _mallopt(_M_TRIM_THRESHOLD, trim)
    pool = "system" if one_document else "jemalloc"
    return {"numpy_hugepage_off": numpy_off, "malloc": applied, "arrow_pool": _arrow_pool(environ, pool)}


def _arrow_pool(environ, name: str) -> bool:
    """Arrow's allocations on the ``name`` pool (``jemalloc``: the system allocator in a build without one),
    unless the user chose a pool; whether this process's pool was set."""
    if "ARROW_DEFAULT_MEMORY_POOL" in environ:
        return False
    environ["ARROW_DEFAULT_MEMORY_POOL"] = name   # read when Arrow first allocates: its default pool never starts
    import pyarrow as pa   # here, not at the top: pyarrow imports numpy, which must see NUMPY_MADVISE_HUGEPAGE first

    try:
        pool = pa.jemalloc_memory_pool() if name == "jemalloc" else pa.system_memory_pool()
    except NotImplementedError:   # a pyarrow built without jemalloc
        pool = pa.system_memory_pool()
        environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    pa.set_memory_pool(pool)
    return True


def give_back_freed_heap() -> bool:
    """Return the heap's free pages to the system now (glibc's ``malloc_trim``; False where there is none).

    The trim threshold gives back only the top of the heap; what a ``/server_info`` body freed in the middle
    (its records, lists and tables) stays resident until this (ten 18.3 MB bodies: the next body's decode
    started 11 MB lower)."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim(ctypes.c_size_t(0))
    return True


def _mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt``; False where there is none (musl, macOS, Windows)."""
    mallopt = _glibc("mallopt")
    return mallopt is not None and bool(mallopt(ctypes.c_int(param), ctypes.c_int(value)))


def _glibc(name: str):
    """The process's own C function ``name`` (glibc's, where it is linked); None off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
