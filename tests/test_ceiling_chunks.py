"""Tests for estimators.chunks and the chunked estimate_run: chunks of whole requests give one pass's results."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dspark_obs import sql
from dspark_obs.estimators.ceiling import estimate_run, inputs
from dspark_obs.estimators.run_requests import RunRequests
from dspark_obs.estimators.chunks import plan_chunks, rid_hash, sample_parts, sample_requests, sample_spans
from dspark_obs.store import Store


# -- pure planning -------------------------------------------------------------------------------

def test_plan_chunks_keeps_requests_whole_and_in_order():
    chunks = plan_chunks(["a", "b", "c", "d", None], np.array([3, 2, 9, 1, 4]), chunk_rows=5)
    assert [(c.params.get("chunk_lo"), c.params.get("chunk_hi"), c.rows) for c in chunks] == [
        ("a", "b", 5), ("c", "c", 9), ("d", "d", 1), (None, None, 4)]   # c alone is bigger than a chunk
    assert chunks[0].on("s.rid") == "s.rid BETWEEN $chunk_lo AND $chunk_hi"
    assert chunks[-1].on("rid") == "rid IS NULL"


def test_a_run_that_fits_is_one_chunk_without_a_predicate():
    (chunk,) = plan_chunks(["a", None], np.array([2, 2]), chunk_rows=4)
    assert chunk.on("rid") == "TRUE" and chunk.rows == 4
    with pytest.raises(ValueError, match="chunk_rows must be >= 1"):
        plan_chunks(["a"], np.array([1]), chunk_rows=0)


def test_sample_takes_blocks_of_whole_requests_by_hash_up_to_the_limit():
    rids = [f"r{i:02d}" for i in range(50)] + [None]
    counts = np.full(51, 10)
    sample = sample_requests(rids, counts, max_rows=95, block=4)
    spans = sample_spans(rids, sample)
    chosen = [rids[i] for a, b in spans for i in range(a, b + 1)]
    assert sample.rows == 80 and sample.requests == 8 == len(chosen)       # two blocks of 4 fit in 95 steps
    starts = list(range(0, 50, 4))
    first = sorted(starts, key=lambda i: (rid_hash([rids[i]])[0], i))[:2]      # the blocks of the smallest hashes
    assert chosen == [rids[i] for s in sorted(first) for i in range(s, s + 4)]
    assert sample.on("rid").count("BETWEEN") == len(spans) and "IN" not in sample.where
    every = sample_requests(rids, counts, max_rows=500, block=4)   # all 13 blocks (the last of 2): one range
    assert every.rows == 500 and sample_spans(rids, every) == [(0, 49)] and every.where.count("BETWEEN") == 1
    assert sample_requests(rids, counts, max_rows=510).on("rid") == "TRUE"
    assert sample_requests([None], np.array([20]), max_rows=10).on("rid") == "FALSE"


def test_a_sample_reads_the_requests_it_names(generated):
    con = sql.connect(generated.root)
    rids, counts = inputs.run_rids(con, "bench", generated.root)
    sample = sample_requests(rids, counts, max_rows=int(counts.sum()) // 3, block=5)
    got = con.sql(f"SELECT rid, count(*) AS n FROM step_reqs WHERE {sample.on('rid')} GROUP BY rid ORDER BY rid",
                  params=sample.params).fetchall()
    spans = sample_spans(rids, sample)
    assert got == [(rids[i], int(counts[i])) for a, b in spans for i in range(a, b + 1)]
    assert sum(n for _, n in got) == sample.rows and len(spans) > 1
    parts = sample_parts(rids, counts, sample, part_rows=int(counts.sum()) // 10)
    assert sum(p.rows for p in parts) == sample.rows and len(parts) > 2
    params = [k for p in parts for k in p.params]
    assert len(params) == len(set(params))                                  # one read may hold several parts


def test_steps_come_in_the_order_the_database_sorts_them_whether_the_scan_was_sorted_or_not():
    import duckdb

    rng = np.random.default_rng(5)
    n = 400
    rids = rng.choice(np.array(["b-2", "a-10", "a-9", "\u00e9-1", "Z"], dtype=object), n).tolist()
    rids[::37] = [None] * len(rids[::37])
    steps = pa.table({"rid": pa.array(rids, pa.string()), "prefix_len": rng.integers(0, 5, n),
                      "dp_rank": rng.integers(0, 2, n), "forward_ct": rng.permutation(n),
                      "draft_tokens": pa.array([[int(i), 1] for i in range(n)], pa.list_(pa.int32()))})
    expected = duckdb.sql("SELECT * FROM steps ORDER BY rid, prefix_len, dp_rank, forward_ct").to_arrow_table()
    got = inputs.in_step_order(steps)
    assert got.equals(expected) and got.column("rid").to_pylist()[-1] is None
    assert inputs.in_step_order(expected) is expected          # a sorted scan is returned as it is, not copied


def test_each_step_gets_its_requests_columns_from_the_runs_requests(generated):
    con = sql.connect(generated.root)
    requests = RunRequests.read(con, "bench")
    rids = pa.chunked_array([pa.array([requests.rids[3], None, "no-such-rid", requests.rids[0], requests.rids[3]])])
    got = requests.per_step(rids)
    row = {k: v[0] for k, v in requests.table.slice(3, 1).to_pydict().items() if k != "rid"}
    assert got.num_rows == 5 and got.slice(0, 1).to_pylist() == [row] == got.slice(4, 1).to_pylist()
    assert all(v is None for v in got.slice(1, 1).to_pylist()[0].values())
    assert all(v is None for v in got.slice(2, 1).to_pylist()[0].values())
    assert got.slice(3, 1).to_pylist()[0]["workload"] == requests.table.column("workload")[0].as_py()


def test_rid_hash_is_stable():
    assert rid_hash(["gsm8k-00000001"]).tolist() == rid_hash(["gsm8k-00000001"]).tolist()
    assert rid_hash([None]).tolist() == rid_hash([""]).tolist()


# -- chunked estimate_run ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Store:
    from bench.gen_store import generate

    root = tmp_path_factory.mktemp("chunks")
    generate(root, rows=6000, seed=3)
    return Store(root)


def _same_rows(a: pa.Table, b: pa.Table, *, approx: set[str] = frozenset()) -> None:
    assert a.num_rows == b.num_rows and a.column_names == b.column_names
    for name in a.column_names:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        if name in approx:
            assert [v is None for v in x] == [v is None for v in y], name
            x, y = [v for v in x if v is not None], [v for v in y if v is not None]
            assert x == pytest.approx(y, rel=1e-12, abs=1e-12, nan_ok=True), name
        else:
            assert x == y, name


def test_chunked_estimate_equals_one_pass(generated):
    one = estimate_run(generated, "bench", n_bootstrap=40, write=False)
    many = estimate_run(generated, "bench", n_bootstrap=40, write=False, chunk_rows=700, progress=None)
    assert one.num_rows == many.num_rows == one.ceiling.num_rows
    _same_rows(one.ceiling, many.ceiling)                        # every per-step value, bit for bit
    _same_rows(one.summary, many.summary)                        # per-request totals: the same bootstrap
    bins = pc.equal(one.validation.column("group_kind"), "bin")
    assert pc.sum(bins).as_py() == 8 and one.validation.column("group_kind").equals(many.validation.column("group_kind"))
    _same_rows(one.validation.filter(bins), many.validation.filter(bins))   # bins rank the whole run: same rows
    _same_rows(one.validation.filter(pc.invert(bins)), many.validation.filter(pc.invert(bins)),
               approx={"mean_lo", "mean_mid", "mean_hi", "mean_truth", "bias", "mae", "coverage",   # the other
                       "mean_emu_expected", "emu_bias", "emu_mae", "emu_coverage"})   # groups: sums added by chunk
    assert one.steps_with_truth == many.steps_with_truth and one.truth_source == many.truth_source == "emulator"


def test_chunked_write_stages_then_replaces_and_reads_back(generated):
    seen = []
    result = estimate_run(generated, "bench", n_bootstrap=0, chunk_rows=1000,
                          progress=lambda done, total: seen.append((done, total)))
    assert len(seen) >= 6 and seen[-1][0] == seen[-1][1] == result.num_rows
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    stored = generated.read("ceiling", "bench")
    # each chunk's rows are one committed part file (staged, then renamed); nothing is left staged
    parts = list((generated.root / "ceiling").glob("run_id=bench/part-*"))
    assert stored.num_rows == result.num_rows and len(parts) == len(seen) >= 6
    assert not list((generated.root / "ceiling").glob("*/_staged-*"))
    _same_rows(result.ceiling, estimate_run(generated, "bench", n_bootstrap=0, write=False).ceiling)


def test_a_sampled_fit_changes_only_the_temperature_estimate(generated):
    full = estimate_run(generated, "bench", n_bootstrap=0, write=False).ceiling
    sampled = estimate_run(generated, "bench", n_bootstrap=0, write=False, chunk_rows=1500, fit_rows=1500).ceiling
    for name in ("rid", "forward_ct", "category", "walked", "censored"):
        assert full.column(name).to_pylist() == sampled.column(name).to_pylist(), name
    greedy = np.asarray(full.column("temperature").to_pylist()) == 0
    col = lambda t, name: np.asarray(t.column(name).to_pylist())  # noqa: E731
    for name in ("lo", "mid", "hi"):
        assert np.array_equal(col(full, name)[greedy], col(sampled, name)[greedy]), name
    assert not np.array_equal(col(full, "mid")[~greedy], col(sampled, "mid")[~greedy])
    assert np.all((col(sampled, "lo") - 1e-9 <= col(sampled, "mid")) & (col(sampled, "mid") <= col(sampled, "hi") + 1e-9))


def test_a_failing_chunked_run_keeps_the_old_results(tmp_path):
    from tests.test_ceiling_run import _write_run

    store = Store(tmp_path)
    _write_run(store, "cmp", "compact")
    estimate_run(store, "cmp", n_bootstrap=0)
    before = store.read("ceiling", "cmp")
    # the same run with its prompts one token short: every step misaligned; noticed after all chunks
    con = sql.connect(store.root, read_only=False)
    store.drop_run("requests", "cmp")
    store.write("requests", "cmp", [
        {"rid": "g", "workload": "math", "temperature": 0.0, "prompt_tokens": 2, "completion_tokens": 8,
         "finish_reason": "stop"},
        {"rid": "t", "workload": "poetry", "temperature": 1.0, "prompt_tokens": 3, "completion_tokens": 5,
         "finish_reason": "length"}])
    with pytest.raises(ValueError, match="prompt_tokens must be the prompt length"):
        estimate_run(con, "cmp", chunk_rows=1)
    assert store.read("ceiling", "cmp").equals(before)
