"""The product keeps its shape: no module over 500 lines, no function over 60 lines that does not say why.

A function may be long for a reason (a typer command declares one option a line; a hot loop keeps
its arrays on the stack); its docstring then says so in a paragraph starting ``Long:``.  The
estimators (``dspark_obs/estimators/``) are held to the same rule by their own checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = sorted(p for package in ("dspark_obs", "collectors") for p in (ROOT / package).rglob("*.py")
                 if "estimators" not in p.relative_to(ROOT).parts)
MAX_MODULE, MAX_FUNCTION = 500, 60


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_short_and_its_long_functions_say_why(path):
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE, f"{path.name}: {text.count(chr(10))} lines; split it by concept"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION and "Long:" not in (ast.get_docstring(node) or "")]
    assert not long, f"{path.name}: split, or say why in a 'Long:' paragraph of the docstring: {', '.join(long)}"
