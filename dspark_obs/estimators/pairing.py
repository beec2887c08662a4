"""Pair a compact run's steps with its cap-accept companion's.

A companion replays the same requests (same prompts and sampling seeds) on a
server in cap-accept mode, which commits exactly what compact commits and also
reports the full-block acceptance (``correct_drafts + cap_trim``).  A compact
step and a companion step describe the same decision when they share the
request and the anchor position (``rid``, ``prefix_len``) and drafted the same
block; only then is the companion's full-block acceptance the truth for the
compact step.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

PAIRED_STEPS_SQL = """
SELECT
    r.rid,
    r.forward_ct,
    r.dp_rank,
    r.prefix_len,
    r.verify_len - 1 AS "window",
    r.correct_drafts,
    c.forward_ct AS companion_forward_ct,
    c.verify_len - 1 AS companion_window,
    c.correct_drafts + c.cap_trim AS true_block_accept,
    r.draft_tokens = c.draft_tokens AS same_drafts
FROM step_reqs r
JOIN step_reqs c
  ON c.run_id = $companion AND r.rid = c.rid AND r.prefix_len = c.prefix_len
WHERE r.run_id = $run
"""


def paired_steps(con: duckdb.DuckDBPyConnection, run: str, companion: str) -> pa.Table:
    """One row per compact step that has a companion step at the same anchor.

    Columns: rid, forward_ct, dp_rank, prefix_len, window, correct_drafts,
    companion_forward_ct, companion_window, true_block_accept (drafts a full
    block accepted, 0..gamma), same_drafts (False: the truth does not apply).
    """
    return con.sql(PAIRED_STEPS_SQL, params={"run": run, "companion": companion}).to_arrow_table()


def companion_of(con: duckdb.DuckDBPyConnection, run: str) -> str | None:
    """The cap-accept run recorded as the companion of ``run``, if any (newest first)."""
    rows = con.execute(
        "SELECT run_id FROM runs WHERE companion_of = $run ORDER BY started_at DESC LIMIT 1",
        {"run": run},
    ).fetchall()  # DuckDB 2 refuses new work while a result is half read
    return rows[0][0] if rows else None
