"""Import what an SGLang DSpark server leaves on disk (``dspark-obs ingest``).

One module per artifact kind; each ``import_*`` function reads a file, writes
its rows into the store under one ``run_id`` and returns an
:class:`ImportResult`.  A line or document that does not fit SGLang's format
never stops an import: it becomes a ``dead_letters`` row (source
``<kind>:<file>:<line>``) with the reason, and the result counts it.  Fields a
newer SGLang adds are ignored.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import pyarrow as pa

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

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


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


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(1-based line number, text)`` of each non-blank line, decoding invalid UTF-8 as U+FFFD."""
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            text = raw.decode("utf-8", "replace").strip()
            if text:
                yield i, text


class WorkloadResolver:
    """Workload of a request id: a ``--workload-map`` CSV first, then the rid pattern.

    The default pattern takes the text before the last ``-`` when the rest is a
    number, optionally followed by the driver's run scope ``@<run_id>``
    (``gsm8k-000017`` or ``gsm8k-000017@run-1`` -> ``gsm8k``); a custom regex
    uses its named group ``workload`` or its first group.

    >>> WorkloadResolver()("arena-hard-000003"), WorkloadResolver()("poetry-000002@r1"), WorkloadResolver()("abc")
    ('arena-hard', 'poetry', None)
    """

    DEFAULT_PATTERN = r"(?P<workload>[^@]+)-\d+(?:@[A-Za-z0-9_.-]+)?"

    def __init__(self, pattern: Optional[str] = None, mapping: Optional[dict[str, str]] = None,
                 temperatures: Optional[dict[str, float]] = None) -> None:
        try:
            self.pattern = re.compile(pattern or self.DEFAULT_PATTERN)
        except re.error as exc:
            raise ValueError(f"--rid-pattern {pattern!r} is not a regular expression: {exc}") from exc
        if self.pattern.groups < 1:
            raise ValueError(f"--rid-pattern {pattern!r} needs a group for the workload, e.g. (?P<workload>.+)-\\d+")
        self.mapping = mapping or {}
        self.temperatures = temperatures or {}  # a map's optional temperature column (ingest stores it)

    @classmethod
    def from_csv(cls, path: str | Path, pattern: Optional[str] = None) -> "WorkloadResolver":
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            names = set(reader.fieldnames or ())
            if "rid" not in names or not names & {"workload", "temperature"}:
                raise ValueError(f"{path}: a workload map needs a header with columns rid,workload (and "
                                 f"optionally temperature, or rid,temperature); got {reader.fieldnames}")
            mapping, temperatures = {}, {}
            for line, row in enumerate(reader, 2):
                if not row.get("rid"):
                    continue
                if row.get("workload"):
                    mapping[row["rid"]] = row["workload"]
                if (row.get("temperature") or "").strip():
                    try:
                        temperatures[row["rid"]] = float(row["temperature"])
                    except ValueError:
                        raise ValueError(f"{path} line {line}: temperature {row['temperature']!r} is not a number "
                                         "(0 = greedy)") from None
                    if not temperatures[row["rid"]] >= 0:
                        raise ValueError(f"{path} line {line}: temperature must be >= 0, got {row['temperature']}")
        return cls(pattern, mapping, temperatures)

    def __call__(self, rid: Optional[str]) -> Optional[str]:
        if rid is None:
            return None
        if rid in self.mapping:
            return self.mapping[rid]
        m = self.pattern.fullmatch(rid)
        if not m:
            return None
        return m.groupdict().get("workload") or m.group(1)
