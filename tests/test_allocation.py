"""The commands' allocator settings: numpy's huge-page advice off, freed chunk memory reused, the user's choice kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dspark_obs.allocation import (MMAP_THRESHOLD, ONE_DOCUMENT_TRIM_THRESHOLD, TRIM_THRESHOLD,
                                   tune_for_chunked_arrays)

# A child that tunes (or not), then allocates and frees an 8 MB array ten times: the page faults it took.
_CHILD = """
import os, resource, sys
if sys.argv[1] == "tuned":
    from dspark_obs.allocation import tune_for_chunked_arrays
    tune_for_chunked_arrays()
import numpy as np
from numpy._core import multiarray
a = np.ones(1 << 20)   # 8 MB, once, so both sides start warm
del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    a = np.ones(1 << 20)
    del a
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, multiarray._get_madvise_hugepage())
"""


def _child(mode: str) -> tuple[int, bool]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "NUMPY_MADVISE"))}
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], env=env, capture_output=True, text=True, check=True)
    faults, hugepage = out.stdout.split()
    return int(faults), hugepage == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and numpy's madvise are Linux's")
def test_freed_arrays_are_reused_without_faulting_in_again():
    plain_faults, plain_hugepage = _child("plain")
    tuned_faults, tuned_hugepage = _child("tuned")
    assert plain_hugepage and not tuned_hugepage
    # default glibc: each 8 MB array is a fresh mmap, faulted in anew (4 huge pages, or 2048 small ones, each time)
    assert plain_faults >= 10 * 4
    assert tuned_faults < 10   # the freed array's heap memory, already faulted in, serves the next


@pytest.mark.parametrize("command, trim, pool", [(None, TRIM_THRESHOLD, "jemalloc"),
                                                 ("estimate", TRIM_THRESHOLD, "jemalloc"),
                                                 ("ingest", ONE_DOCUMENT_TRIM_THRESHOLD, "system")])
def test_sets_the_variables_children_read(command, trim, pool):
    env: dict[str, str] = {}
    tune_for_chunked_arrays(env, command=command)
    assert env == {"NUMPY_MADVISE_HUGEPAGE": "0", "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
                   "MALLOC_TRIM_THRESHOLD_": str(trim), "ARROW_DEFAULT_MEMORY_POOL": pool}


# A child that tunes for a command, then fills and frees 32 MB of heap in 512 kB blocks (a last block
# kept at the top, with ``keep``): the kB of RSS given back, then those given back by ``give_back_freed_heap``.
_HEAP_CHILD = """
import sys
from dspark_obs.allocation import give_back_freed_heap, tune_for_chunked_arrays
tune_for_chunked_arrays(command=sys.argv[1])
def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 // 1024
blocks = [bytearray(512 * 1024) for _ in range(64)]   # below the mmap threshold: heap, each faulted in
top = bytearray(512 * 1024) if sys.argv[2] == "keep" else None
full = rss_kb()
del blocks
freed = rss_kb()
give_back_freed_heap()
print(full - freed, freed - rss_kb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's trim threshold is Linux's")
def test_a_one_document_command_gives_freed_heap_back():
    """``ingest`` returns the heap a body freed (it would sit in the next body's peak); the chunked
    commands keep it for their next chunk."""

    assert _given_back_kb("ingest", "free")[0] >= 24 * 1024
    assert _given_back_kb("estimate", "free")[0] < 8 * 1024


def _given_back_kb(command: str, top: str) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "NUMPY_MADVISE", "ARROW_DEFAULT"))}
    out = subprocess.run([sys.executable, "-c", _HEAP_CHILD, command, top], env=env, capture_output=True,
                         text=True, check=True)
    by_free, by_trim = out.stdout.split()
    return int(by_free), int(by_trim)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux's")
def test_freed_heap_below_a_live_block_goes_back_when_asked():
    """Heap freed under a block still in use is no top to trim: it stays resident until
    ``give_back_freed_heap`` (what ``ingest`` calls between bodies)."""
    by_free, by_trim = _given_back_kb("ingest", "keep")
    assert by_free < 8 * 1024 and by_trim >= 24 * 1024


def test_a_users_setting_wins():
    env = {"NUMPY_MADVISE_HUGEPAGE": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    applied = tune_for_chunked_arrays(env)
    assert env == {"NUMPY_MADVISE_HUGEPAGE": "1", "MALLOC_MMAP_THRESHOLD_": "65536",
                   "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    assert applied == {"numpy_hugepage_off": False, "malloc": False, "arrow_pool": False}


@pytest.mark.parametrize("command, pool", [("estimate", "jemalloc"), ("calibrate", "jemalloc"), ("ingest", "system")])
def test_a_command_allocates_arrow_memory_from_its_pool(command, pool):
    """The CLI's process takes Arrow's jemalloc pool (the wheels' default, mimalloc, faulted a 10M-row take in
    at four times the CPU), ``ingest`` the system allocator; a user's choice of pool is kept."""
    code = ("import typer, dspark_obs.cli as cli; ctx = typer.Context(typer.main.get_command(cli.app)); "
            f"ctx.invoked_subcommand = {command!r}; cli.main(ctx); "
            "import pyarrow as pa; print(pa.default_memory_pool().backend_name)")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == pool
    env["ARROW_DEFAULT_MEMORY_POOL"] = "mimalloc"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "mimalloc"


def test_says_numpy_was_imported_too_early():
    assert "numpy" in sys.modules   # pytest's process: numpy is in already
    assert tune_for_chunked_arrays({})["numpy_hugepage_off"] is False
