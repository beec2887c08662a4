"""DuckDB over the Parquet store: one view per table, canned queries, formatting.

:func:`connect` opens an in-memory DuckDB whose views read the store's part
files at query time, so it can stay open while a collector writes.  Every
query goes through :func:`query`, which applies the row limit and the time
limit in one place.  Canned queries live beside this module as one ``.sql``
file each, with a header naming their parameters and output columns.
"""

from __future__ import annotations

import csv
import datetime as _dt
import decimal
import functools
import io
import json
import math
import re
import threading
from pathlib import Path
from typing import Any, Literal

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dspark_obs import fleet, quarantine, schema
from dspark_obs.sql_statements import check_statement
from dspark_obs.store import PART_GLOB, Store, is_url

__all__ = [
    "QueryTimeout", "open_database", "database_opened", "connect", "refresh", "canned_queries", "query", "format_result", "quote_ident",
]

SQL_DIR = Path(__file__).with_name("sql")
MACRO_DIR = SQL_DIR / "macros"
_ROOT_VAR = "dspark_obs_root"
_FILLED_VAR = "dspark_obs_filled"  # tables whose view reads files (the rest are empty views)
_FLEET_VAR = "dspark_obs_fleet"    # the fleet layout's manifest fingerprint the views were made with
_READ_ONLY_VAR = "dspark_obs_read_only"
_PARAM_DEFAULT = re.compile(r"^--\s+\$(\w+)\b.*?\bdefault\s+(NULL|-?\d+(?:\.\d+)?|'[^']*')", re.I)


class QueryTimeout(RuntimeError):
    """A query ran longer than its time limit and was interrupted."""


def quote_ident(name: str) -> str:
    """Quote an SQL identifier for DuckDB (the only place identifiers are quoted)."""
    return '"' + str(name).replace('"', '""') + '"'


def _quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# -- connection and views ----------------------------------------------------

WORKER_THREADS: int | None = None
"""DuckDB threads of each connection this process makes (None: one per core); a ``--jobs`` worker sets 1,
as its siblings take the other cores."""


_OPENED = False


def open_database(config: dict | None = None) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB.  Every database the package opens comes from here, so that
    :func:`database_opened` can tell whether this process may hold DuckDB's threads (which a forked
    ``--jobs`` worker must not inherit mid-flight)."""
    global _OPENED
    _OPENED = True
    return duckdb.connect(":memory:", config=config or {})


def database_opened() -> bool:
    """Whether this process has opened a DuckDB database through :func:`open_database`."""
    return _OPENED


def connect(root: str | Path, *, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per store table, plus ``step_reqs_w`` and table macros.

    Views glob ``<root>/<table>/*/part-*.parquet`` when queried, so files
    committed later are seen; a table without files is an empty view with the
    schema's columns (and ``run_id``) until :func:`refresh` finds files —
    :func:`query` refreshes before each query.  ``step_reqs_w`` is
    ``step_reqs`` with the request's ``workload`` and ``temperature`` and
    ``"window" = verify_len - 1``.  The table macros of ``sql/macros/``
    (``request_index``, ``request_windows``, ``ceiling_request_windows``) are
    the building blocks the canned queries share.

    ``read_only=True`` limits file access to ``root`` and locks the
    configuration; :func:`query` then accepts only reading statements
    (:func:`dspark_obs.sql_readonly.check_statement`).  This connection is for
    the package's own SQL (estimators, dashboard charts); SQL a person typed
    goes through :func:`dspark_obs.sql_readonly.run`, whose engine cannot reach
    any file.  ``quarantined_files`` lists part files moved aside as unreadable.
    """
    remote = is_url(root)
    if remote:  # s3://bucket/prefix?...: read through pyarrow's filesystem, no DuckDB extension
        store = object_store_for(str(root))
        root_text = store.root
    else:
        root_text = str(Path(root).resolve())
    if any(ch in root_text for ch in "*?[]{}'"):
        raise ValueError(f"data root {root_text!r} contains a glob or quote character; "
                         "move the store to a plain path")
    # A part file's path names one content forever (written once under a unique name, then renamed into
    # place), so its Parquet footer may be kept: each chunk query of a run otherwise re-read the footers of
    # every file of the tables it joins (calibrate's 67 count queries at 10M rows: 12.4 -> 10.3 CPU s).
    con = open_database({"threads": WORKER_THREADS} if WORKER_THREADS else None)
    con.execute("SET parquet_metadata_cache = true")
    con.execute("SET TimeZone = 'UTC'")  # the store is UTC; show it so on every machine
    if remote:
        con.register_filesystem(fsspec_filesystem(store))
    con.execute(f"SET VARIABLE {_ROOT_VAR} = {_quote_literal(str(root) if remote else root_text)}")
    con.execute(f"SET VARIABLE {_FILLED_VAR} = []::VARCHAR[]")
    con.execute(f"SET VARIABLE {_FLEET_VAR} = ''")
    con.execute(f"SET VARIABLE {_READ_ONLY_VAR} = {str(read_only).lower()}")
    refresh(con)
    for path in sorted(MACRO_DIR.glob("*.sql")):  # table macros over the views (bound when called)
        con.execute(path.read_text())
    if read_only and not remote:
        con.execute(f"SET allowed_directories = [{_quote_literal(root_text + '/')}]")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    return con


