"""A chunk query reads only the files that may hold its rids, and the same rows as through the view."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dspark_obs import run_files, sql
from dspark_obs.compaction import compact_run
from dspark_obs.estimators.chunks import ALL, Chunk, plan_chunks, sample_requests
from dspark_obs.store import Store

RUN = "r1"
_SQL = "SELECT rid, pos, token_id FROM {tokens} WHERE run_id = $run AND {where} ORDER BY rid, pos"


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path)
    rng = np.random.default_rng(3)
    for b in range(5):   # as a collector leaves them: every file spans the run's rids
        rid = [f"req-{i:03d}" for i in rng.integers(0, 200, 300)]
        store.write("tokens", RUN, pa.table({"rid": rid, "pos": pa.array(np.arange(300) + 300 * b, pa.int32()),
                                             "token_id": pa.array(rng.integers(0, 99, 300), pa.int32())}))
    compact_run(store, RUN, ("tokens",), file_rows=300)   # then files of disjoint rid ranges
    return store


def _read(con, chunk: Chunk, direct: bool) -> pa.Table:
    froms, files = chunk.sources(con, RUN, "tokens") if direct else ({"tokens": "tokens"}, {})
    return con.sql(_SQL.format(where=chunk.on("rid"), **froms), params={"run": RUN, **chunk.params, **files}).to_arrow_table()


def test_a_chunk_reads_its_files_only_and_the_rows_the_view_gives(store):
    con = sql.connect(store.root)
    files = store.part_files("tokens", RUN)
    assert len(files) >= 4
    rids, counts = zip(*con.sql("SELECT rid, count(*) FROM tokens GROUP BY 1 ORDER BY 1").fetchall())
    chunks = plan_chunks(list(rids), np.array(counts), chunk_rows=200)
    sample = sample_requests(list(rids), np.array(counts), max_rows=300, block=4)
    for chunk in chunks + [sample]:
        froms, params = chunk.sources(con, RUN, "tokens")
        assert "read_parquet($files_tokens" in froms["tokens"]
        assert 0 < len(params["files_tokens"]) < len(files)
        direct, view = _read(con, chunk, True), _read(con, chunk, False)
        assert direct.num_rows > 0 and direct.equals(view)
    assert sum(_read(con, c, True).num_rows for c in chunks) == store.read("tokens", RUN).num_rows


def test_the_view_stays_where_a_direct_read_could_differ(store, tmp_path):
    con = sql.connect(store.root)
    assert ALL.sources(con, RUN, "tokens") == ({"tokens": "tokens"}, {})   # every rid: nothing to prune
    nowhere = Chunk("{rid} BETWEEN $chunk_lo AND $chunk_hi", {"chunk_lo": "zzz", "chunk_hi": "zzzz"})
    assert nowhere.sources(con, RUN, "tokens") == ({"tokens": "tokens"}, {})
    # a file of an older schema (no token_id): the view's union fills the column, a direct read could not
    old = pa.table({"rid": ["req-000"], "pos": pa.array([9999], pa.int32())})
    pq.write_table(old, store.root / "tokens" / f"run_id={RUN}" / "part-20200101T000000000000Z-0000aaaa.parquet")
    chunk = Chunk("{rid} BETWEEN $chunk_lo AND $chunk_hi", {"chunk_lo": "req-000", "chunk_hi": "req-010"})
    assert chunk.sources(con, RUN, "tokens") == ({"tokens": "tokens"}, {})
    assert pc.is_null(_read(con, chunk, True).column("token_id")).to_pylist().count(True) == 1


def test_overlapping_keeps_files_without_statistics_and_those_with_nulls():
    files = [run_files.FileRids("a", "a", "c", False, True), run_files.FileRids("b", "", None, True, True),
             run_files.FileRids("n", None, None, True, True), run_files.FileRids("d", "d", "f", False, True)]
    assert run_files.overlapping(files, [("b", "b")], False) == ["a", "b"]
    assert run_files.overlapping(files, [], True) == ["b", "n"]
    assert run_files.overlapping(files, [("e", "z")], False) == ["b", "d"]


def test_a_chunks_ranges_come_from_its_parameters():
    listed = Chunk("{rid} IN (SELECT unnest($chunk_rids))", {"chunk_rids": ["b", "a", "c"]})
    assert listed.rid_ranges() == ([("a", "c")], False)
    sample = sample_requests([f"r{i:02d}" for i in range(13)], np.ones(13), max_rows=4, block=2)
    ranges, nulls = sample.rid_ranges()
    assert ranges == [(sample.params[f"sample_lo_{j}"], sample.params[f"sample_hi_{j}"]) for j in range(len(ranges))]
    assert not nulls and len(ranges) == 2
    assert Chunk("FALSE").rid_ranges() == ([], False)


def test_a_damaged_file_sends_the_chunk_through_the_view(store):
    con = sql.connect(store.root)
    damaged = store.root / "tokens" / f"run_id={RUN}" / "part-20200101T000000000000Z-0000bbbb.parquet"
    damaged.write_bytes(b"PAR1 not a parquet file")
    chunk = Chunk("{rid} BETWEEN $chunk_lo AND $chunk_hi", {"chunk_lo": "req-000", "chunk_hi": "req-010"})
    assert chunk.sources(con, RUN, "tokens") == ({"tokens": "tokens"}, {})


def test_a_file_whose_column_docs_differ_reads_directly(store):
    path = store.part_files("tokens", RUN)[0]
    data = pq.read_table(path)
    # written by a version with other column docs (here none), every column nullable
    bare = pa.schema([pa.field(f.name, f.type, True) for f in data.schema])
    pq.write_table(pa.Table.from_arrays(data.columns, schema=bare), path)
    stats = run_files.rid_stats(path, "tokens")
    assert stats.plain and stats.lo is not None
