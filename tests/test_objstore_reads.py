"""DuckDB's threads reading one large Parquet file of an object store get the file's bytes.

The regression: DuckDB reads a registered Python filesystem by ``seek`` then
``read`` on one file object shared by its threads; with fsspec's plain
``ArrowFSWrapper`` (one cursor) a tokens file of several row groups read over
moto S3 failed as "ZSTD Decompression failure".  ``objstore_reads`` keeps a
position per thread and reads with ``read_at``.
"""

from __future__ import annotations

import threading

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from dspark_obs import sql
from dspark_obs.store import Store
from dspark_obs.objstore_reads import PositionalFile, duckdb_filesystem

QUERY = "SELECT count(*), sum(hash(rid, pos, token_id, logprob, top_ids)) FROM read_parquet('{}')"


def _tokens(n: int, seed: int = 0) -> pa.Table:
    """Incompressible token-like rows (random ids and log-probabilities, lists as the tokens table has)."""
    rng = np.random.default_rng(seed)
    top = rng.integers(0, 32_000, size=(n, 5), dtype=np.int32)
    return pa.table({"rid": pa.array([f"r{i // 40:06d}" for i in range(n)]), "pos": np.arange(n, dtype=np.int32),
                     "token_id": rng.integers(0, 32_000, n, dtype=np.int32),
                     "logprob": rng.normal(size=n).astype(np.float32),
                     "top_ids": pa.FixedSizeListArray.from_arrays(top.ravel(), 5).cast(pa.list_(pa.int32()))})


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    """A zstd Parquet file of 24 row groups (DuckDB's threads read several of them at once)."""
    path = tmp_path_factory.mktemp("reads") / "part-tokens.parquet"
    pq.write_table(_tokens(240_000), path, compression="zstd", row_group_size=10_000)
    assert pq.ParquetFile(path).metadata.num_row_groups == 24
    return path


def test_each_thread_reads_at_its_own_position(big_file):
    data = big_file.read_bytes()
    f = PositionalFile(pafs.LocalFileSystem().open_input_file(str(big_file)), str(big_file))
    rng = np.random.default_rng(1)
    wrong = []

    def reader(offsets) -> None:
        for off in offsets:
            f.seek(int(off))
            got = f.read(4096)
            if got != data[off:off + 4096]:
                wrong.append(int(off))

    threads = [threading.Thread(target=reader, args=(rng.integers(0, len(data), 400),)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and f.size == len(data)
    f.seek(-10, 2)
    assert f.read() == data[-10:] and f.read(5) == b"" and f.tell() == len(data)


def test_duckdb_threads_read_a_file_of_many_row_groups_whole(big_file):
    expected = duckdb.sql(QUERY.format(big_file)).fetchall()
    con = duckdb.connect(config={"threads": 8})
    con.register_filesystem(duckdb_filesystem(pafs.LocalFileSystem(), "viafsspec"))
    for _ in range(5):
        assert con.sql(QUERY.format(f"viafsspec://{big_file}")).fetchall() == expected


def test_a_large_tokens_file_reads_back_over_s3(big_file, s3_endpoint):
    """The store's SQL connection on an s3:// URL (moto) reads the file DuckDB reads from disk."""
    url = f"s3://reads/store?endpoint_override={s3_endpoint}&scheme=http&region=us-east-1&allow_bucket_creation=true"
    store = Store(url)
    store.fs.create_dir("reads")
    key = f"{store.base}/tokens/run_id=r/{big_file.name}"
    pafs.copy_files(str(big_file), key, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=store.fs)
    con = sql.connect(url)
    con.execute("SET threads = 8")
    expected = duckdb.sql(QUERY.format(big_file)).fetchall()
    for _ in range(3):
        assert con.sql(QUERY.format(f"{store.scheme}://{key}")).fetchall() == expected


class _CountingFs:
    """The local filesystem as the wrapper uses it, counting what would be a request on an object store
    (a HEAD per path asked about or file opened; a LIST per selector, not counted)."""

    type_name = "counting"

    def __init__(self):
        self.fs, self.heads, self.opens = pafs.LocalFileSystem(), 0, 0

    def get_file_info(self, what):
        if not isinstance(what, pafs.FileSelector):
            self.heads += len(what) if isinstance(what, list) else 1
        return self.fs.get_file_info(what)

    def open_input_file(self, path):
        self.opens += 1
        return self.fs.open_input_file(path)


def test_repeated_queries_open_and_ask_about_each_file_once(tmp_path):
    """DuckDB asks every file's size and time and opens it on every query; the wrapper answers from the
    listing and keeps the opened file, until a listing shows the file changed."""
    folder = tmp_path / "t"
    folder.mkdir()
    for i in range(3):
        pq.write_table(_tokens(2_000, seed=i), folder / f"part-{i}.parquet")
    handler = _CountingFs()
    con = duckdb.connect()
    con.register_filesystem(duckdb_filesystem(handler, "counted"))
    query = QUERY.format(f"counted://{folder}/part-*.parquet")
    expected = duckdb.sql(QUERY.format(f"{folder}/part-*.parquet")).fetchall()
    assert con.sql(query).fetchall() == expected
    first = handler.heads
    for _ in range(3):
        assert con.sql(query).fetchall() == expected
    assert handler.opens == 3 and handler.heads == first <= 1   # the glob's folder, at most
    pq.write_table(_tokens(3_000, seed=9), folder / "part-1.parquet")   # rewritten: another size
    assert con.sql(query).fetchall() == duckdb.sql(QUERY.format(f"{folder}/part-*.parquet")).fetchall()
    assert handler.opens == 4
