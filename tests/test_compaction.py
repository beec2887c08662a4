"""Compaction: the same rows in fewer files of disjoint rid ranges, nothing lost on a crash, same estimates."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bench.gen_store import generate
from dspark_obs import compaction
from dspark_obs.cli import app
from dspark_obs.compaction import compact_run, needs_compaction, rid_ranges
from dspark_obs.run_files import FileRids, rid_stats
from dspark_obs.store import Store

runner = CliRunner()
RUN = "r1"


def _write_batches(store: Store, batches: int = 6, per_batch: int = 40, seed: int = 0) -> None:
    """Files as a collector leaves them: each batch holds rows of random rids, so every file spans the run."""
    rng = np.random.default_rng(seed)
    for b in range(batches):
        rids = [f"{h:08x}" for h in rng.integers(0, 2**32, per_batch // 4)] + [None]
        rid = rng.choice(np.array(rids, dtype=object), per_batch)
        store.write("tokens", RUN, pa.table({
            "rid": pa.array([r or "nil" for r in rid]), "pos": pa.array(np.arange(per_batch) + b * per_batch, pa.int32()),
            "token_id": pa.array(rng.integers(0, 1000, per_batch), pa.int32())}))
        zeros = np.zeros(per_batch, np.int32)
        store.write("step_reqs", RUN, pa.table({
            "dp_rank": pa.array(zeros), "forward_ct": pa.array(np.full(per_batch, b, np.int64)), "segment": zeros,
            "rid": pa.array(list(rid), pa.string()), "req_pool_index": zeros, "prefix_len": zeros,
            "verify_len": zeros + 1, "acc_len": zeros + 1, "correct_drafts": zeros, "cap_trim": zeros,
            "bonus_token": zeros, "draft_tokens": pa.array([[1, 2]] * per_batch, pa.list_(pa.int32())),
            "batch_index": pa.array(np.arange(per_batch, dtype=np.int32))}))


def _by_rid_in_order(table: pa.Table, order: str) -> dict:
    """Each rid's rows as written (``order`` increases in write order)."""
    out: dict = {}
    for row in table.drop_columns(["run_id"]).to_pylist():
        out.setdefault(row["rid"], []).append(row)
    for rows in out.values():
        assert [r[order] for r in rows] == sorted(r[order] for r in rows)
    return out


def _disjoint(files: list[str], table: str) -> bool:
    stats = [rid_stats(p, table) for p in files]   # the footers are what a reader prunes by
    named = sorted((f.lo, f.hi) for f in stats if f.lo is not None)
    return all(b[0] > a[1] for a, b in zip(named, named[1:])) and sum(f.nulls for f in stats) <= 1


@pytest.mark.parametrize("read_rows", [7, 1 << 20])   # input files split a few rows at a time, or whole
def test_compaction_keeps_every_row_in_request_order_in_disjoint_files(tmp_path, monkeypatch, read_rows):
    monkeypatch.setattr(compaction, "_READ_ROWS", read_rows)
    store = Store(tmp_path)
    _write_batches(store)
    before = {t: store.read(t, RUN) for t in ("tokens", "step_reqs")}
    assert len(store.part_files("tokens", RUN)) == 6 and not _disjoint(store.part_files("tokens", RUN), "tokens")
    done = {c.table: c for c in compact_run(store, RUN, file_rows=70)}
    for table, order in (("tokens", "pos"), ("step_reqs", "forward_ct")):
        after = store.read(table, RUN)
        assert after.num_rows == before[table].num_rows == done[table].rows == 240
        assert _by_rid_in_order(after, order) == _by_rid_in_order(before[table], order)
        files = store.part_files(table, RUN)
        assert done[table].files_before == 6 and done[table].files_after == len(files) < 6
        assert _disjoint(files, table)
    assert not [n for n in os.listdir(tmp_path / "tokens" / f"run_id={RUN}") if not n.startswith("part-")]


