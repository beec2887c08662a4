"""Which statements only read: the check behind read-only SQL, on DuckDB's own parse.

:func:`check_statement` is the second lock of :mod:`dspark_obs.sql_readonly` (the text a person
typed) and the guard of :func:`dspark_obs.sql.query` on read-only connections; a module of its
own so both use it without importing each other.  SELECT (which includes ``DESCRIBE``, ``SHOW``,
``SUMMARIZE``, ``FROM t``, ``VALUES``) runs; EXPLAIN [ANALYZE] only when what it explains parses
as a SELECT; a PRAGMA only from :data:`ALLOWED_PRAGMAS` (``IMPORT DATABASE`` parses as a PRAGMA).
"""

from __future__ import annotations

from typing import Any

import duckdb

__all__ = ["ALLOWED_PRAGMAS", "check_statement"]

ALLOWED_PRAGMAS = frozenset({
    "table_info", "show", "show_tables", "show_tables_expanded", "database_size", "version", "platform",
    "functions", "collations",
})
"""Pragmas that only describe the catalogue; every other PRAGMA is refused."""

_HOW = "the SQL console and `dspark-obs sql` are read-only; estimators write their tables through their own commands"


def _tokens(text: str) -> list[tuple[int, str, Any]]:
    """``(byte offset, text, token type)`` of each token, comments dropped."""
    raw = text.encode()
    tokens = duckdb.tokenize(text)
    out = []
    for i, (pos, kind) in enumerate(tokens):
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(raw)
        if kind != duckdb.token_type.comment:
            out.append((pos, raw[pos:end].decode(errors="replace").strip(), kind))
    return out


def _explained(statement) -> str:
    """The statement an EXPLAIN statement explains (its tail after EXPLAIN, ANALYZE and options)."""
    text = statement.query
    tokens = _tokens(text)
    i = 0
    if i < len(tokens) and tokens[i][1].upper() == "EXPLAIN":
        i += 1
    if i < len(tokens) and tokens[i][1] == "(":  # EXPLAIN (FORMAT json, ANALYZE) ...
        depth = 0
        while i < len(tokens):
            depth += tokens[i][1].count("(") - tokens[i][1].count(")")
            i += 1
            if depth <= 0:
                break
    if i < len(tokens) and tokens[i][1].upper() == "ANALYZE":
        i += 1
    if i >= len(tokens):
        return ""
    return text.encode()[tokens[i][0]:].decode()


def check_statement(statement) -> None:
    """Raise PermissionError unless ``statement`` (from ``extract_statements``) only reads.

    >>> check_statement(duckdb.extract_statements("EXPLAIN ANALYZE SELECT 1")[0])
    >>> check_statement(duckdb.extract_statements("EXPLAIN ANALYZE COPY (SELECT 1) TO 'x'")[0])
    Traceback (most recent call last):
    ...
    PermissionError: read-only: EXPLAIN of a COPY statement is refused ...
    """
    kind = statement.type.name
    if kind == "SELECT":
        return
    if kind == "EXPLAIN":
        tail = _explained(statement)
        try:
            inner = duckdb.extract_statements(tail) if tail.strip() else []
        except duckdb.Error as exc:
            raise PermissionError(f"read-only: could not parse what EXPLAIN explains ({exc}); "
                                  "only EXPLAIN [ANALYZE] SELECT ... is allowed") from None
        if len(inner) != 1 or inner[0].type.name != "SELECT":
            what = inner[0].type.name if len(inner) == 1 else f"{len(inner)} statements"
            raise PermissionError(f"read-only: EXPLAIN of a {what} statement is refused (EXPLAIN ANALYZE "
                                  f"would execute it); only EXPLAIN [ANALYZE] SELECT ... is allowed; {_HOW}")
        return
    if kind == "PRAGMA":
        tokens = _tokens(statement.query)
        name = tokens[1][1].lower() if len(tokens) > 1 and tokens[0][1].upper() == "PRAGMA" else ""
        if name in ALLOWED_PRAGMAS:
            return
        shown = name or statement.query.split(None, 1)[0].upper()
        raise PermissionError(f"read-only: PRAGMA {shown!r} is refused; allowed: SELECT, EXPLAIN [ANALYZE] "
                              f"SELECT, PRAGMA {', '.join(sorted(ALLOWED_PRAGMAS))}; {_HOW}")
    raise PermissionError(f"read-only: {kind} statements are refused; allowed: SELECT, EXPLAIN [ANALYZE] "
                          f"SELECT and catalogue PRAGMAs; {_HOW}")
