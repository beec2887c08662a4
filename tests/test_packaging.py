"""Every data file the package reads ships in the wheel (its package-data patterns cover it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_package_data_covers_every_non_python_file_of_the_package():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dspark_obs"]
    package = ROOT / "dspark_obs"
    covered = {p for pattern in patterns for p in package.glob(pattern)}
    data = {p for p in package.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
            and "__pycache__" not in p.parts}
    assert data, "the package has data files (the SQL queries)"
    assert sorted(str(p.relative_to(package)) for p in data - covered) == []