def test_second_compaction_rewrites_nothing(tmp_path):
    store = Store(tmp_path)
    _write_batches(store)
    compact_run(store, RUN, file_rows=70)
    files = {t: store.part_files(t, RUN) for t in ("tokens", "step_reqs")}
    again = compact_run(store, RUN, file_rows=70)
    assert all(c.files_before == c.files_after for c in again)
    assert {t: store.part_files(t, RUN) for t in files} == files


def test_a_crash_after_the_journal_is_finished_by_the_next_compaction(tmp_path, monkeypatch):
    store = Store(tmp_path)
    _write_batches(store)
    before = store.read("tokens", RUN)

    def crash(*args):
        raise KeyboardInterrupt("killed while moving files")
    monkeypatch.setattr(compaction, "_finish", crash)
    with pytest.raises(KeyboardInterrupt):
        compact_run(store, RUN, ("tokens",), file_rows=70)
    partition = tmp_path / "tokens" / f"run_id={RUN}"
    journal, = partition.glob("_compaction-*.json")
    assert len(json.loads(journal.read_text())["replaces"]) == 6
    assert store.read("tokens", RUN).num_rows == before.num_rows   # the staged files are not visible yet
    monkeypatch.undo()
    assert compaction.finish_interrupted(store, "tokens", RUN) == 1
    after = store.read("tokens", RUN)
    assert after.num_rows == before.num_rows and _disjoint(store.part_files("tokens", RUN), "tokens")
    assert sorted(os.listdir(partition)) == sorted(os.path.basename(p) for p in store.part_files("tokens", RUN))


def test_a_crash_before_the_journal_leaves_the_old_files(tmp_path, monkeypatch):
    store = Store(tmp_path)
    _write_batches(store)
    files = store.part_files("tokens", RUN)
    real_stage, calls = store.stage, []

    def stage_then_die(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_stage(*args, **kwargs)
    monkeypatch.setattr(store, "stage", stage_then_die)
    with pytest.raises(OSError, match="disk full"):
        compact_run(store, RUN, ("tokens",), file_rows=70)
    partition = tmp_path / "tokens" / f"run_id={RUN}"
    assert store.part_files("tokens", RUN) == files
    assert sorted(os.listdir(partition)) == sorted(os.path.basename(p) for p in files)   # staged files discarded
    (partition / "_staged-compact-deadbeef").mkdir()   # what a killed process leaves: the next one discards it
    (partition / "_staged-compact-deadbeef" / "part-x.parquet").write_bytes(b"half")
    monkeypatch.undo()
    compact_run(store, RUN, ("tokens",), file_rows=70)
    assert not (partition / "_staged-compact-deadbeef").exists()
    assert store.read("tokens", RUN).num_rows == 240


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), max_size=40), st.integers(1, 80))
def test_rid_ranges_cover_every_rid_once_within_the_size(counts, file_rows):
    ranges = rid_ranges(np.array(counts, dtype=np.int64), file_rows=file_rows)
    assert [i for a, b in ranges for i in range(a, b)] == list(range(len(counts)))
    for a, b in ranges:
        assert sum(counts[a:b]) <= file_rows or b - a == 1
    for (a, b), (c, _) in zip(ranges, ranges[1:]):   # a range closes only when the next rid would overfill it
        assert sum(counts[a:b]) + counts[c] > file_rows


def test_needs_compaction_on_overlap_or_too_many_files():
    def files(*bounds):
        return [FileRids(str(i), lo, hi, nulls, True) for i, (lo, hi, nulls) in enumerate(bounds)]
    assert not needs_compaction(files(("a", "c", False), ("d", "f", True)), planned=2)
    assert needs_compaction(files(("a", "d", False), ("c", "f", False)), planned=2)
    assert needs_compaction(files(("a", "b", False), ("c", "d", False), ("e", "f", False)), planned=2)
    assert needs_compaction(files((None, None, True), ("a", "b", True)), planned=2)   # nulls in two files
    assert needs_compaction(files(("", None, True), ("x", "y", False)), planned=2)    # no statistics


