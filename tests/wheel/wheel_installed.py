"""The product as installed from its wheel: the quick demo and the SQL macros run, nothing from the source tree.

Run by ``make test-wheel`` (``.ci/wheel-venv.sh``) in a clean venv, from a
directory outside the source tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("WHEEL_SOURCE_ROOT", "/nonexistent")).resolve()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("dspark-obs", path=str(Path(sys.executable).parent))
    assert exe, "the wheel installs the dspark-obs command beside the interpreter"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "COLUMNS": "200"})


def test_the_package_is_imported_from_the_venv_not_the_source_tree():
    import dspark_obs

    where = Path(dspark_obs.__file__).resolve()
    assert "site-packages" in where.parts and Path(sys.prefix).resolve() in where.parents
    assert (SOURCE / "dspark_obs") not in where.parents


def test_every_data_file_of_the_source_is_in_the_installed_package():
    import dspark_obs

    installed = Path(dspark_obs.__file__).parent
    source = SOURCE / "dspark_obs"
    wanted = {p.relative_to(source) for p in source.rglob("*") if p.is_file()
              and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert wanted and {p for p in wanted if not (installed / p).is_file()} == set()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    out = work / "demo-data"
    proc = _cli("demo", "--quick", "--out", str(out), cwd=work)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


def test_the_quick_demo_runs_from_the_wheel(demo):
    assert (demo / "ceiling").is_dir() and (demo / "runs").is_dir()


def test_the_table_macros_answer_from_the_wheel(demo):
    proc = _cli("sql", "--data", str(demo), "--format", "json",
                "SELECT count(*) AS n, count(DISTINCT run_id) AS runs FROM request_index(NULL)", cwd=demo.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert rows[0]["n"] > 0 and rows[0]["runs"] >= 2
    windows = _cli("sql", "--data", str(demo), "--format", "json",
                   "SELECT count(*) AS n FROM request_windows(NULL, NULL, NULL, NULL, NULL)", cwd=demo.parent)
    assert windows.returncode == 0, windows.stderr[-2000:]
    assert json.loads(windows.stdout)[0]["n"] > 0
