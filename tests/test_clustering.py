"""Part files of the flat store clustered by request: row groups a rid range prunes, rows kept whole and in order."""

from __future__ import annotations

import glob

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dspark_obs.clustering import ROW_GROUP_ROWS, cluster_by_request
from dspark_obs.store import Store


def _steps(n: int, seed: int = 5) -> pa.Table:
    """Rows in step order, each step holding every request in flight (rids interleaved, some without a rid)."""
    rng = np.random.default_rng(seed)
    rids = np.array([f"{w}-{i:08d}" for i in range(n // 7) for w in ("poetry", "arena")][: n // 7])
    pick = rng.integers(0, rids.size, n)
    rid = pa.array([None if p % 97 == 0 else rids[p] for p in pick], pa.string())
    return pa.table({"rid": rid, "forward_ct": pa.array(np.arange(n, dtype=np.int64))})


def test_a_large_write_is_clustered_and_prunes_by_rid_range(tmp_path):
    store = Store(tmp_path)
    data = _steps(3 * ROW_GROUP_ROWS + 11)
    n, zeros = data.num_rows, np.zeros(data.num_rows, np.int64)
    store.write("step_reqs", "r", pa.table({
        "rid": data.column("rid"), "forward_ct": data.column("forward_ct"),
        **{c: zeros for c in ("dp_rank", "segment", "req_pool_index", "prefix_len", "verify_len", "acc_len",
                              "correct_drafts", "cap_trim", "bonus_token")},
        "draft_tokens": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(2 * n, np.int32)), 2)}))
    (path,) = glob.glob(f"{tmp_path}/step_reqs/run_id=r/part-*.parquet")
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 4
    rid_col = meta.schema.names.index("rid")
    stats = [meta.row_group(i).column(rid_col).statistics for i in range(meta.num_row_groups)]
    ranges = [(s.min, s.max) for s in stats if s.has_min_max]
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))     # row groups do not overlap in rid
    got = pq.read_table(path)
    rid = got.column("rid").to_pylist()
    known = [r for r in rid if r is not None]
    assert known == sorted(known) and rid[len(known):] == [None] * (len(rid) - len(known))   # rids, then none
    fct = got.column("forward_ct").to_numpy()
    for r in set(known[:50]):   # each request's rows in the order they were written
        mine = fct[np.array([x == r for x in rid])]
        assert np.all(np.diff(mine) > 0)
    assert sorted(fct.tolist()) == list(range(data.num_rows))          # nothing lost, nothing doubled


def test_a_write_of_one_row_group_keeps_its_order():
    data = _steps(ROW_GROUP_ROWS)
    assert cluster_by_request(data) is data
    assert cluster_by_request(_steps(ROW_GROUP_ROWS + 1)) is not data


def test_a_table_in_request_order_or_without_rids_is_not_copied():
    ordered = cluster_by_request(_steps(ROW_GROUP_ROWS + 1))
    assert cluster_by_request(ordered) is ordered
    no_rid = pa.table({"x": np.arange(ROW_GROUP_ROWS + 1)})
    assert cluster_by_request(no_rid) is no_rid
