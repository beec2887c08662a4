"""Tests for dspark_obs.store: validation, atomic writes, runs upsert, fingerprints."""

from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dspark_obs import schema
from dspark_obs.store import Store

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


def _value_for(type_: pa.DataType):
    if pa.types.is_boolean(type_):
        return True
    if pa.types.is_timestamp(type_):
        return NOW
    if pa.types.is_string(type_):
        return "x"
    if pa.types.is_list(type_):
        return [_value_for(type_.value_type), _value_for(type_.value_type)]
    if pa.types.is_map(type_):
        return [("k", "v")]
    if pa.types.is_floating(type_):
        return 0.5
    return 7


def required_row(table: str) -> dict:
    """Only the non-nullable columns of ``table``, each with a fixed value."""
    return {f.name: _value_for(f.type) for f in schema.TABLES[table] if not f.nullable}


def test_repr_and_empty_store(tmp_path):
    store = Store(tmp_path / "nowhere")
    assert store.runs() == [] and store.tables() == []
    assert store.read("steps").num_rows == 0
    assert store.read("steps").column_names == [*schema.STEPS.names, "run_id"]


@pytest.mark.parametrize("table", sorted(schema.TABLES))
def test_round_trip_with_optional_columns_omitted_reads_them_as_null(tmp_path, table):
    store = Store(tmp_path)
    row = required_row(table)
    path = store.write(table, "run-1", [row, row])
    assert path is not None and path.name.startswith("part-") and path.suffix == ".parquet"
    assert path.parent.name == "run_id=run-1" and path.parent.parent.name == table

    got = store.read(table)
    assert got.column_names == [*schema.TABLES[table].names, "run_id"]
    assert got.num_rows == 2
    for f in schema.TABLES[table]:
        column = got.column(f.name)
        assert column.type == f.type
        if f.nullable:
            assert column.null_count == 2, f.name
        else:
            expected = row[f.name]
            if pa.types.is_floating(f.type):
                assert column.to_pylist() == [pytest.approx(expected)] * 2
            else:
                assert column.to_pylist() == [expected, expected], f.name
    assert got.column("run_id").to_pylist() == ["run-1", "run-1"]


def test_arrow_input_is_cast_and_missing_nullable_columns_become_null(tmp_path):
    store = Store(tmp_path)
    rows = pa.table({
        "rid": ["a", "b"],
        "pos": pa.array([0, 1], pa.int64()),  # wider than the schema's int32
        "token_id": pa.array([5, 6], pa.int64()),
        "logprob": [-0.5, -1.0],  # float64 -> float32
    })
    store.write("tokens", "r", rows)
    got = store.read("tokens", "r")
    assert got.schema.field("pos").type == pa.int32()
    assert got.column("logprob").to_pylist() == [-0.5, -1.0]
    assert got.column("top_ids").null_count == 2


def test_rows_keep_schema_version_in_file_metadata(tmp_path):
    path = Store(tmp_path).write("gaps", "r", [required_row("gaps")])
    metadata = pq.read_metadata(path).metadata
    assert metadata[schema.METADATA_KEY] == schema.SCHEMA_VERSION.encode()
    assert pq.read_metadata(path).row_group(0).column(0).compression.lower() == "zstd"


def test_empty_input_writes_nothing(tmp_path):
    store = Store(tmp_path)
    assert store.write("steps", "r", []) is None
    assert store.write("steps", "r", schema.STEPS.empty_table()) is None
    assert not (tmp_path / "steps").exists()


def test_extra_columns_are_an_error_naming_them(tmp_path):
    row = {**required_row("gaps"), "colour": "red", "size": 3}
    with pytest.raises(ValueError, match=r"gaps: unknown columns \['colour', 'size'\]"):
        Store(tmp_path).write("gaps", "r", [row])
    table = pa.table({**{k: [v] for k, v in required_row("tokens").items()}, "oops": [1]})
    with pytest.raises(ValueError, match=r"unknown columns \['oops'\]"):
        Store(tmp_path).write("tokens", "r", table)


def test_missing_or_null_required_columns_are_errors(tmp_path):
    store = Store(tmp_path)
    row = required_row("gaps")
    del row["reason"]
    with pytest.raises(ValueError, match=r"missing required columns \['reason'\]"):
        store.write("gaps", "r", [row])
    with pytest.raises(ValueError, match=r"required columns hold nulls: reason \(1\)"):
        store.write("gaps", "r", [{**row, "reason": None}])
    with pytest.raises(ValueError, match="do not fit the schema"):
        store.write("gaps", "r", [{**row, "reason": "clear", "dp_rank": "zero"}])
    assert store.tables() == []


def test_run_id_column_must_agree_with_the_partition(tmp_path):
    store = Store(tmp_path)
    store.write("gaps", "r", [{**required_row("gaps"), "run_id": "r"}])
    assert store.read("gaps").column("run_id").to_pylist() == ["r"]
    with pytest.raises(ValueError, match="run_id disagrees"):
        store.write("gaps", "r", [{**required_row("gaps"), "run_id": "other"}])


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "a b", "ü", ".", ".."])
def test_invalid_run_id_names_value_and_pattern(tmp_path, bad):
    with pytest.raises(ValueError, match=r"invalid run_id .*pattern \[A-Za-z0-9_\.-\]\+"):
        Store(tmp_path).write("gaps", bad, [required_row("gaps")])
    with pytest.raises(ValueError, match="invalid run_id"):
        Store(tmp_path).read("gaps", bad)


