"""Read-only SQL for text a person typed: ``dspark-obs sql`` and the dashboard's console.

Why a module of its own: a statement check alone does not make SQL read-only.
DuckDB's ``EXPLAIN ANALYZE`` *executes* the statement it explains, so
``EXPLAIN ANALYZE COPY ... TO '<root>/steps/run_id=x/part-...'`` once wrote
into the store, and a directory allow-list of the data root lets the engine
write there as readily as read.  Two independent locks are applied here, and
either one alone refuses every bypass known:

1. **The engine cannot touch a file.**  :func:`open_connection` opens a fresh
   in-memory DuckDB, exposes each store table as a view over a *registered
   pyarrow dataset* (the part files are read by pyarrow, not by DuckDB's file
   system), creates the table macros, and only then sets
   ``enable_external_access = false`` (no path is allowed, not even the data
   root) and ``lock_configuration = true``.  A COPY, ATTACH, INSTALL or
   ``read_csv('/etc/passwd')`` fails inside DuckDB whatever the text.
2. **Only reading statements run.**  :func:`check_statement` looks at DuckDB's
   own parse (``extract_statements`` and the statement type), never at the
   text: SELECT (which includes ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``,
   ``FROM t``, ``VALUES``), EXPLAIN [ANALYZE] only when what it explains parses
   as a SELECT, and a PRAGMA only from a short list of catalogue pragmas
   (``IMPORT DATABASE`` parses as a PRAGMA).

Each query gets a connection of its own (:func:`run`), closed afterwards, so
nothing one query does — a variable, a temporary object, an interrupted
statement — is seen by the next query, the next CLI call or another browser
session.  Canned queries run the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from dspark_obs import quarantine, schema
from dspark_obs import sql as sqlmod
from dspark_obs.sql import object_store_for
from dspark_obs.sql_statements import ALLOWED_PRAGMAS, check_statement  # the second lock (see above)
from dspark_obs.store import Store, is_url, table_read_schema

__all__ = ["open_connection", "check_statement", "run", "ALLOWED_PRAGMAS"]

_PARTITIONING = ds.partitioning(pa.schema([("run_id", pa.string())]), flavor="hive")


def _table_files(root: str | Path, table: str) -> tuple[list[str], Any, str]:
    """``(files, pyarrow filesystem, base dir)`` of one table; ``runs``: the newest file per run."""

    store = object_store_for(str(root)) if is_url(root) else Store(root)
    return store.part_files(table), store.fs, f"{store.base}/{table}"


def _dataset(root: str | Path, table: str) -> ds.Dataset | pa.Table:

    read_schema = table_read_schema(table)
    files, fs, base = _table_files(root, table)
    if not files:
        return read_schema.empty_table()
    return ds.dataset(files, schema=read_schema, format="parquet", filesystem=fs,
                      partitioning=_PARTITIONING, partition_base_dir=base)


def open_connection(root: str | Path) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB over ``root`` that cannot open, write or attach any file.

    Views have the same names and columns as :func:`dspark_obs.sql.connect`'s
    (one per table, ``step_reqs_w``, the table macros); they read the part files
    that exist now, through pyarrow.  Close it after one query (see :func:`run`).
    """

    local = not is_url(root)
    if local:
        quarantine.sweep(root)  # a truncated file is moved aside, not fatal to the query
    con = sqlmod.open_database()
    try:
        con.execute("SET TimeZone = 'UTC'")
        for table in schema.TABLES:
            source = f"_dspark_obs_{table}"
            con.register(source, _dataset(root, table))
            names = [*schema.schema_for(table).names, "run_id"]
            cols = ", ".join(sqlmod.quote_ident(n) for n in names)
            con.execute(f"CREATE VIEW {sqlmod.quote_ident(table)} AS SELECT {cols} FROM {source}")
        con.execute(sqlmod._STEP_REQS_W)
        con.register("_dspark_obs_quarantine", quarantine.listing(root) if local
                     else quarantine.LISTING_SCHEMA.empty_table())
        con.execute("CREATE VIEW quarantined_files AS SELECT * FROM _dspark_obs_quarantine")
        for path in sorted(sqlmod.MACRO_DIR.glob("*.sql")):
            con.execute(path.read_text())
        con.execute(f"SET VARIABLE {sqlmod._READ_ONLY_VAR} = true")
        for setting in ("autoinstall_known_extensions", "autoload_known_extensions",
                        "allow_community_extensions", "enable_external_access"):
            con.execute(f"SET {setting} = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def run(root: str | Path, sql_or_name: str, params: dict[str, Any] | None = None, *,
        timeout_s: float | None = 30.0, limit: int | None = None) -> pa.Table:
    """One read-only query on a connection of its own: :func:`dspark_obs.sql.query` semantics.

    Refuses anything but reading statements (:func:`check_statement`) before
    it runs; the connection is closed afterwards whatever happened.
    """

    con = open_connection(root)
    try:
        return sqlmod.query(con, sql_or_name, params, timeout_s=timeout_s, limit=limit)
    finally:
        con.close()
