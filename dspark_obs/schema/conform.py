"""Tables made to fit a schema: one rule, for rows being written and for part files being read.

A column the schema names is cast to its type; one the data predates is null.
Writing is strict (unknown or missing required columns are errors, so a bug
fails where it is made); reading is lenient (files written before a column was
added read as before).
"""

from __future__ import annotations

import pyarrow as pa

from dspark_obs.schema import schema_for

__all__ = ["columns_as", "rows_for_table"]


def columns_as(data: pa.Table, target: pa.Schema, *, given: dict[str, pa.Array] | None = None) -> pa.Table:
    """``data`` in ``target``'s columns and types: ``given`` columns as passed, the rest of ``data`` cast,
    the columns it lacks as nulls."""
    given = given or {}
    arrays = []
    for field in target:
        if field.name in given:
            arrays.append(given[field.name])
        elif field.name in data.column_names:
            column = data.column(field.name)
            arrays.append(column if column.type == field.type else column.cast(field.type))
        else:
            arrays.append(pa.nulls(data.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=target)


def rows_for_table(table: str, run_id: str, rows: pa.Table | list[dict]) -> pa.Table:
    """``rows`` cast to the file schema of ``table`` (without ``run_id``, which the partition holds); raise
    ValueError on a mismatch: an unknown or missing required column, a null where none may be, a bad value."""
    target = schema_for(table)
    if isinstance(rows, pa.Table):
        columns = rows.column_names
    elif isinstance(rows, list):
        if not all(isinstance(r, dict) for r in rows):
            raise TypeError(f"{table}: rows must be a pyarrow.Table or a list of dicts")
        columns = list(dict.fromkeys(k for r in rows for k in r))
    else:
        raise TypeError(f"{table}: rows must be a pyarrow.Table or a list of dicts, got {type(rows).__name__}")
    if "run_id" in columns:
        values = rows.column("run_id").to_pylist() if isinstance(rows, pa.Table) else [r.get("run_id") for r in rows]
        if any(v != run_id for v in values):
            raise ValueError(f"{table}: column run_id disagrees with run_id={run_id!r}; drop the column or fix it")
        columns.remove("run_id")
        rows = rows.drop_columns(["run_id"]) if isinstance(rows, pa.Table) else [
            {k: v for k, v in r.items() if k != "run_id"} for r in rows]
    extra = [c for c in columns if c not in target.names]
    if extra:
        raise ValueError(f"{table}: unknown columns {extra}; allowed: {', '.join(target.names)}")
    missing = [f.name for f in target if not f.nullable and f.name not in columns]
    if missing and len(rows):
        raise ValueError(f"{table}: missing required columns {missing}")
    try:
        if isinstance(rows, list):
            data = pa.Table.from_pylist(rows, schema=target)
        else:
            data = columns_as(rows, target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
        raise ValueError(f"{table}: rows do not fit the schema: {exc}") from exc
    nulls = [f"{f.name} ({data.column(f.name).null_count})" for f in target
             if not f.nullable and data.column(f.name).null_count]
    if nulls:
        raise ValueError(f"{table}: required columns hold nulls: {', '.join(nulls)}")
    return data