def root_of(con: duckdb.DuckDBPyConnection) -> Path | str | None:
    """The data root a connection from :func:`connect` reads (a URL for object stores), or None."""
    root = _variable(con, _ROOT_VAR)
    if root is None:
        return None
    return root if is_url(root) else Path(root)


def connection_and_store(con_or_store):
    """``(connection, Store)`` from a Store, a data root, or a connection made by :func:`connect`.

    Estimators accept any of the three; they read through the connection and
    write their result tables through the store.
    """
    if isinstance(con_or_store, Store):
        return connect(con_or_store.location), con_or_store
    if isinstance(con_or_store, (str, Path)):
        return connect(con_or_store), Store(con_or_store)
    root = root_of(con_or_store)
    if root is None:
        raise TypeError("expected a Store, a data root, or a connection from dspark_obs.sql.connect")
    refresh(con_or_store)  # a caller's connection may predate files written since
    return con_or_store, Store(root)


@functools.lru_cache(maxsize=16)
def object_store_for(url: str) -> Store:
    """One Store per object-store URL (its filesystem holds the connection)."""
    return Store(url)


@functools.lru_cache(maxsize=16)
def fsspec_filesystem(store: Store):
    """An object store's pyarrow filesystem as fsspec, for ``duckdb.register_filesystem`` (a read position
    per DuckDB thread: :mod:`dspark_obs.objstore_reads`); one per store, so every connection to it shares
    what the listings said and the files opened (one HEAD per file, not several per file per query)."""
    from dspark_obs.objstore_reads import duckdb_filesystem  # at call time: only object stores need fsspec

    return duckdb_filesystem(store.fs, store.scheme)


def _tables_with_files(root: str) -> set[str]:
    """Tables with part files in the old (flat) layout: directly under ``run_id=<id>/``."""
    if is_url(root):
        return set(object_store_for(root).flat_tables()) & set(schema.TABLES)   # one listing, not one per table
    base = Path(root)
    return {t for t in schema.TABLES if next(base.glob(f"{t}/*/{PART_GLOB}"), None) is not None}


def _fleet_state(root: str) -> tuple[str, dict[str, list[str]]]:
    """The fleet layout's manifest fingerprint and committed files per table, as DuckDB paths."""


    if is_url(root):
        store = object_store_for(root)
        fs, base, prefix = store.fs, store.base, f"{store.scheme}://"
    else:
        if not (Path(root) / fleet.MANIFEST_DIR).is_dir():
            return "", {}
        fs, base, prefix = pafs.LocalFileSystem(), str(Path(root).resolve()), ""
    fingerprint = fleet.manifest_fingerprint(fs, base)
    files: dict[str, list[str]] = {}
    for path in fleet.committed_files(fs, base) if fingerprint else []:
        files.setdefault(path[len(base) + 1:].split("/", 1)[0], []).append(prefix + path)
    return fingerprint, files


