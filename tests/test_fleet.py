"""The fleet layout (dspark_obs.fleet): hive partitions, clustered files, manifests; read beside the old one."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from dspark_obs import sql
from dspark_obs.estimators import ceiling
from dspark_obs.clustering import ROW_GROUP_ROWS
from dspark_obs.fleet import FleetWriter
from dspark_obs.store import Store

COLLECTED = ("steps", "step_reqs", "requests", "tokens")
STEP_KEYS = [(k, "ascending") for k in ("rid", "dp_rank", "forward_ct")]


@pytest.fixture(scope="module")
def flat(tmp_path_factory) -> Store:
    from bench.gen_store import generate

    root = tmp_path_factory.mktemp("flat")
    generate(root, rows=4000, seed=12)
    return Store(root)


def _copy(src: Store, dst, *, writers: int = 2) -> None:
    """Write ``src``'s run into ``dst`` (a store, or writer number -> store) as ``writers`` sidecars would."""
    (dst(0) if callable(dst) else dst).upsert_run("bench", **src.read("runs").drop_columns(["run_id"]).to_pylist()[0])
    for table in COLLECTED:
        data = src.read(table, "bench").drop_columns(["run_id"])
        step = -(-data.num_rows // writers)
        for i in range(writers):
            dst_w = dst(i) if callable(dst) else dst
            dst_w.write(table, "bench", data.slice(i * step, step))


def test_a_fleet_store_reads_as_the_flat_one(flat, tmp_path):
    writers = {i: Store(tmp_path, layout="fleet", writer_id=f"side{i}") for i in range(2)}
    _copy(flat, lambda i: writers[i])
    reader = Store(tmp_path)
    assert reader.runs() == ["bench"] and set(COLLECTED) <= set(reader.tables())
    a, b = sql.connect(flat.root), sql.connect(tmp_path)
    for table in COLLECTED:
        q = f"SELECT * FROM {table} ORDER BY ALL"
        assert a.sql(q).to_arrow_table().equals(b.sql(q).to_arrow_table()), table
        assert reader.read(table).num_rows == flat.read(table).num_rows
    # hive partitions: run, UTC date, DP rank (and dp_rank stays a column of the files)
    files = sorted((tmp_path / "step_reqs").rglob("part-*.parquet"))
    assert files and all(f.parent.name.startswith("dp_rank=") and f.parent.parent.name.startswith("date=")
                         for f in files)
    rank = int(files[0].parent.name.removeprefix("dp_rank="))
    part = pq.read_table(files[0])
    assert set(part.column("dp_rank").to_pylist()) == {rank}
    # a file of one row group stays in the order written (clustering is checked on a large file below)
    assert part.num_rows <= ROW_GROUP_ROWS and pq.ParquetFile(files[0]).metadata.num_row_groups == 1
    manifests = sorted((tmp_path / "_manifests" / "run_id=bench").iterdir())
    assert [m.name.split("-")[0] for m in manifests] == ["side0", "side1"]   # one (the newest) per writer


def test_the_estimate_on_a_fleet_store_is_the_flat_one(flat, tmp_path):
    _copy(flat, Store(tmp_path, layout="fleet", writer_id="w"), writers=1)
    one = ceiling.estimate_run(flat, "bench", n_bootstrap=50, write=False)
    two = ceiling.estimate_run(Store(tmp_path), "bench", n_bootstrap=50, write=False)
    assert one.table.sort_by(STEP_KEYS).to_pylist() == two.table.sort_by(STEP_KEYS).to_pylist()
    assert one.summary.equals(two.summary)


def test_a_file_no_manifest_lists_is_invisible(flat, tmp_path):
    store = Store(tmp_path, layout="fleet", writer_id="w")
    data = flat.read("step_reqs", "bench").drop_columns(["run_id"]).slice(0, 100)
    store.write("step_reqs", "bench", data)
    con = sql.connect(tmp_path)
    assert con.sql("SELECT count(*) FROM step_reqs").fetchall() == [(100,)]
    # a sidecar that died after uploading a file and before committing its manifest
    orphan = next((tmp_path / "step_reqs").rglob("part-*.parquet")).with_name("part-20300101T000000000000Z-x-1.parquet")
    pq.write_table(data.cast(pq.read_schema(next((tmp_path / "step_reqs").rglob("part-*.parquet")))), orphan)
    assert con.sql("SELECT count(*) FROM step_reqs").fetchall() == [(100,)]
    assert Store(tmp_path).read("step_reqs").num_rows == 100
    store.write("step_reqs", "bench", data)                  # the next commit: seen at the next refresh
    sql.refresh(con)                                         # (sql.query and the estimators refresh first)
    assert con.sql("SELECT count(*) FROM step_reqs").fetchall() == [(200,)]
    manifest = json.loads(next((tmp_path / "_manifests" / "run_id=bench").glob("w-*.json")).read_text())
    assert manifest["seq"] == 2 and len(manifest["files"]) == len(set(f["path"] for f in manifest["files"]))


def test_old_and_fleet_files_read_together_and_drop_together(flat, tmp_path):
    data = flat.read("requests", "bench").drop_columns(["run_id"])
    Store(tmp_path).write("requests", "bench", data.slice(0, 10))                 # old layout
    Store(tmp_path, layout="fleet", writer_id="w").write("requests", "bench", data.slice(10, 5))
    assert Store(tmp_path).read("requests", "bench").num_rows == 15
    assert sql.connect(tmp_path).sql("SELECT count(*) FROM requests WHERE run_id = 'bench'").fetchall() == [(15,)]
    assert Store(tmp_path).drop_run("requests", "bench") == 2
    assert Store(tmp_path).read("requests").num_rows == 0


def test_fleet_layout_on_an_object_store(flat, s3_endpoint):
    url = (f"s3://fleet-layout/day?endpoint_override={s3_endpoint}&scheme=http&region=us-east-1"
           "&allow_bucket_creation=true")
    Store(url, writer_id="setup").fs.create_dir("fleet-layout")
    writers = {i: Store(url, writer_id=f"side{i}", layout="fleet") for i in range(2)}
    _copy(flat, lambda i: writers[i])
    reader = Store(url)
    assert reader.read("step_reqs").num_rows == flat.read("step_reqs").num_rows
    a, b = sql.connect(flat.root), sql.connect(url)
    q = "SELECT workload, count(*), sum(verify_len) FROM step_reqs_w GROUP BY 1 ORDER BY 1"
    assert a.sql(q).fetchall() == b.sql(q).fetchall()
    assert reader.runs() == ["bench"]


def test_layouts_are_checked(tmp_path):
    with pytest.raises(ValueError, match="layout 'wide' is not one of flat, fleet"):
        Store(tmp_path, layout="wide")
    with pytest.raises(ValueError, match="writer id"):
        Store(tmp_path, layout="fleet", writer_id="a/b")


def test_a_large_fleet_file_prunes_by_rid_range(tmp_path):
    """Row groups of sorted rids: their min/max statistics do not overlap, so a range of rids (a chunk, a
    task's group) is a few row groups of the file, the rest skipped by any Parquet engine."""
    rng = np.random.default_rng(3)
    n = 3 * ROW_GROUP_ROWS + 5
    rids = [f"{h:016x}" for h in rng.integers(0, 2**62, n // 5)]
    data = pa.table({"rid": pa.array([rids[i] for i in rng.integers(0, len(rids), n)]),
                     "forward_ct": pa.array(np.arange(n, dtype=np.int64))})
    paths = FleetWriter(pafs.LocalFileSystem(), str(tmp_path), "w", atomic_rename=True).write("gaps", "r", data)
    meta = pq.ParquetFile(paths[0]).metadata
    assert meta.num_row_groups == 4
    stats = [meta.row_group(i).column(0).statistics for i in range(meta.num_row_groups)]
    assert all(a.max <= b.min for a, b in zip(stats, stats[1:]))
    lo, hi = sorted(rids)[10], sorted(rids)[20]
    assert sum(not (s.max < lo or s.min > hi) for s in stats) <= 2
