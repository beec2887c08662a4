"""Data access for the dashboard: canned ``ui_*`` queries over DuckDB, cached per store version.

Every number on the dashboard comes from a canned query in ``dspark_obs/sql``
(``ui_*.sql``) that aggregates in DuckDB, run through :func:`dspark_obs.sql.query`
(read-only connection, time limit).  :func:`run_query` is the plain function;
:class:`DataSource` wraps it in Streamlit's caches: one connection per data root
for the package's own queries — the SQL console runs each typed statement on a
connection of its own (:mod:`dspark_obs.sql_readonly`)
(guarded by a lock: a DuckDB connection serves one query at a time) and one
cached result per (data root, :meth:`Store.version`, query, parameters), so a
rerun or a page switch costs nothing until a file is added to the store.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import threading
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from dspark_obs import sql as sqlmod
from dspark_obs import sql_readonly
from dspark_obs.store import Store

__all__ = ["Filters", "run_query", "query_parameters", "DataSource", "QUERY_TIMEOUT_S"]

QUERY_TIMEOUT_S = 60.0
"""Time limit of one dashboard query (the SQL console has its own)."""


@dataclasses.dataclass(frozen=True)
class Filters:
    """The sidebar's selection; ``None`` means "no restriction".

    ``t0``/``t1`` bound the requests' submission time (UTC); request-steps
    follow their request, steps the forward_ct span of those request-steps.
    """

    runs: tuple[str, ...] | None = None
    workloads: tuple[str, ...] | None = None
    dp_ranks: tuple[int, ...] | None = None
    t0: _dt.datetime | None = None
    t1: _dt.datetime | None = None

    def params(self) -> dict[str, Any]:
        """Query parameters: lists for the selections, datetimes for the time range."""
        return {
            "runs": list(self.runs) if self.runs is not None else None,
            "workloads": list(self.workloads) if self.workloads is not None else None,
            "dp_ranks": [int(r) for r in self.dp_ranks] if self.dp_ranks is not None else None,
            "t0": self.t0,
            "t1": self.t1,
        }


_PARAM_CACHE: dict[str, frozenset[str]] = {}


def query_parameters(name: str) -> frozenset[str]:
    """The ``$parameters`` a canned query declares (its header's defaults)."""
    if name not in _PARAM_CACHE:
        canned = sqlmod.canned_queries()
        if name not in canned:
            raise KeyError(f"no canned query {name!r}; known: {', '.join(sorted(canned))}")
        statements = duckdb.extract_statements(canned[name][1])
        _PARAM_CACHE[name] = frozenset(statements[0].named_parameters) if statements else frozenset()
    return _PARAM_CACHE[name]


def run_query(con, name: str, filters: Filters | None = None, **extra: Any) -> pd.DataFrame:
    """Run canned query ``name`` with the filters it takes plus ``extra`` parameters; a DataFrame.

    Filter parameters the query does not declare are left out, so one
    :class:`Filters` serves every query; an unknown ``extra`` is an error.
    """
    declared = query_parameters(name)
    params = {k: v for k, v in (filters or Filters()).params().items() if k in declared}
    unknown = set(extra) - declared
    if unknown:
        raise ValueError(f"query {name!r} takes no parameters {sorted(unknown)}; it takes {sorted(declared)}")
    params.update(extra)
    return sqlmod.query(con, name, params, timeout_s=QUERY_TIMEOUT_S).to_pandas()


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    return [_thaw(v) for v in value] if isinstance(value, tuple) else value


class _Connection:
    def __init__(self, root: str) -> None:
        self.con = sqlmod.connect(root)
        self.lock = threading.Lock()


def _cached(root: str, version: str, name: str, frozen: tuple) -> pd.DataFrame:
    """One query result; ``version`` only keys the cache."""
    conn = _connection(root)
    params = {k: _thaw(v) for k, v in frozen}
    with conn.lock:
        declared = query_parameters(name)
        bound = {k: v for k, v in params.items() if k in declared}
        return sqlmod.query(conn.con, name, bound, timeout_s=QUERY_TIMEOUT_S).to_pandas()


def _tables(root: str, version: str) -> frozenset[str]:
    return frozenset(Store(root).tables())


def _connection(root: str) -> _Connection:
    return _Connection(root)


try:  # wrap in Streamlit's caches when Streamlit is importable (it is a dependency)
    import streamlit as st

    _connection = st.cache_resource(show_spinner=False)(_connection)
    _cached = st.cache_data(show_spinner=False, max_entries=512)(_cached)
    _tables = st.cache_data(show_spinner=False, max_entries=64)(_tables)
except ImportError:  # pragma: no cover
    pass


class DataSource:
    """The store behind one dashboard run: cached queries keyed by the store's version.

    Create one per script run (it reads :meth:`Store.version` once, a ``stat``
    per part file) and ask it for frames with :meth:`q`.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = str(Path(root).resolve())
        self.exists = Path(self.root).is_dir()
        self.version = Store(self.root).version() if self.exists else "missing"

    def q(self, name: str, filters: Filters | None = None, **extra: Any) -> pd.DataFrame:
        """The frame of canned query ``name`` under ``filters`` and ``extra`` parameters."""
        declared = query_parameters(name)
        unknown = set(extra) - declared
        if unknown:
            raise ValueError(f"query {name!r} takes no parameters {sorted(unknown)}; it takes {sorted(declared)}")
        params = {k: v for k, v in (filters or Filters()).params().items() if k in declared}
        params.update(extra)
        frozen = tuple(sorted((k, _freeze(v)) for k, v in params.items()))
        return _cached(self.root, self.version, name, frozen)

    def tables(self) -> frozenset[str]:
        """Tables of the store that hold at least one part file."""
        return _tables(self.root, self.version) if self.exists else frozenset()

    def has(self, table: str) -> bool:
        return table in self.tables()

    @property
    def empty(self) -> bool:
        """True when no run has collected anything yet."""
        return not ({"runs", "steps", "step_reqs", "requests"} & self.tables())

    def connection(self):
        """The cached connection and its lock (for estimator calls such as an STS fit)."""
        conn = _connection(self.root)
        return conn.con, conn.lock

    def console(self, sql_text: str, params: dict[str, Any] | None, *, limit: int, timeout_s: float):
        """Run a console statement on a connection of its own (read-only at the engine level); an Arrow table.

        Never the shared chart connection: one browser session's statement must
        not change what another session sees (see :mod:`dspark_obs.sql_readonly`).
        """

        return sql_readonly.run(self.root, sql_text, params or None, timeout_s=timeout_s, limit=limit)
