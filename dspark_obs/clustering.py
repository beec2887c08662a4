"""Part files clustered by request: the layout every writer of the store gives its files.

Rows within a part file of more than one row group are sorted by rid (stable: a request's
rows keep their order; rows without a rid last) in row groups of at most :data:`ROW_GROUP_ROWS`
rows.  A request's rows are then contiguous and each row group's min/max rid statistics let a reader skip the row
groups outside a range of rids — the unit the estimators' chunks and ``--engine ray``'s tasks
read.  Rows arrive in step order, each batch holding every request in flight, and rids sort by
workload before number, so without it every row group of every file spans almost the whole
rid range and each chunk decodes the whole run (a chunk's ``tokens`` read at 10M request-steps:
0.31 CPU s unsorted, 0.15 s sorted).  Readers take any order: files written before this are
read as they are.

``step_reqs`` carry a meaning in their order: within a step the rows are the batch in SGLang's order,
the order the scheduler broke ties by, which the schedule replay reads back
(:mod:`dspark_obs.estimators.replay`).  They are clustered only when that order is also a column
(``batch_index``, :data:`ORDER_COLUMNS`), so the replay can restore it; rows without it (a file
written before the column was kept) keep the order written.

Every writer also takes the same Parquet options (:func:`write_options`): a column's values go to a
dictionary page only where they repeat.  Token ids (``token_id``, ``top_ids``, ``draft_tokens``), the
target's logprobs (``logprob``, ``top_logprobs``) and the estimator's ``survival_mid`` hardly do
within a row group: a dictionary of them is built for every row group and kept though it saves
nothing, so they take plain pages, which zstd still compresses (measured on four row groups of a
10M-row store: ``tokens`` write 0.155 -> 0.074 CPU s, files 24% smaller, DuckDB's read 10% faster).
Confidences and survivals keep theirs: SGLang rounds both to four decimals (at most 10,001 values), and
without a dictionary a 51,200-row ``/server_info`` body's ``survival`` took 907 against 540 kB.
The floats without a dictionary, the target's logprobs (:data:`SPLIT_COLUMNS`), go to
``BYTE_STREAM_SPLIT`` pages, each byte of the values stored together, which zstd compresses better
than plain floats (``top_logprobs`` of 1M tokens: 17.2 to 15.3 MB, and DuckDB reads them in 0.066
against 0.072 CPU s); integers stay plain, as ``BYTE_STREAM_SPLIT`` integers are newer to the Parquet
format than many of its readers.  Readers see the same values: the encoding is the file's own.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ROW_GROUP_ROWS", "ORDER_COLUMNS", "PLAIN_COLUMNS", "SPLIT_COLUMNS", "cluster_by_request",
           "in_rid_order", "write_options"]

ROW_GROUP_ROWS = 65_536
"""Rows per row group of a clustered file: small enough that a rid range skips most of a large file."""


PLAIN_COLUMNS = frozenset({"token_id", "logprob", "top_ids", "top_logprobs", "draft_tokens", "survival_mid"})
"""Columns written without a dictionary: token ids, the target's logprobs and the estimator's ``survival_mid``
(see the module docstring)."""

SPLIT_COLUMNS = frozenset({"logprob", "top_logprobs"})
"""Float columns of :data:`PLAIN_COLUMNS` written as ``BYTE_STREAM_SPLIT`` pages (``survival_mid``, mostly
zeros and ones, compresses better plain: 1.7 against 2.0 MB per 600k rows)."""


def _values_path(f: pa.Field) -> str | None:
    """Parquet's path of a column's values (a list's values are ``NAME.list.element``); None for a struct."""
    if pa.types.is_list(f.type) or pa.types.is_large_list(f.type) or pa.types.is_fixed_size_list(f.type):
        return f"{f.name}.list.element"
    return None if pa.types.is_nested(f.type) else f.name


def write_options(data: pa.Table) -> dict:
    """The keyword arguments of ``pyarrow.parquet.write_table`` for a part file of ``data``."""
    dictionary, encoding = [], {}
    for f in data.schema:
        path = _values_path(f)
        if path is None:
            continue
        if f.name not in PLAIN_COLUMNS:
            dictionary.append(path)
        elif f.name in SPLIT_COLUMNS and pa.types.is_floating(getattr(f.type, "value_type", f.type)):
            encoding[path] = "BYTE_STREAM_SPLIT"
    options = {"compression": "zstd", "row_group_size": ROW_GROUP_ROWS, "use_dictionary": dictionary}
    return {**options, "column_encoding": encoding} if encoding else options


ORDER_COLUMNS = {"step_reqs": "batch_index"}
"""Tables whose row order carries meaning (the batch order of a step), and the column that keeps it: a write
is clustered only when that column is complete."""


def cluster_by_request(data: pa.Table, table: str) -> pa.Table:
    """``data`` of ``table`` sorted by rid (stable; rows without a rid last, in their order) when it fills
    more than one row group.  As it is: a table without rids; one of :data:`ORDER_COLUMNS` whose order
    column is missing or has nulls; one of a single row group (a row group's statistics span its rids
    whatever their order, so the sort would cost the write and skip nothing: ``ingest`` writes one
    ``/server_info`` body, 51,200 rows at bs 256, per file)."""
    if "rid" not in data.column_names or data.num_rows <= ROW_GROUP_ROWS or not _order_kept(data, table):
        return data
    if in_rid_order(data.column("rid")):
        return data   # already in request order (the estimator's results are): no sort, no copy
    return data.take(pc.sort_indices(data, sort_keys=[("rid", "ascending", "at_end")]))


def in_rid_order(rid: pa.ChunkedArray | pa.Array) -> bool:
    """Whether ``rid`` is sorted as :func:`cluster_by_request` sorts it (ascending, nulls last): one linear
    pass of comparisons of neighbours, where the sort cost 9x as much (150k rids: 1.0 against 9.3 ms)."""
    named = len(rid) - rid.null_count
    if rid.slice(named).null_count != len(rid) - named:
        return False   # a null before a rid
    head = rid.slice(0, named)
    return named < 2 or not pc.any(pc.less(head.slice(1), head.slice(0, named - 1))).as_py()


def _order_kept(data: pa.Table, table: str) -> bool:
    """Whether the meaning of ``data``'s row order (if it has one) survives a sort: its order column is complete."""
    column = ORDER_COLUMNS.get(table)
    return column is None or (column in data.column_names and data.column(column).null_count == 0)