def refresh(con: duckdb.DuckDBPyConnection) -> None:
    """Re-point views whose table gained its first file or lost its last one.

    Cheap when nothing changed (one directory probe per table); a no-op on a
    connection not made by :func:`connect`.
    """
    root = _variable(con, _ROOT_VAR)
    if root is None:
        return
    if not is_url(root):
        moved = quarantine.sweep(root)  # one truncated file must not fail the whole view
        if moved or "quarantined_files" not in _views(con):
            con.register("_dspark_obs_quarantine", quarantine.listing(root))
            con.execute("CREATE OR REPLACE VIEW quarantined_files AS SELECT * FROM _dspark_obs_quarantine")
    filled = set(_variable(con, _FILLED_VAR) or [])
    views = _views(con)
    now_filled = _tables_with_files(root)
    fingerprint, fleet_files = _fleet_state(root)
    fleet_changed = fingerprint != (_variable(con, _FLEET_VAR) or "")
    if is_url(root):
        root = object_store_for(root).root
    changed = [t for t in schema.TABLES if (t in now_filled) != (t in filled) or t not in views or fleet_changed]
    for table in changed:
        con.execute(_view_sql(con, root, table, table in now_filled, fleet_files.get(table, [])))
    if changed or "step_reqs_w" not in views:
        con.execute(_STEP_REQS_W)
    if now_filled != filled:
        names = ", ".join(_quote_literal(t) for t in sorted(now_filled))
        con.execute(f"SET VARIABLE {_FILLED_VAR} = [{names}]::VARCHAR[]")
    if fleet_changed:
        con.execute(f"SET VARIABLE {_FLEET_VAR} = {_quote_literal(fingerprint)}")


_STEP_REQS_W = """
CREATE OR REPLACE VIEW step_reqs_w AS
SELECT s.*, q.workload, q.temperature, s.verify_len - 1 AS "window"
FROM step_reqs AS s
LEFT JOIN (
    SELECT run_id, rid, any_value(workload) AS workload, any_value(temperature) AS temperature
    FROM requests GROUP BY run_id, rid
) AS q ON s.run_id = q.run_id AND s.rid = q.rid
"""


def _views(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}


def _variable(con: duckdb.DuckDBPyConnection, name: str) -> Any:
    return con.execute(f"SELECT getvariable({_quote_literal(name)})").fetchall()[0][0]


def _view_sql(con: duckdb.DuckDBPyConnection, root: Path | str, table: str, has_files: bool,
              fleet_files: list[str] = ()) -> str:
    """The view of ``table``: schema columns in order, then ``run_id``.

    The typed empty selection is unioned by name so a column absent from every
    file (an older file version) still has the schema's type; with no files it
    is the whole view.  Files of the old layout are globbed (``run_id=*/part-*``);
    files of the fleet layout are the committed ones (:mod:`dspark_obs.fleet`),
    listed, with ``run_id`` from their path.
    """
    file_schema = schema.schema_for(table)
    types = con.from_arrow(file_schema.empty_table()).types
    empty = ", ".join(f"CAST(NULL AS {t}) AS {quote_ident(f.name)}" for f, t in zip(file_schema, types))
    empty = f"SELECT {empty}, CAST(NULL AS VARCHAR) AS run_id WHERE false"
    columns = ", ".join(quote_ident(n) for n in [*file_schema.names, "run_id"])
    view = quote_ident(table)
    sources = []
    if has_files:
        glob = _quote_literal(f"{root}/{table}/*/{PART_GLOB}")
        options = "hive_partitioning = true, union_by_name = true, hive_types = {'run_id': 'VARCHAR'}"
        source = f"SELECT * FROM read_parquet({glob}, {options})"
        if table == "runs":  # one row per run: while an upsert is replacing it, keep the newest file
            source = (f"SELECT * EXCLUDE (filename) FROM read_parquet({glob}, {options}, filename = true) "
                      "QUALIFY filename = max(filename) OVER (PARTITION BY run_id)")
        sources.append(source)
    if fleet_files:
        listed = "[" + ", ".join(_quote_literal(str(p)) for p in fleet_files) + "]"
        sources.append(f"SELECT * EXCLUDE (filename), regexp_extract(filename, '/run_id=([^/]+)/', 1) AS run_id "
                       f"FROM read_parquet({listed}, hive_partitioning = false, union_by_name = true, filename = true)")
    if not sources:
        return f"CREATE OR REPLACE VIEW {view} AS SELECT {columns} FROM ({empty})"
    union = " UNION ALL BY NAME ".join(f"({src})" for src in sources)
    return (f"CREATE OR REPLACE VIEW {view} AS SELECT {columns} "
            f"FROM ({union} UNION ALL BY NAME {empty})")


