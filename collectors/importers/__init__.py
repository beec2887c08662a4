"""Import what an SGLang DSpark server leaves on disk (``dspark-obs ingest``).

One module per artifact kind; each ``import_*`` function reads a file, writes
its rows into the store under one ``run_id`` and returns an
:class:`ImportResult`.  A line or document that does not fit SGLang's format
never stops an import: it becomes a ``dead_letters`` row (source
``<kind>:<file>:<line>``) with the reason, and the result counts it.  Fields a
newer SGLang adds are ignored.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc

from collectors.importers.documents import Document, iter_documents, iter_json_documents  # noqa: F401 (re-exported)
from dspark_obs import schema

CHUNK_ROWS = 50_000


@dataclass
class ImportResult:
    kind: str
    rows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    dead_letters: int = 0
    skipped: int = 0  # lines that are not this kind's (foreign log lines, events we do not store)
    gaps: int = 0
    rids: set[str] = field(default_factory=set)  # request ids seen (for workload rows)
    meta: dict[str, Any] = field(default_factory=dict)
    rid_columns: list[pa.Array] = field(default_factory=list)  # more request ids seen, unique per column, as Arrow

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    def add_rids(self, column: pa.ChunkedArray | pa.Array) -> None:
        """Note the request ids of a column of rows, kept as Arrow (no Python string per row)."""
        self.rid_columns.append(pc.unique(column).drop_null())

    def seen_rids(self) -> pa.Array:
        """Every request id seen, once, as an Arrow string array."""
        parts = [pa.array(sorted(r for r in self.rids if r is not None), pa.string())] + [c.cast(pa.string()) for c in self.rid_columns]
        return pc.unique(pa.concat_arrays(parts))


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class TableSink:
    """Buffers rows per table and writes them in chunks; dead letters go through ``dead``."""

    def __init__(self, store, run_id: str, result: ImportResult, *, redact_text: bool = False) -> None:
        self.store, self.run_id, self.result = store, run_id, result
        self.redact_text = redact_text
        self._rows: dict[str, list[dict]] = defaultdict(list)

    def add(self, table: str, row: dict) -> None:
        self._rows[table].append(row)
        if len(self._rows[table]) >= CHUNK_ROWS:
            self._flush_table(table)

    def add_table(self, table: str, data: pa.Table) -> None:
        if data.num_rows:
            self.store.write(table, self.run_id, data)
            self.result.rows[table] += data.num_rows

    def dead(self, source: str, reason: str, payload: Optional[str]) -> None:
        self.result.dead_letters += 1
        if self.redact_text:
            payload = None
        self.add("dead_letters", {"received_at": now(), "source": source[:500], "reason": reason[:2000],
                                  "payload": None if payload is None else
                                  payload[:65536].encode("utf-8", "replace").decode("utf-8")})

    def _flush_table(self, table: str) -> None:
        rows, self._rows[table] = self._rows[table], []
        if not rows:
            return
        target = schema.schema_for(table)
        try:
            data = pa.Table.from_pylist(rows, schema=target)
        except (pa.ArrowException, ValueError, TypeError, OverflowError, UnicodeError):
            good = []
            for row in rows:  # find the rows Arrow cannot hold; keep the rest
                try:
                    pa.Table.from_pylist([row], schema=target)
                    good.append(row)
                except (pa.ArrowException, ValueError, TypeError, OverflowError, UnicodeError) as exc:
                    if table != "dead_letters":
                        self.dead(f"{self.result.kind}:{row.get('source_line', '?')}",
                                  f"{table} row does not fit the store: {type(exc).__name__}: {exc}",
                                  repr(row))
            data = pa.Table.from_pylist(good, schema=target)
        self.store.write(table, self.run_id, data)
        if table != "dead_letters":
            self.result.rows[table] += data.num_rows

    def close(self) -> None:
        for table in [t for t in self._rows if t != "dead_letters"] + ["dead_letters"]:
            self._flush_table(table)
