"""The benchmark harness runs, and the optimised paths it measures agree with their references.

No timing is asserted here: the figures live in ``bench/RESULTS.md`` and come
from ``bench/run_all``.  These checks keep the harness runnable (tiny sizes) and
the fast paths honest (the same rows as the reference paths).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from bench import estimate, gen_store, ingest
from collectors.sglang import decode

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def body(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "server_info.json"
    ingest.make_body(str(path), records=6, batch=24)
    return path


def _tables(info, **kw):
    return [decode.records_to_tables(rank.records, dp_rank=rank.dp_rank, **kw) for rank in info.ranks]


def test_the_fast_decoder_gives_the_reference_rows(body):
    data = body.read_bytes()
    fast, ref = decode._decode_fast(data), decode._decode_reference(data)
    assert fast is not None and fast.ranks[0].records
    for (s1, q1), (s2, q2) in zip(_tables(fast, segment=2), _tables(ref, segment=2)):
        assert s1.equals(s2) and q1.equals(q2)
    rank = ref.ranks[0]   # batch_index: each row's position in its record's reqs
    want = [i for r in rank.records for i in range(len(r.reqs or []))]
    assert _tables(ref, segment=0)[0][1].column("batch_index").to_pylist() == want and max(want) > 0
    # any subset of a rank's records, as the cursor hands them over
    f, r = fast.ranks[0].records, ref.ranks[0].records
    for pick in ([0], [1, 2], [0, 3, 5], list(range(len(f)))[2:]):
        a = decode.records_to_tables([f[i] for i in pick], dp_rank=0, segment=0)[1]
        b = decode.records_to_tables([r[i] for i in pick], dp_rank=0, segment=0)[1]
        assert a.equals(b)


def test_records_read_before_skip_their_lists_and_the_rest_read_the_same(body):
    data = body.read_bytes()
    full = decode.decode_server_info(data).ranks[0].records
    mark = full[2].forward_ct
    hinted = decode.decode_server_info(data, {0: mark}).ranks[0].records
    assert [decode.lists_skipped(r) for r in hinted] == [r.forward_ct <= mark for r in full]
    new_hinted = [r for r in hinted if r.forward_ct > mark]
    new_full = [r for r in full if r.forward_ct > mark]
    for a, b in zip(decode.records_to_tables(new_hinted, dp_rank=0, segment=0),
                    decode.records_to_tables(new_full, dp_rank=0, segment=0)):
        assert a.equals(b)


def test_the_list_parse_releases_the_body_as_it_reads_it(body, monkeypatch):
    """With ``release``, the fast path says after each block of requests how far into the body it has read:
    offsets that grow, end within the body past its last list, and leave the rows as they were."""
    monkeypatch.setattr(decode, "_BLOCK_ROWS", 5)
    data = body.read_bytes()
    offsets: list[int] = []
    released = decode.decode_server_info(data, release=offsets.append)
    assert len(offsets) == -(-6 * 24 // 5) and offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert data.rindex(b'"survival":[') < offsets[-1] <= len(data)
    for (s1, q1), (s2, q2) in zip(_tables(released, segment=0), _tables(decode.decode_server_info(data), segment=0)):
        assert s1.equals(s2) and q1.equals(q2)
    copy = decode._read_up_to(data, offsets.append)   # a Raw outside the body releases nothing
    copy(msgspec.json.decode(bytes(bytearray(data)), type=decode._FastServerInfo).internal_states[0]
         .dspark_info_record.records[0].reqs[0])
    assert len(offsets) == -(-6 * 24 // 5)


@pytest.mark.parametrize("edit", [
    lambda q: q.update(confidence=None),
    lambda q: q.update(confidence=[]),
    lambda q: q.update(survival=[1, 0.5, 1e-7, 3e38]),
    lambda q: q.update(draft_tokens=[2**31 - 1, -(2**31), 0]),
])
@pytest.mark.parametrize("block", [5, 8192])   # lists parsed 5 requests at a time: blocks with and without nulls
def test_edge_lists_read_the_same_on_both_paths(body, edit, block, monkeypatch):
    monkeypatch.setattr(decode, "_BLOCK_ROWS", block)
    doc = msgspec.json.decode(body.read_bytes())
    for rec in doc["internal_states"][0]["dspark_info_record"]["records"]:
        edit(rec["reqs"][0])
    data = msgspec.json.encode(doc)
    fast, ref = decode._decode_fast(data), decode._decode_reference(data)
    assert fast is not None   # the fast path reads them: whole null lists, empty lists, the extremes
    for (s1, q1), (s2, q2) in zip(_tables(fast, segment=0), _tables(ref, segment=0)):
        assert s1.equals(s2) and q1.equals(q2)


@pytest.mark.parametrize("bad", [
    lambda q: q.update(confidence=[0.5, None]),     # a null item
    lambda q: q.update(survival=[1e39]),            # beyond float32
    lambda q: q.update(confidence=[0.123456789]),   # becomes the integer -0 below: its sign is the reference's call
    lambda q: q.update(draft_tokens=[2**31]),       # out of int32
    lambda q: q.update(draft_tokens=[1.5]),         # not an int
    lambda q: q.update(confidence=[[0.5]]),         # nested
])
@pytest.mark.parametrize("block", [5, 8192])   # the unusual list in the last of many blocks, or in the only one
def test_anything_unusual_takes_the_reference_path(body, bad, block, monkeypatch):
    monkeypatch.setattr(decode, "_BLOCK_ROWS", block)
    doc = msgspec.json.decode(body.read_bytes())
    bad(doc["internal_states"][0]["dspark_info_record"]["records"][-1]["reqs"][-1])
    data = msgspec.json.encode(doc).replace(b"0.123456789", b"-0")
    assert decode._decode_fast(data) is None
    info = decode.decode_server_info(data)
    ref = decode._decode_reference(data)
    assert len(info.ranks[0].records) == len(ref.ranks[0].records)
    assert len(info.ranks[0].dead) == len(ref.ranks[0].dead)


def test_ingest_sides_write_the_same_rows(body, tmp_path):
    ours = ingest.ours(str(body), repeat=1)
    base = ingest.baseline(str(body), str(tmp_path / "base.parquet"))
    assert ours["rows"] == base == 6 * 24
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "base.parquet").num_rows == base


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("store")
    info = gen_store.generate(root, rows=4000, block_requests=200)
    assert 4000 <= info["rows"] < 4000 + 2000 and info["tokens"] > info["rows"]
    return root


def test_the_shipped_commands_run_on_generated_stores(small_store, tmp_path):
    out = estimate.commands(str(small_store), str(tmp_path / "report"))
    assert set(out) == {"estimate_jobs1", "estimate", "calibrate", "report"}
    assert all("error" not in r and r["cpu"] > 0 and r["peak_mb"] > 0 for r in out.values()), out
    assert list((tmp_path / "report").glob("*.md"))
    walls = estimate.jobs_pairs(str(small_store), out, pairs=2)   # the --jobs ratio's runs, alternating
    assert walls["estimate_jobs1"][0] == out["estimate_jobs1"]["wall"] and walls["estimate"][0] == out["estimate"]["wall"]
    assert all(len(w) == 2 and min(w) > 0 for w in walls.values()), walls
    from dspark_obs import sql

    con = sql.connect(small_store)
    cats = dict(con.sql("SELECT category, count(*) FROM ceiling GROUP BY 1").fetchall())
    assert cats.get("exact_in_window") and cats.get("censored_resolved_exact")
    # the generator's truth is what a full block accepts: the greedy ceiling is exact
    exact = con.sql("""SELECT count(*) FILTER (WHERE abs(c.mid - s.emu_block_accept) > 1e-9), count(*)
                       FROM ceiling c JOIN step_reqs s USING (run_id, dp_rank, forward_ct, rid)
                       WHERE c.temperature = 0 AND c.category IN ('exact_in_window', 'censored_resolved_exact')""").fetchall()[0]
    assert exact[1] > 0 and exact[0] == 0


def test_the_vectorised_rule_matches_the_per_row_loop(small_store):
    out = estimate.core(str(small_store), loop_rows=10_000)
    assert out["same"] and out["loop_rows"] == out["rows"]


def test_the_loop_baseline_is_sglangs_rule_on_a_hand_case():
    drafts = np.array([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    realised = np.array([[5, 6, 9, 8], [5, 6, -1, -1], [5, 6, 7, 8]])
    lo, hi = estimate.sglang_rule_loop(drafts, np.array([1, 1, 2]), np.array([1, 1, 1]), realised,
                                       np.array([False, False, False]), np.full((3, 4), 0.5))
    # row 0: d2 accepted (0.5), d3 diverges (0.25), d4 unverifiable -> hi adds 0.25 * 1
    assert lo.tolist() == [1.75, 1.5, 1.0] and hi.tolist() == [2.0, 2.5, 1.0]


def test_run_all_writes_its_figures(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all"), "--tiny", "--only",
                           "ingest,collect,estimate,compact,floors", "--json", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)  # a hang guard, not a speed check
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    for key in ("ingest.rows_per_s", "ingest.baseline_rows_per_s", "ingest.ratio", "ingest.peak_mb",
                "collect.gaps", "collect.step_loop_slowdown", "estimate.rows_per_s", "estimate.ratio",
                "estimate.peak_mb", "estimate.scaling_exponent", "compact.estimate_speedup", "floors.estimate.floor_cpu_s",
                "floors.calibrate.floor_cpu_s", "floors.ingest.floor_cpu_s"):
        assert key in res, (key, {k: v for k, v in res.items() if "error" in k})
    assert res["collect.dead_letters"] == 0
    # the firehose: the collector stored every forward_ct it covered, each a full batch
    assert res["collect.firehose.gaps"] == 0 and res["collect.firehose.dead_letters"] == 0, res
    assert res["collect.firehose.missing_forward_cts"] == 0 and res["collect.firehose.duplicate_steps"] == 0
    assert res["collect.firehose.rows_stored_match"] and res["collect.firehose.rows"] > 0
    assert "ingest --server-info rows/s" in proc.stdout and "baseline" in proc.stdout and "ratio" in proc.stdout


def test_the_firehose_stamps_every_step_and_its_dumper_encodes_like_the_emulator():
    from bench import firehose

    pool = firehose.build_pool(records=3, batch=4)
    hose = firehose.Firehose(pool, ranks=2, rate=1000.0, max_records=5)
    for _ in range(7):
        hose.tick()
    payloads = hose.dump()  # drains the pending step: all 7 produced, the deque keeps the last 5
    assert [d.records_produced for d in hose.dumpers] == [7, 7]
    for payload in payloads:
        recs = payload["records"]
        assert [r["forward_ct"] for r in recs] == [3, 4, 5, 6, 7]
        assert all(r["bs"] == 4 and len(r["reqs"]) == 4 and len(r["reqs"][0]["confidence"]) == 6 for r in recs)
        assert len({q["rid"] for q in recs[0]["reqs"]}) == 4
    info = decode.decode_server_info(msgspec.json.encode({"internal_states": [
        {"dspark_info_record": p} for p in payloads]}))
    assert [len(r.records) for r in info.ranks] == [5, 5] and not any(r.dead for r in info.ranks)
    hose.clear()
    assert [len(p["records"]) for p in hose.dump()] == [0, 0]


def test_the_compaction_benchmark_times_both_layouts_and_compares_their_estimates(tmp_path):
    from bench import compact

    out = compact.run(workdir=str(tmp_path), rows=8_000, block_requests=64, repeat=1)
    assert "compact.error" not in out, out
    assert out["compact.files_before"] > out["compact.files_after"] == 1
    assert out["compact.same_ceiling"] is True
    for command in ("estimate", "calibrate"):
        assert out[f"compact.{command}_fragmented_cpu_s"] > 0 and out[f"compact.{command}_compacted_cpu_s"] > 0
        assert out[f"compact.{command}_speedup"] == round(out[f"compact.{command}_fragmented_cpu_s"]
                                                          / out[f"compact.{command}_compacted_cpu_s"], 3)


def test_the_floors_count_the_library_work_the_targets_need(tmp_path):
    from bench import floors
    from bench.gen_store import generate
    from bench.ingest import make_bodies

    store, body = tmp_path / "store", tmp_path / "bodies.jsonl"
    generate(store, rows=6_000, block_requests=64)
    proc = subprocess.run([sys.executable, "-m", "dspark_obs.cli", "estimate", "--data", str(store), "--run", "bench",
                           "--bootstrap", "0"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = make_bodies(str(body), bodies=2, records=3, batch=8)
    res = floors.run(store=str(store), body=str(body), baseline_cpu_s=2.0, chunk_rows=2_000)
    assert not {k: v for k, v in res.items() if "error" in k}, res
    assert res["floors.estimate.step_reqs_rows"] == res["floors.estimate.ceiling_rows"] > 0
    assert res["floors.estimate.floor_cpu_s"] == round(res["floors.estimate.read_step_reqs_cpu_s"]
                                                       + res["floors.estimate.read_tokens_cpu_s"]
                                                       + res["floors.estimate.write_ceiling_uncompressed_cpu_s"], 2)
    # the bootstrap's products were counted while calibrate ran: 1000 resamples, both precisions' work
    assert res["floors.calibrate.gflop_float64"] > 0 and res["floors.calibrate.product_shape"][0] == 1000
    assert res["floors.calibrate.floor_cpu_s"] > res["floors.calibrate.products_cpu_s"] > 0
    assert res["floors.ingest.rows"] == info["rows"] and res["floors.ingest.bodies"] == 2
    assert res["floors.ingest.tenth_of_baseline_cpu_s"] == 0.2
    assert res["floors.ingest_memory.body_mb"] == round(info["largest_body_bytes"] / 2**20, 1)


def test_the_largest_line_is_found_across_read_blocks(tmp_path):
    from bench.floors import _largest_line

    path = tmp_path / "lines"
    path.write_bytes(b"ab\n" + b"x" * 10 + b"\nabc")
    assert _largest_line(str(path), block=3) == (10, 3)
    path.write_bytes(b"ab\nabcd")
    assert _largest_line(str(path), block=2) == (4, 3)
