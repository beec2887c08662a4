"""Product code does not repeat itself: no non-trivial block of six or more lines stands in two places.

Python: pylint's ``symilar`` over ``dspark_obs/`` and ``collectors/``, comments, docstrings, imports and
signatures left out (so typer's option declarations, which live in signatures, do not count).  symilar
compares files with each other, never a file with itself, so each module goes in as its top-level
pieces (each function, each method, a class's own body, each run of module statements), at their own
line numbers: a repeat between two functions of one module is found too (one inside a single function
is not).  SQL (which symilar does not read): the ``.sql`` files under ``dspark_obs/sql/``, comments,
case, white space and lines of bare punctuation folded away; no six-line window may stand twice.

A repeat is fixed by making one piece of code serve (a function, a SQL macro under
``dspark_obs/sql/macros/``); there is no allow-list.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import re
from collections import defaultdict
from pathlib import Path

from pylint.checkers.symilar import Symilar

ROOT = Path(__file__).resolve().parents[1]
MIN_LINES = 6
PYTHON = sorted(p for package in ("dspark_obs", "collectors") for p in (ROOT / package).rglob("*.py"))
SQL = sorted((ROOT / "dspark_obs" / "sql").rglob("*.sql"))


def _pieces(path: Path) -> list[tuple[int, int, int]]:
    """``(first line, last line, indent)`` of a module's top-level pieces (1-based, inclusive)."""
    spans, loose = [], []

    def flush() -> None:
        if loose:
            spans.append((loose[0][0], loose[-1][1], loose[0][2]))
            loose.clear()

    def span(node: ast.stmt) -> tuple[int, int, int]:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return first, node.end_lineno, node.col_offset

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                flush()
                spans.append(span(node))
            elif isinstance(node, ast.ClassDef):
                flush()
                walk(node.body)
                flush()
            else:
                loose.append(span(node))
        flush()

    walk(ast.parse(path.read_text()).body)
    return spans


def _stream(lines: list[str], first: int, last: int, indent: int) -> io.StringIO:
    """Lines ``first..last`` at their own line numbers, a method's indent taken off so they parse alone.

    Lines indented less than the piece are inside a string literal and stay as they are.
    """
    pad = " " * indent
    body = [line[indent:] if line.startswith(pad) else line for line in lines[first - 1:last]]
    return io.StringIO("\n" * (first - 1) + "".join(body))


def _symilar(paths: list[Path], root: Path) -> dict[str, frozenset[str]]:
    """symilar's report of repeated blocks among the pieces of ``paths``: places and lines -> the files."""
    # symilar reports a run of more than min_lines lines (pylint's '>' in _find_common): ask for one less
    sim = Symilar(min_lines=MIN_LINES - 1, ignore_comments=True, ignore_docstrings=True, ignore_imports=True,
                  ignore_signatures=True)
    for path in paths:
        lines = path.read_text().splitlines(keepends=True)
        for first, last, indent in _pieces(path):
            sim.append_stream(str(path.relative_to(root)), _stream(lines, first, last, indent))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sim.run()
    report = out.getvalue()
    repeats = {}
    for block in re.split(r"\n(?=\d+ similar lines in \d+ files\n)", report):
        places = re.findall(r"^==(.+?):\[(\d+):(\d+)\]$", block, flags=re.M)
        if len(places) >= 2:
            text = "\n".join(block.splitlines()[len(places) + 1:])
            repeats[" ~ ".join(f"{name}:{int(a) + 1}-{b}" for name, a, b in places) + "\n" + text] = \
                frozenset(name for name, _, _ in places)
    return repeats


def python_repeats(paths: list[Path], root: Path = ROOT) -> list[str]:
    """symilar's repeated blocks among the pieces of ``paths``."""
    return list(_symilar(paths, root))


@functools.cache
def _product_repeats() -> dict[str, frozenset[str]]:
    return _symilar(PYTHON, ROOT)


def sql_repeats(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Six-line windows of normalised SQL that stand in two places, one entry per window."""
    seen: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for path in paths:
        kept = []
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            text = " ".join(re.sub(r"--.*", "", raw).split()).lower()
            if not re.fullmatch(r"[(),;]*", text):
                kept.append((number, text))
        for i in range(len(kept) - MIN_LINES + 1):
            window = tuple(text for _, text in kept[i:i + MIN_LINES])
            seen[window].append((str(path.relative_to(root)), kept[i][0]))
    return [" ~ ".join(f"{name}:{line}" for name, line in places) + "\n" + "\n".join(window)
            for window, places in seen.items() if len(places) > 1]


def test_product_python_repeats_no_block_of_six_lines():
    repeats = list(_product_repeats())
    assert not repeats, "make one piece of code serve:\n\n" + "\n\n".join(repeats)


def test_product_sql_repeats_no_block_of_six_lines():
    repeats = sql_repeats(SQL)
    assert not repeats, "make one piece serve (a macro in dspark_obs/sql/macros/):\n\n" + "\n\n".join(repeats)


def test_the_checks_find_a_repeat_between_two_functions_of_one_module_and_between_sql_files(tmp_path):
    block = "".join(f"    v{i} = v{i - 1} * {i} + len(items)\n" for i in range(1, MIN_LINES + 1))  # six lines
    module = tmp_path / "m.py"
    module.write_text(f"def first(items):\n    v0 = 1\n{block}    return 1\n\n\n"
                      f"def second(items):\n    v0 = 2\n{block}    return 2\n")
    assert len(python_repeats([module], tmp_path)) == 1
    module.write_text(module.read_text().replace("v3 = v2 * 3", "v3 = v2 * 4", 1))  # five lines at most
    assert python_repeats([module], tmp_path) == []
    sql = "".join(f"SELECT c{i}, count(*) FROM t{i} GROUP BY c{i}\n" for i in range(MIN_LINES))
    (tmp_path / "a.sql").write_text("-- one\n" + sql)
    (tmp_path / "b.sql").write_text(sql.upper())
    assert len(sql_repeats([tmp_path / "a.sql", tmp_path / "b.sql"], tmp_path)) == 1
    (tmp_path / "b.sql").write_text(sql.replace("c3", "c9"))
    assert sql_repeats([tmp_path / "a.sql", tmp_path / "b.sql"], tmp_path) == []
