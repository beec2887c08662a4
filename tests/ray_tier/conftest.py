"""Ray tier: ``--engine ray`` gives the local path's tables, on a local directory and on a local S3.

Runs with the ``[ray]`` extra installed (``make test-ray``)::

    python -m pytest tests/ray_tier -p no:cacheprovider -o python_files='ray_*.py'

The test files are named ``ray_*.py`` so the main run never collects them; this
conftest is imported there too and must stay harmless without Ray.  Session
fixtures: a local Ray started here with ``ray.init(num_cpus=2)``, the quick demo
store, generated stores (``bench.gen_store``: 1M request-steps compared on a
directory and over S3) and a moto S3 server on 127.0.0.1 (``s3_endpoint``,
from the main conftest).  Each generated store's local tables are computed once
per session and compared with every Ray run of it.

Over S3 the 1M store is compared too: moto answers a ranged GET by copying the
whole object, which made each of DuckDB's reads of a row group of the 1M store's
145 MB tokens file copy 145 MB; ``tests/s3_server.py`` makes a ranged GET read
only its range, and the upload takes about 30 s.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path

import pytest

HAVE_RAY = importlib.util.find_spec("ray") is not None
GENERATED_ROWS = 1_000_000   # compared on a directory and over moto S3
INPUTS = ("runs", "steps", "step_reqs", "requests", "tokens")   # what a sidecar writes; the rest is computed


HANG_GUARD_S = 1800
"""The suite's per-test timeout (300 s) guards against hangs; a 1M-row comparison on a loaded 2-core
machine takes longer than that without hanging, so the tier's tests get this one instead."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/ray_tier" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.timeout(HANG_GUARD_S))


@pytest.fixture(scope="session")
def ray_engine(s3_endpoint):
    """A local Ray of 2 CPUs for the session (after the S3 credentials are in the environment)."""
    if not HAVE_RAY:
        pytest.fail("the Ray tier needs the [ray] extra: pip install -e '.[test,ray]' (make test-ray does)")
    import ray

    from dspark_obs.ray_engine import RayEngine

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield RayEngine()
    ray.shutdown()


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> Path:
    """The quick demo's store (a compact run, its cap-accept companion, the demo's own results)."""
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    root = tmp_path_factory.mktemp("ray-demo") / "data"
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(root)])
    assert result.exit_code == 0, result.output
    return root


def _generated(tmp_path_factory, rows: int, seed: int) -> Path:
    from bench.gen_store import generate

    root = tmp_path_factory.mktemp(f"ray-generated-{rows}")
    generate(root, rows=rows, seed=seed)
    return root


@pytest.fixture(scope="session")
def generated_store(tmp_path_factory) -> Path:
    """1M request-steps (7 chunks of the default 150k, a 200k-step fitting sample)."""
    return _generated(tmp_path_factory, GENERATED_ROWS, 5)


def inputs_copy(src: Path, dest: Path) -> Path:
    """The tables a sidecar wrote (``INPUTS``), copied: what every engine starts from."""
    shutil.copytree(src, dest, ignore=lambda d, names: [n for n in names if d == str(src) and n not in INPUTS])
    return dest


def upload(root: Path, url: str, *, tables) -> None:
    """Copy ``tables`` of a local store to an object-store URL (the layout is the same)."""
    import pyarrow.fs as pafs

    fs, base = pafs.FileSystem.from_uri(url)
    fs.create_dir(base.split("/")[0])
    for table in tables:
        pafs.copy_files(str(root / table), f"{base}/{table}", source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs)


def assert_rows_match(a, b, *, keys: list[str], rtol: float = 1e-9, what: str = "") -> None:
    """Same rows (sorted by ``keys``), ints and text exactly, floats to ``rtol`` (float addition order)."""
    assert a.num_rows == b.num_rows, f"{what}: {a.num_rows} rows locally, {b.num_rows} on Ray"
    assert a.column_names == b.column_names, what
    order = [(k, "ascending") for k in keys]
    ra, rb = a.sort_by(order).to_pylist(), b.sort_by(order).to_pylist()
    for x, y in zip(ra, rb):
        for name in x:
            u, v = x[name], y[name]
            if isinstance(u, float) and isinstance(v, float):
                assert (math.isnan(u) and math.isnan(v)) or math.isclose(u, v, rel_tol=rtol, abs_tol=1e-12), \
                    f"{what}: {name} {u} locally, {v} on Ray in {x}"
            else:
                assert u == v, f"{what}: {name} {u!r} locally, {v!r} on Ray in {x}"
