"""The product keeps its shape: short modules, long functions that say why, imports that say why.

No module over 500 lines, no function over 60 lines unless its docstring says why in a paragraph
starting ``Long:`` (a typer command declares one option a line; a hot loop keeps its arrays on the
stack).  An import inside a function is there for start-up cost or an optional extra; it says which
in a comment on its line or on the line above its block of imports.  Every package is named in the
import-linter contract that forbids circles among its modules (``pyproject.toml``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = sorted(p for package in ("dspark_obs", "collectors") for p in (ROOT / package).rglob("*.py"))
MAX_MODULE, MAX_FUNCTION = 500, 60


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_short_and_its_long_functions_say_why(path):
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE, f"{path.name}: {text.count(chr(10))} lines; split it by concept"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION and "Long:" not in (ast.get_docstring(node) or "")]
    assert not long, f"{path.name}: split, or say why in a 'Long:' paragraph of the docstring: {', '.join(long)}"


def _unexplained_imports(text: str) -> list[str]:
    lines = text.splitlines()
    found = []
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            said = "#" in " ".join(lines[node.lineno - 1:node.end_lineno])
            above = node.lineno - 2
            while not said and above >= 0:  # up through the block of imports to the comment above it
                line = lines[above].strip()
                if line.startswith("#"):
                    said = True
                elif not line.startswith(("import ", "from ")) and line not in ("", ")") and not line.endswith(","):
                    break
                above -= 1
            if not said:
                found.append(f"line {node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_inside_functions_say_why(path):
    found = _unexplained_imports(path.read_text())
    assert not found, (f"{path.name}: import at module level, or say why here (start-up cost, an optional "
                       f"extra) in a comment: {'; '.join(found)}")


def test_every_package_is_in_the_no_circles_contract():
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    ancestors = {a for c in contracts if c["type"] == "acyclic_siblings" for a in c["ancestors"]}
    packages = {".".join(p.parent.relative_to(ROOT).parts) for p in PRODUCT if p.name == "__init__.py"}
    assert packages - ancestors == set(), "add these packages to the acyclic_siblings contract"



def test_every_top_level_module_has_a_layer():
    import re
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layered = {name for c in contracts if c["type"] == "layers" for layer in c["layers"]
               for name in re.split(r"[:|]", layer.replace(" ", ""))}
    top = {f"dspark_obs.{p.stem}" for p in (ROOT / "dspark_obs").glob("*.py") if p.stem != "__init__"}
    top |= {f"dspark_obs.{p.parent.name}" for p in (ROOT / "dspark_obs").glob("*/__init__.py")}
    assert top - layered == set(), "give these modules a layer in pyproject.toml's layers contract"
