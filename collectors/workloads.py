"""Which workload a request belongs to, from its rid (or a ``--workload-map`` CSV).

Shared by ``ingest``, ``collect`` and the companion runs: every path that
writes ``requests`` rows labels them with the same rule.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Optional


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
