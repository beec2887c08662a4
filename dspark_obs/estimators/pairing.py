"""Pair a compact run's steps with its cap-accept companion's.

A companion replays the same requests (same prompts and sampling seeds) on a
server in cap-accept mode, which commits exactly what compact commits and also
reports the full-block acceptance (``correct_drafts + cap_trim``).  A compact
step and a companion step describe the same decision when they share the
request and the anchor position (``rid``, ``prefix_len``) and drafted the same
block; only then is the companion's full-block acceptance the truth for the
compact step.

``dspark-obs companion`` records, per replayed request, whether the replay
committed the same tokens (``companion_pairing``, partitioned by the companion
run).  The pairing reads that table: a request's steps pair with the steps of
its ``companion_rid`` (the same rid unless the replay added a suffix), and
requests whose replay diverged or failed pair with nothing.  Companions
collected without that table (older runs) pair by equal rids, as before.

Under lockstep batching (the emulator) every compact step has a companion step
at the same anchor.  Real servers batch by arrival, so the companion's windows
differ where its batches did: only the steps whose anchors coincide pair
(``paired_steps`` of ``steps``).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from dspark_obs import schema
from dspark_obs.schema import COMPANION_PAIRING

STATUSES = ("identical", "diverged", "unverified", "failed", "no_inputs")
PAIRABLE = ("identical", "unverified")


_f = schema.field  # a documented column


_PAIRED_TEMPLATE = """
SELECT
    r.rid,
    r.forward_ct,
    r.dp_rank,
    r.prefix_len,
    r.verify_len - 1 AS "window",
    r.correct_drafts,
    c.forward_ct AS companion_forward_ct,
    c.verify_len - 1 AS companion_window,
    mode_block_accept('cap-accept', c.correct_drafts, c.cap_trim) AS true_block_accept,  -- sql/macros/acceptance.sql
    r.draft_tokens = c.draft_tokens AS same_drafts
FROM step_reqs r
LEFT JOIN {mapping} m ON m.run_id = $companion AND m.of_run = $run AND m.rid = r.rid
JOIN step_reqs c
  ON c.run_id = $companion AND c.rid = coalesce(m.companion_rid, r.rid) AND r.prefix_len = c.prefix_len
WHERE r.run_id = $run AND (m.status IS NULL OR m.status IN ('identical', 'unverified'))
"""

# The pairing every consumer reads (parameters $run, $companion): companion_pairing maps rids
# and drops diverged or failed requests; without rows there, rids pair as they are.
PAIRED_STEPS_SQL = _PAIRED_TEMPLATE.format(mapping="companion_pairing")


def paired_steps(con: duckdb.DuckDBPyConnection, run: str, companion: str) -> pa.Table:
    """One row per compact step that has a companion step at the same anchor.

    Columns: rid, forward_ct, dp_rank, prefix_len, window, correct_drafts,
    companion_forward_ct, companion_window, true_block_accept (drafts a full
    block accepted, 0..gamma), same_drafts (False: the truth does not apply).
    Requests whose replay diverged or failed (``companion_pairing.status``)
    have no rows.
    """
    return con.sql(PAIRED_STEPS_SQL, params={"run": run, "companion": companion}).to_arrow_table()


def companion_of(con: duckdb.DuckDBPyConnection, run: str) -> str | None:
    """The cap-accept run recorded as the companion of ``run``, if any (newest first)."""
    rows = con.execute(
        "SELECT run_id FROM runs WHERE companion_of = $run ORDER BY started_at DESC LIMIT 1",
        {"run": run},
    ).fetchall()  # DuckDB 2 refuses new work while a result is half read
    return rows[0][0] if rows else None


# -- identity ------------------------------------------------------------------

def _by_rid(tokens: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``rid -> (pos, token_id)`` sorted by position."""
    if tokens.num_rows == 0:
        return {}
    tokens = tokens.select(["rid", "pos", "token_id"]).sort_by([("rid", "ascending"), ("pos", "ascending")])
    rids = tokens.column("rid").to_numpy(zero_copy_only=False)
    pos = tokens.column("pos").to_numpy(zero_copy_only=False).astype(np.int64)
    ids = tokens.column("token_id").to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, rids[1:] != rids[:-1]])
    ends = np.r_[starts[1:], len(rids)]
    return {str(rids[s]): (pos[s:e], ids[s:e]) for s, e in zip(starts, ends)}


def _first_difference(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int | None:
    """First output position where two ``(pos, token)`` sequences differ; None if they are equal."""
    (pa_, ta), (pb, tb) = a, b
    n = min(len(pa_), len(pb))
    differ = np.flatnonzero((pa_[:n] != pb[:n]) | (ta[:n] != tb[:n]))
    if differ.size:
        i = int(differ[0])
        return int(min(pa_[i], pb[i]))
    if len(pa_) == len(pb):
        return None
    longer = pa_ if len(pa_) > n else pb
    return int(longer[n])


def output_identity(original: pa.Table, companion: pa.Table, mapping: dict[str, str]) -> pa.Table:
    """Compare each request's committed tokens with its replay's.

    ``original`` and ``companion`` are ``tokens``-shaped (``rid``, ``pos``,
    ``token_id``; 0-based output positions, the prefill token at 0);
    ``mapping`` is ``{rid: companion_rid}``.  One row per mapped rid:
    ``rid, identical`` (null when either side has no tokens),
    ``output_tokens, companion_output_tokens, first_divergence``.

    >>> t = lambda rid, ids: pa.table({"rid": [rid] * len(ids), "pos": list(range(len(ids))), "token_id": ids})
    >>> output_identity(t("a", [5, 6, 7]), t("a", [5, 9, 7]), {"a": "a"}).to_pylist()[0]["first_divergence"]
    1
    """
    orig, comp = _by_rid(original), _by_rid(companion)
    rows = []
    for rid, crid in mapping.items():
        a, b = orig.get(rid), comp.get(crid)
        first = _first_difference(a, b) if a is not None and b is not None else None
        rows.append({
            "rid": rid,
            "identical": None if a is None or b is None else first is None,
            "output_tokens": None if a is None else len(a[0]),
            "companion_output_tokens": None if b is None else len(b[0]),
            "first_divergence": first,
        })
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("rid", pa.string()), ("identical", pa.bool_()), ("output_tokens", pa.int32()),
        ("companion_output_tokens", pa.int32()), ("first_divergence", pa.int32())]))


