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
Confidences and survivals keep theirs: SGLang rounds them to four decimals, and without a
dictionary a 51,200-row ``/server_info`` body's file grew 44%.  Readers see the same values: the
encoding is the file's own.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ROW_GROUP_ROWS", "ORDER_COLUMNS", "PLAIN_COLUMNS", "cluster_by_request", "write_options"]

ROW_GROUP_ROWS = 65_536
"""Rows per row group of a clustered file: small enough that a rid range skips most of a large file."""


PLAIN_COLUMNS = frozenset({"token_id", "logprob", "top_ids", "top_logprobs", "draft_tokens", "survival_mid"})
"""Columns written without a dictionary: token ids, the target's logprobs and the estimator's ``survival_mid``
(see the module docstring)."""


def write_options(data: pa.Table) -> dict:
    """The keyword arguments of ``pyarrow.parquet.write_table`` for a part file of ``data``."""
    dictionary = []
    for f in data.schema:
        if f.name in PLAIN_COLUMNS:
            continue
        if pa.types.is_list(f.type) or pa.types.is_large_list(f.type) or pa.types.is_fixed_size_list(f.type):
            dictionary.append(f"{f.name}.list.element")   # Parquet names a list's values by this path
        elif not pa.types.is_nested(f.type):
            dictionary.append(f.name)
    return {"compression": "zstd", "row_group_size": ROW_GROUP_ROWS, "use_dictionary": dictionary}


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
    indices = pc.sort_indices(data, sort_keys=[("rid", "ascending", "at_end")])
    # the buffer, not ``to_numpy``: that imports pandas, which ``ingest`` keeps out (dspark_obs.arrow_startup)
    order = np.frombuffer(indices.buffers()[1], dtype=np.uint64, count=len(indices), offset=indices.offset * 8)
    if np.array_equal(order, np.arange(data.num_rows, dtype=np.uint64)):
        return data   # already in request order: no copy
    return data.take(indices)


def _order_kept(data: pa.Table, table: str) -> bool:
    """Whether the meaning of ``data``'s row order (if it has one) survives a sort: its order column is complete."""
    column = ORDER_COLUMNS.get(table)
    return column is None or (column in data.column_names and data.column(column).null_count == 0)