# -- canned queries ----------------------------------------------------------

def canned_queries() -> dict[str, tuple[str, str]]:
    """``{name: (description, sql_text)}`` for every ``sql/*.sql`` file.

    The name is the file stem; the description is the first comment line.
    """
    out = {}
    for path in sorted(SQL_DIR.glob("*.sql")):
        text = path.read_text()
        first = next((ln for ln in text.splitlines() if ln.startswith("--")), "--")
        out[path.stem] = (first.lstrip("-").strip(), text)
    return out


def _param_defaults(sql_text: str) -> dict[str, Any]:
    """Defaults declared in a canned query header: ``--   $name ... default <literal>``."""
    defaults = {}
    for line in sql_text.splitlines():
        m = _PARAM_DEFAULT.match(line)
        if m:
            name, lit = m.groups()
            if lit.upper() == "NULL":
                defaults[name] = None
            elif lit.startswith("'"):
                defaults[name] = lit[1:-1]
            else:
                defaults[name] = float(lit) if "." in lit else int(lit)
    return defaults


def query(
    con: duckdb.DuckDBPyConnection,
    sql_or_name: str,
    params: dict[str, Any] | None = None,
    *,
    timeout_s: float | None = 30.0,
    limit: int | None = None,
) -> pa.Table:
    """Run one statement (or a canned query by name) and return an Arrow table.

    ``params`` binds ``$name`` parameters; canned queries fill in the defaults
    of their header.  ``limit`` caps the rows returned; ``timeout_s`` (None =
    no limit) interrupts the query and raises :class:`QueryTimeout`.
    """
    canned = canned_queries()
    params = dict(params or {})
    sql_text = sql_or_name
    is_canned = sql_or_name.strip() in canned
    if is_canned:
        sql_text = canned[sql_or_name.strip()][1]
        params = {**_param_defaults(sql_text), **params}
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    refresh(con)
    statements = con.extract_statements(sql_text)
    if len(statements) != 1:
        raise ValueError(f"expected exactly one SQL statement, got {len(statements)}; run them one at a time")
    statement = statements[0]
    kind = statement.type.name
    if _variable(con, _READ_ONLY_VAR):
        check_statement(statement)  # on DuckDB's parse, never on the text
    if is_canned:  # a default the text no longer uses would be a DuckDB error
        unknown = set(params) - statement.named_parameters
        if unknown:
            raise ValueError(f"unknown parameters {sorted(unknown)} for {sql_or_name.strip()!r}; "
                             f"it takes {sorted(statement.named_parameters) or 'none'}")
    result = _run_with_timeout(con, _strip_tail(statement.query), params or None, timeout_s,
                               limit if kind == "SELECT" else None)
    if limit is not None and result.num_rows > limit:
        result = result.slice(0, limit)
    return result