def status_of(*, replayed: bool, has_inputs: bool, identical: bool | None) -> str:
    """A request's pairing status (see ``companion_pairing.status``)."""
    if not has_inputs:
        return "no_inputs"
    if not replayed:
        return "failed"
    if identical is None:
        return "unverified"
    return "identical" if identical else "diverged"


# -- the report ------------------------------------------------------------------

_COUNTS_SQL = """
WITH p AS ({paired})
SELECT rid, count(*) AS anchor_steps, count(*) FILTER (WHERE same_drafts) AS paired_steps
FROM p GROUP BY rid
"""
_STEPS_SQL = "SELECT rid, count(*) AS steps FROM step_reqs WHERE run_id = $run AND rid IS NOT NULL GROUP BY rid"


def pairing_report(con: duckdb.DuckDBPyConnection, *, run: str, companion: str, requests: pa.Table,
                   original_tokens: pa.Table, companion_tokens: pa.Table) -> tuple[pa.Table, dict]:
    """The ``companion_pairing`` rows of a replay and its summary counts.

    ``requests`` has one row per request of ``run`` the replay is about:
    ``rid``, ``companion_rid`` (null: not replayed for want of inputs),
    ``replayed`` (the replay finished), ``input_kind``, ``input_source``.
    Identity comes from the token tables (see :func:`output_identity`); steps
    are counted on ``con``'s ``step_reqs`` with :data:`PAIRED_STEPS_SQL`'s
    rule, diverged and failed requests excluded.  Returns the table (file
    schema, without ``run_id``) and a dict of the summary's counting columns.
    """
    reqs = requests.to_pylist()
    mapping = {r["rid"]: r["companion_rid"] for r in reqs if r["companion_rid"] is not None and r["replayed"]}
    identity = {r["rid"]: r for r in output_identity(original_tokens, companion_tokens, mapping).to_pylist()}
    rows = []
    for r in reqs:
        ident = identity.get(r["rid"], {})
        status = status_of(replayed=bool(r["replayed"]), has_inputs=r["companion_rid"] is not None,
                           identical=ident.get("identical"))
        rows.append({"of_run": run, "rid": r["rid"], "companion_rid": r["companion_rid"], "status": status,
                     "identical": ident.get("identical"), "output_tokens": ident.get("output_tokens"),
                     "companion_output_tokens": ident.get("companion_output_tokens"),
                     "first_divergence": ident.get("first_divergence"),
                     "input_kind": r.get("input_kind"), "input_source": r.get("input_source")})
    name = "_dspark_pairing_mapping"
    con.register(name, pa.Table.from_pylist(
        [{"run_id": companion, "of_run": run, "rid": r["rid"], "companion_rid": r["companion_rid"],
          "status": r["status"]} for r in rows],
        schema=pa.schema([("run_id", pa.string()), ("of_run", pa.string()), ("rid", pa.string()),
                          ("companion_rid", pa.string()), ("status", pa.string())])))
    try:
        params = {"run": run, "companion": companion}
        counts = {rid: (a, p) for rid, a, p in con.execute(
            _COUNTS_SQL.format(paired=_PAIRED_TEMPLATE.format(mapping=name)), params).fetchall()}
        steps = dict(con.execute(_STEPS_SQL, {"run": run}).fetchall())
    finally:
        con.unregister(name)
    for row in rows:
        anchors, paired = counts.get(row["rid"], (0, 0)) if row["status"] in PAIRABLE else (0, 0)
        row.update(steps=int(steps.get(row["rid"], 0)), anchor_steps=int(anchors), paired_steps=int(paired))
    table = pa.Table.from_pylist(rows, schema=COMPANION_PAIRING)
    return table, summarize(rows)


def summarize(rows: list[dict]) -> dict:
    """The counting columns of ``companion_pairing_summary`` from ``companion_pairing`` rows."""
    n = {s: sum(1 for r in rows if r["status"] == s) for s in STATUSES}
    selected = [r for r in rows if r["status"] != "no_inputs"]
    pairable = sum(r["steps"] for r in rows if r["status"] in PAIRABLE)
    paired = sum(r["paired_steps"] for r in rows)
    return {
        "no_inputs": n["no_inputs"], "selected": len(selected), "failed": n["failed"],
        "replayed": len(selected) - n["failed"], "identical": n["identical"], "diverged": n["diverged"],
        "unverified": n["unverified"], "steps": sum(r["steps"] for r in selected),
        "pairable_steps": pairable, "paired_steps": paired,
        "pairing_share": paired / pairable if pairable else None,
        "excluded_steps": sum(r["steps"] for r in rows if r["status"] in ("diverged", "failed")),
    }