def _ceiling(root) -> pa.Table:
    ceiling = Store(root).read("ceiling", "bench")
    return ceiling.take(pc.sort_indices(ceiling, [("rid", "ascending"), ("dp_rank", "ascending"),
                                                  ("forward_ct", "ascending")]))


def test_estimate_of_a_compacted_run_equals_the_fragmented_run(tmp_path):
    root = tmp_path / "store"
    generate(root, rows=30_000, block_requests=64)
    assert len(Store(root).part_files("step_reqs", "bench")) > 4
    args = ["estimate", "--data", str(root), "--run", "bench", "--bootstrap", "0", "--jobs", "1"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert f"dspark-obs compact --data {root} --run bench" in " ".join(first.output.split())   # the hint
    fragmented = _ceiling(root)
    result = runner.invoke(app, ["compact", "--data", str(root), "--run", "bench", "--file-rows", "65536",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["table"]: r for r in json.loads(result.stdout)["rows"]}
    assert rows["step_reqs"]["files after"] == 1 < rows["step_reqs"]["files before"]
    assert rows["step_reqs"]["rows"] == fragmented.num_rows
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "dspark-obs compact" not in second.output
    compacted = _ceiling(root)
    for column in ("rid", "forward_ct", "lo", "mid", "hi", "category"):
        assert compacted.column(column).equals(fragmented.column(column)), column


def test_compact_refuses_an_unknown_run_and_an_object_store(tmp_path):
    store = Store(tmp_path)
    _write_batches(store, batches=2)
    unknown = runner.invoke(app, ["compact", "--data", str(tmp_path), "--run", "nope"])
    assert unknown.exit_code == 2 and "--run nope: not in" in " ".join(unknown.output.split())
    remote = runner.invoke(app, ["compact", "--data", "s3://bucket/prefix"])
    assert remote.exit_code == 2 and "local store" in " ".join(remote.output.split())
    small = runner.invoke(app, ["compact", "--data", str(tmp_path), "--file-rows", "10"])
    assert small.exit_code == 2


def test_compacted_files_are_written_with_the_store_options(tmp_path):
    store = Store(tmp_path)
    _write_batches(store)
    compact_run(store, RUN, ("tokens",), file_rows=70)
    meta = pq.ParquetFile(store.part_files("tokens", RUN)[0]).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"


def _doctor(root) -> tuple[int, dict]:
    result = runner.invoke(app, ["doctor", "--data", str(root), "--json"])
    return result.exit_code, {f["code"]: f for f in json.loads(result.stdout)["findings"]}


def test_doctor_points_a_fragmented_run_and_an_interrupted_compaction_to_compact(tmp_path, monkeypatch):
    import datetime as dt

    store = Store(tmp_path)
    _write_batches(store)
    now = dt.datetime.now(dt.timezone.utc)
    store.upsert_run(RUN, started_at=now, ended_at=now, source="import")
    code, found = _doctor(tmp_path)
    assert code == 0 and found["fragmented_run"]["severity"] == "info"
    assert "tokens 6 files (1 once compacted)" in found["fragmented_run"]["what"]
    assert f"dspark-obs compact --data {tmp_path} --run {RUN}" in found["fragmented_run"]["fix"]
    monkeypatch.setattr(compaction, "_finish", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        compact_run(store, RUN, ("tokens",))
    monkeypatch.undo()
    code, found = _doctor(tmp_path)
    assert code == 1 and found["compaction_interrupted"]["severity"] == "warn"
    assert "tokens" in found["compaction_interrupted"]["what"]
    compact_run(store, RUN)
    code, found = _doctor(tmp_path)
    assert code == 0 and "fragmented_run" not in found and "compaction_interrupted" not in found
