"""Every docstring example of the package runs (doctests), module by module.

Streamlit page scripts (they render on import) and the real-model emulator
(it needs torch, in its own tier) are left to their own tests.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import collectors
import dspark_obs

SKIP_PREFIXES = ("dspark_obs.ui.app", "dspark_obs.emulator.realmodel")


def _modules() -> list[str]:
    names = []
    for package in (dspark_obs, collectors):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.startswith(SKIP_PREFIXES):
                names.append(info.name)
    return sorted(names)


MODULES = _modules()


def test_the_walk_finds_the_package():
    assert len(MODULES) > 80 and "dspark_obs.report.stats" in MODULES and "collectors.importers.documents" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest(s) failed in {name}"
