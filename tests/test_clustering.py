"""Part files clustered by request: row groups a rid range prunes, rows kept whole and in order; step_reqs
sorted only with their batch order kept as a column."""

from __future__ import annotations

import glob

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.clustering import ROW_GROUP_ROWS, cluster_by_request, in_rid_order
from dspark_obs.store import Store


def _steps(n: int, seed: int = 5) -> pa.Table:
    """Rows in step order, each step holding every request in flight (rids interleaved, some without a rid)."""
    rng = np.random.default_rng(seed)
    rids = np.array([f"{w}-{i:08d}" for i in range(n // 7) for w in ("poetry", "arena")][: n // 7])
    pick = rng.integers(0, rids.size, n)
    rid = pa.array([None if p % 97 == 0 else rids[p] for p in pick], pa.string())
    return pa.table({"rid": rid, "forward_ct": pa.array(np.arange(n, dtype=np.int64))})


def _step_reqs(data: pa.Table, *, batch_index: bool = True) -> pa.Table:
    n, zeros = data.num_rows, np.zeros(data.num_rows, np.int64)
    columns = {
        "rid": data.column("rid"), "forward_ct": data.column("forward_ct").to_numpy() // 5,   # five requests per step
        **{c: zeros for c in ("dp_rank", "segment", "req_pool_index", "prefix_len", "verify_len", "acc_len",
                              "correct_drafts", "cap_trim", "bonus_token")},
        "draft_tokens": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(2 * n, np.int32)), 2)}
    if batch_index:
        columns["batch_index"] = pa.array((np.arange(n) % 5).astype(np.int32))
    return pa.table(columns)


def test_a_large_write_is_clustered_and_prunes_by_rid_range(tmp_path):
    store = Store(tmp_path)
    data = _steps(3 * ROW_GROUP_ROWS + 11)
    data = data.filter(pc.is_valid(data.column("rid")))
    store.write("tokens", "r", pa.table({"rid": data.column("rid"), "pos": data.column("forward_ct").cast(pa.int32()),
                                         "token_id": pa.array(np.zeros(data.num_rows, np.int32))}))
    (path,) = glob.glob(f"{tmp_path}/tokens/run_id=r/part-*.parquet")
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == -(-data.num_rows // ROW_GROUP_ROWS) > 1
    rid_col = meta.schema.names.index("rid")
    ranges = [(s.min, s.max) for s in (meta.row_group(i).column(rid_col).statistics
                                       for i in range(meta.num_row_groups))]
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))     # row groups do not overlap in rid
    got = pq.read_table(path)
    rid = got.column("rid").to_pylist()
    assert rid == sorted(rid)
    pos = got.column("pos").to_numpy()
    for r in set(rid[:50]):   # each request's rows in the order they were written
        assert np.all(np.diff(pos[np.array([x == r for x in rid])]) > 0)
    assert sorted(pos.tolist()) == sorted(data.column("forward_ct").to_pylist())   # nothing lost or doubled


def test_step_reqs_are_clustered_with_their_batch_order_kept(tmp_path):
    """Within a step, step_reqs rows are the batch in SGLang's order (the replay's tie-break): sorted by rid,
    each row's batch_index still gives that order back."""
    data = _step_reqs(_steps(3 * ROW_GROUP_ROWS + 11))
    Store(tmp_path).write("step_reqs", "r", data)
    (path,) = glob.glob(f"{tmp_path}/step_reqs/run_id=r/part-*.parquet")
    got = pq.read_table(path)
    known = [r for r in got.column("rid").to_pylist() if r is not None]
    assert known == sorted(known) and got.column("rid").to_pylist() != data.column("rid").to_pylist()
    back = got.take(np.lexsort((got.column("batch_index").to_numpy(), got.column("forward_ct").to_numpy())))
    assert back.column("rid").to_pylist() == data.column("rid").to_pylist()


def test_step_reqs_without_their_batch_order_are_never_sorted(tmp_path):
    """A step_reqs table that lacks batch_index (or has nulls in it) is written in the order given."""
    data = _step_reqs(_steps(3 * ROW_GROUP_ROWS + 11), batch_index=False)
    Store(tmp_path).write("step_reqs", "r", data)
    (path,) = glob.glob(f"{tmp_path}/step_reqs/run_id=r/part-*.parquet")
    assert pq.read_table(path).column("rid").to_pylist() == data.column("rid").to_pylist()
    assert cluster_by_request(data, "step_reqs") is data
    partial = _step_reqs(_steps(3 * ROW_GROUP_ROWS + 11))
    partial = partial.set_column(partial.column_names.index("batch_index"), "batch_index",
                                 pa.array([None] + list(range(1, partial.num_rows)), pa.int32()))
    assert cluster_by_request(partial, "step_reqs") is partial