def _strip_tail(text: str) -> str:
    """Drop trailing comments and the final ``;`` so the statement can be wrapped (LIMIT)."""
    # duckdb.tokenize reports byte offsets: cut the UTF-8 bytes, not the str.
    raw = text.encode()
    tokens = duckdb.tokenize(text)
    while tokens:
        pos, kind = tokens[-1]
        if kind == duckdb.token_type.comment or (kind == duckdb.token_type.operator and raw[pos:pos + 1] == b";"):
            raw = raw[:pos]
            tokens.pop()
        else:
            break
    return raw.decode().rstrip()


def _run_with_timeout(con, body: str, params, timeout_s: float | None, limit: int | None) -> pa.Table:
    """Run ``body``, wrapped in a LIMIT relation if asked, under a timer that interrupts it."""
    fired = threading.Event()

    def _interrupt() -> None:
        fired.set()
        con.interrupt()

    timer = threading.Timer(timeout_s, _interrupt) if timeout_s is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        rel = con.sql(body, params=params)
        if rel is None:  # a statement without a result
            return pa.table({})
        return (rel.limit(limit) if limit is not None else rel).to_arrow_table()
    except duckdb.InterruptException as exc:
        if fired.is_set():
            raise QueryTimeout(
                f"query exceeded the time limit of {timeout_s:g} s and was interrupted; "
                "pass a larger timeout_s (or None for no limit), or narrow it with WHERE/LIMIT"
            ) from exc
        raise
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()


# -- formatting ----------------------------------------------------------------

def _readable_float(x: float, digits: int = 6) -> float:
    """Round to ``digits`` significant digits but never drop integer digits."""
    if x == 0 or not math.isfinite(x):
        return x
    places = digits - 1 - math.floor(math.log10(abs(x)))
    return round(x, max(places, 0))


def _plain(value: Any) -> Any:
    """A JSON-friendly Python value: readable floats, ISO times, maps as dicts."""
    if isinstance(value, float):
        return _readable_float(value) if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else _readable_float(float(value))
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):  # an Arrow map
            return {str(k): _plain(v) for k, v in value}
        return [_plain(v) for v in value]
    return value


def _cell(value: Any) -> str:
    """One value as text for csv and table output ('' for null)."""
    value = _plain(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def format_result(table: pa.Table, fmt: Literal["table", "csv", "json"] = "table", *,
                  width: int | None = None) -> str:
    """Render a query result as an aligned text table, CSV (with header) or JSON.

    JSON is an array of objects, one per line; floats are rounded to six
    significant digits (integer digits are kept) in every format; text is
    printed as text (no ``\\u`` escapes).  ``width`` folds the table's cells to
    fit that many columns (default: as wide as the widest cells).
    """
    rows = table.to_pylist()
    names = table.column_names
    if fmt == "json":
        lines = [json.dumps({k: _plain(r[k]) for k in names}, allow_nan=False, ensure_ascii=False) for r in rows]
        return "[\n" + ",\n".join(lines) + "\n]" if lines else "[]"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([_cell(r[k]) for k in names] for r in rows)
        return buf.getvalue()
    if fmt == "table":
        return _rich_table(table, names, rows, width)
    raise ValueError(f"unknown format {fmt!r}; use 'table', 'csv' or 'json'")


def _rich_table(table: pa.Table, names: list[str], rows: list[dict], width: int | None = None) -> str:

    out = Table(show_edge=True, header_style="bold")
    for name, col in zip(names, table.columns):
        numeric = pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_decimal(col.type)
        out.add_column(Text(name), justify="right" if numeric else "left", overflow="fold")
    cells = [[_cell(r[k]) if r[k] is not None else "null" for k in names] for r in rows]
    for row in cells:  # stored strings are text, never rich markup ('[/x]' once crashed the table)
        out.add_row(*(Text(c) for c in row))
    widths = [max([len(n), *(len(row[i]) for row in cells)]) for i, n in enumerate(names)]
    console = Console(file=io.StringIO(), width=width or max(80, sum(widths) + 3 * len(names) + 4),
                      color_system=None, force_terminal=False, highlight=False)
    console.print(out)
    return console.file.getvalue()