def test_unknown_table_is_an_error(tmp_path):
    with pytest.raises(KeyError, match="unknown table 'nope'"):
        Store(tmp_path).write("nope", "r", [{"a": 1}])


def test_numeric_run_id_stays_a_string(tmp_path):
    store = Store(tmp_path)
    store.write("gaps", "001", [required_row("gaps")])
    assert store.read("gaps").column("run_id").to_pylist() == ["001"]
    assert store.runs() == ["001"]


def test_leftover_tmp_and_foreign_files_are_ignored(tmp_path):
    store = Store(tmp_path)
    path = store.write("gaps", "r", [required_row("gaps")])
    good = path.read_bytes()
    (path.parent / f".{path.name.replace('part-', 'part-z')}.tmp").write_bytes(good[: len(good) // 2])
    (path.parent / "junk.parquet").write_bytes(good[:100])  # truncated, not a part file
    (path.parent / "_SUCCESS").write_bytes(b"")
    assert store.read("gaps").num_rows == 1
    assert store.read("gaps", "r").num_rows == 1
    assert store.runs() == ["r"]


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    store = Store(tmp_path)

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "rename", boom)
    with pytest.raises(OSError, match="disk full"):
        store.write("gaps", "r", [required_row("gaps")])
    monkeypatch.undo()
    assert list((tmp_path / "gaps" / "run_id=r").iterdir()) == []
    assert store.read("gaps").num_rows == 0


def test_appends_are_separate_files_and_read_filters_by_run(tmp_path):
    store = Store(tmp_path)
    store.write("gaps", "a", [required_row("gaps")])
    store.write("gaps", "a", [required_row("gaps")])
    store.write("gaps", "b", [required_row("gaps")])
    assert store.read("gaps").num_rows == 3
    assert store.read("gaps", "a").num_rows == 2
    assert store.read("gaps", "zzz").num_rows == 0
    assert len(list((tmp_path / "gaps" / "run_id=a").glob("part-*.parquet"))) == 2


def test_upsert_run_keeps_exactly_one_row_and_merges_fields(tmp_path):
    store = Store(tmp_path)
    store.upsert_run("r", started_at=NOW, source="emulator", gamma=6, labels={"workload": "gsm8k"})
    store.upsert_run("r", ended_at=NOW, end_reason="completed")
    store.upsert_run("r", gamma=7)
    runs = store.read("runs")
    assert runs.num_rows == 1
    row = runs.to_pylist()[0]
    assert (row["source"], row["gamma"], row["end_reason"]) == ("emulator", 7, "completed")
    assert row["started_at"] == NOW and row["ended_at"] == NOW
    assert row["labels"] == [("workload", "gsm8k")]
    assert len(list((tmp_path / "runs" / "run_id=r").glob("part-*.parquet"))) == 1


def test_upsert_run_first_insert_needs_required_fields(tmp_path):
    with pytest.raises(ValueError, match=r"missing required columns \['source'\]"):
        Store(tmp_path).upsert_run("r", started_at=NOW)
    with pytest.raises(ValueError, match=r"unknown columns \['colour'\]"):
        Store(tmp_path).upsert_run("r", started_at=NOW, source="x", colour="red")


def test_runs_reader_prefers_newest_file_when_an_old_one_lingers(tmp_path):
    store = Store(tmp_path)
    old = store.upsert_run("r", started_at=NOW, source="emulator", mode="static")
    old_bytes = old.read_bytes()
    new = store.upsert_run("r", mode="compact")
    assert not old.exists() and new.name > old.name
    old.write_bytes(old_bytes)  # as if the writer died before deleting it
    assert store.read("runs").column("mode").to_pylist() == ["compact"]
    store.upsert_run("r", mode="cap-accept")
    assert not old.exists() and not new.exists()


def test_runs_tables_and_version_track_contents(tmp_path):
    store = Store(tmp_path)
    empty = store.version()
    assert empty == store.version()
    store.write("gaps", "a", [required_row("gaps")])
    store.write("steps", "b", [required_row("steps")])
    assert store.runs() == ["a", "b"]
    assert store.tables() == ["gaps", "steps"]
    v1 = store.version()
    assert v1 != empty and v1 == store.version()
    store.write("gaps", "a", [required_row("gaps")])
    assert store.version() != v1
    v2 = store.version()
    (tmp_path / "gaps" / "run_id=a" / ".part-x.parquet.tmp").write_bytes(b"partial")
    assert store.version() == v2  # tmp files do not count
    store.stage("requests", "a", [required_row("requests")], "b1")   # staged: not visible, not a table yet
    assert store.flat_tables() == ["gaps", "steps"]
    store.commit_staged("requests", "a", "b1")
    assert store.flat_tables() == ["gaps", "requests", "steps"]


def test_upsert_run_sorts_after_a_file_from_the_future(tmp_path):
    store = Store(tmp_path)
    first = store.upsert_run("r", started_at=NOW, source="emulator", mode="static")
    future = first.with_name("part-29991231T235959999999Z-deadbeef.parquet")
    first.rename(future)  # e.g. written by a host whose clock ran ahead
    newest = store.upsert_run("r", mode="compact")
    assert newest.name > future.name and not future.exists()
    assert store.read("runs").column("mode").to_pylist() == ["compact"]