def test_rows_without_a_rid_go_last_in_their_order():
    data = _steps(ROW_GROUP_ROWS + 500)
    got = cluster_by_request(data, "tokens")
    rid = got.column("rid").to_pylist()
    known = [r for r in rid if r is not None]
    assert known == sorted(known) and rid[len(known):] == [None] * (len(rid) - len(known))
    missing = pc.is_null(got.column("rid"))
    assert np.all(np.diff(got.filter(missing).column("forward_ct").to_numpy()) > 0)


def test_a_write_of_one_row_group_keeps_its_order():
    data = _steps(ROW_GROUP_ROWS)
    assert cluster_by_request(data, "tokens") is data
    assert cluster_by_request(_steps(ROW_GROUP_ROWS + 1), "tokens") is not data


def test_a_table_in_request_order_or_without_rids_is_not_copied():
    ordered = cluster_by_request(_steps(ROW_GROUP_ROWS + 1), "tokens")
    assert cluster_by_request(ordered, "tokens") is ordered
    no_rid = pa.table({"x": np.arange(ROW_GROUP_ROWS + 1)})
    assert cluster_by_request(no_rid, "tokens") is no_rid


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from(["a", "a-1", "a-10", "b", "\u00e9"])), max_size=9),
       st.booleans(), st.integers(0, 8))
def test_in_rid_order_is_true_exactly_when_the_sort_keeps_the_order(rids, sort_first, cut):
    if sort_first:
        rids = sorted(r for r in rids if r is not None) + [None] * sum(r is None for r in rids)
    column = pa.array(rids, pa.string())
    if 0 < cut < len(rids):   # a chunked column, its chunks split where a comparison of neighbours spans both
        column = pa.chunked_array([column.slice(0, cut), column.slice(cut)])
    named = [r for r in rids if r is not None]   # code-point order is UTF-8's byte order, Arrow's
    assert in_rid_order(column) == (rids == sorted(named) + [None] * (len(rids) - len(named)))


def test_token_ids_and_logprobs_are_written_without_a_dictionary_confidences_with_one(tmp_path):
    """Values that repeat (rids, positions, SGLang's four-decimal confidences and survivals) get a dictionary
    page; token ids and the target's logprobs do not, the logprobs byte-stream split; everything reads back
    the same."""
    store = Store(tmp_path)
    rng = np.random.default_rng(3)
    n = 5000
    tokens = pa.table({"rid": [f"r-{i % 40:04d}" for i in range(n)], "pos": pa.array(np.arange(n) // 40, pa.int32()),
                       "token_id": pa.array(rng.integers(0, 150_000, n), pa.int32()),
                       "logprob": pa.array(-rng.random(n), pa.float32()),
                       "top_ids": pa.array(rng.integers(0, 150_000, (n, 5)).tolist(), pa.list_(pa.int32())),
                       "top_logprobs": pa.array((-rng.random((n, 5))).tolist(), pa.list_(pa.float32()))})
    store.write("tokens", "r", tokens)
    reqs = _step_reqs(_steps(n)).drop_columns(["draft_tokens"]).append_column(
        "draft_tokens", pa.array(rng.integers(0, 150_000, (n, 3)).tolist(), pa.list_(pa.int32()))).append_column(
        "confidence", pa.array(np.round(rng.random((n, 3)), 4).tolist(), pa.list_(pa.float32()))).append_column(
        "survival", pa.array(np.round(np.cumprod(rng.random((n, 3)), axis=1), 4).tolist(), pa.list_(pa.float32())))
    store.write("step_reqs", "r", reqs)
    split = {"logprob", "top_logprobs.list.element"}
    for table, data, expected in (
            ("tokens", tokens, {"rid", "pos"}),
            ("step_reqs", reqs, {"confidence.list.element", "survival.list.element"})):
        (path,) = glob.glob(f"{tmp_path}/{table}/run_id=r/part-*.parquet")
        chunk = pq.ParquetFile(path).metadata.row_group(0)
        encodings = {chunk.column(i).path_in_schema: chunk.column(i).encodings for i in range(chunk.num_columns)}
        with_dictionary = {name for name, enc in encodings.items() if "RLE_DICTIONARY" in enc}
        plain = {"token_id", "top_ids.list.element", "draft_tokens.list.element"} | split
        assert expected <= with_dictionary and not (with_dictionary & plain), (table, encodings)
        assert {name for name, enc in encodings.items() if "BYTE_STREAM_SPLIT" in enc} == split & set(encodings)
        got = store.read(table, "r")
        assert got.num_rows == data.num_rows
        for name in ("token_id", "logprob", "top_logprobs", "draft_tokens", "confidence", "survival"):
            if name in data.column_names:   # clustered by rid: compare as sorted rows
                assert sorted(map(str, got.column(name).to_pylist())) == sorted(map(str, data.column(name).to_pylist())), name
