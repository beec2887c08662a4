"""What the collector exposes and where it writes: Prometheus metrics, OpenAI traffic, redaction, S3."""

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dspark_obs.sql import connect as connect_sql
from dspark_obs.store import open_store
from collectors.sglang.driver import DriveSpec
from collectors.sglang.metrics import SidecarMetrics
from collectors.sglang.session import CollectOptions, Collector, collect
from dspark_obs import sql
from dspark_obs.store import Store


def _scrape(port):
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_sidecar_metrics_count_rows_and_give_censoring_aware_gauges(tmp_path, emulator):
    srv = emulator(mode="cap-accept", seed=21)
    metrics = SidecarMetrics(window_rows=10**9)
    port = metrics.serve(0)
    try:
        store = Store(tmp_path)
        col = Collector(store, CollectOptions(url=srv.url, run_id="m", poll_interval=0.05, flush_interval=0.2,
                                              clear_at=0, drive=DriveSpec(["gsm8k", "poetry"], 24, concurrency=8,
                                                                          max_new_tokens=80)), metrics=metrics)
        summary = asyncio.run(col.run())
        got = _scrape(port)
    finally:
        metrics.close()
    assert got[("dspark_obs:rows_total", (("table", "steps"),))] == summary.steps
    assert got[("dspark_obs:rows_written_total", (("table", "step_reqs"),))] == summary.step_reqs
    assert got[("dspark_obs:polls_total", ())] == summary.polls
    assert got[("dspark_obs:poll_lag_seconds", ())] >= 0
    con = sql.connect(tmp_path)
    # Hand-computed from the stored rows: acceptance of draft k among request-steps that verified it.
    for k in (1, 3, 6):
        acc, = con.execute(f"""SELECT avg((correct_drafts >= {k})::DOUBLE) FROM step_reqs
                              WHERE verify_len - 1 >= {k} AND correct_drafts >= {k - 1}""").fetchone()
        assert got[("dspark_obs:verified_window_acceptance", (("position", str(k)),))] == pytest.approx(acc)
    censored, window = con.execute("""SELECT avg((correct_drafts = verify_len - 1 AND verify_len - 1 < 6)::DOUBLE),
                                             avg(verify_len - 1) FROM step_reqs""").fetchone()
    assert got[("dspark_obs:censored_step_share", ())] == pytest.approx(censored)
    assert got[("dspark_obs:mean_window", ())] == pytest.approx(window)
    assert 0 < got[("dspark_obs:verified_window_confidence", (("position", "1"),))] < 1


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_openai_traffic_reads_spec_tokens_details_and_commits_the_same_tokens(tmp_path, emulator, api):
    store = Store(tmp_path)
    for run, a in (("g", "generate"), ("o", api)):
        srv = emulator(mode="compact", seed=22)  # a fresh server per run: attach mode reads the whole deque
        s = collect(store, CollectOptions(url=srv.url, run_id=run, poll_interval=0.05, flush_interval=0.2,
                                          drive=DriveSpec(["gsm8k", "poetry"], 10, concurrency=5, temperature=0.7,
                                                          max_new_tokens=60, api=a)))
        assert s.requests == 10 and s.failed_requests == 0
    con = sql.connect(tmp_path)
    # sglext.spec_tokens_details agrees with the per-step records of the same run.
    rows = con.execute("""SELECT r.rid, r.api, r.spec_verify_ct, s.n, r.spec_cap_length, s.cap,
                                 list_sum(r.spec_cap_lens_histogram), r.spec_block_accept_length
                          FROM requests r JOIN (SELECT rid, count(*) n, avg(verify_len) cap FROM step_reqs
                                                WHERE run_id = 'o' GROUP BY rid) s USING (rid)
                          WHERE r.run_id = 'o'""").fetchall()
    assert len(rows) == 10
    for rid, got_api, verify_ct, n, cap, cap_steps, hist_total, block in rows:
        assert got_api == api and verify_ct == n == hist_total and cap == pytest.approx(cap_steps), rid
        assert block is None  # compact: SpecTokensDetails' 0.0 means "not reported"
    same = con.execute("""SELECT count(*) FROM (SELECT split_part(rid, '@', 1) AS rid, list(token_id ORDER BY pos) FILTER (WHERE run_id='g') a,
                          list(token_id ORDER BY pos) FILTER (WHERE run_id='o') b,
                          list(logprob ORDER BY pos) FILTER (WHERE run_id='o') l FROM tokens
                              GROUP BY split_part(rid, '@', 1))  -- rids are run-scoped: <rid>@<run>
                          WHERE a = b AND list_count(l) = len(a)""").fetchone()[0]
    assert same == 10


def test_redact_text_stores_no_text(tmp_path, emulator):
    srv = emulator(mode="compact", seed=23)
    store = Store(tmp_path)
    collect(store, CollectOptions(url=srv.url, run_id="r", flush_interval=0.2, redact_text=True,
                                  drive=DriveSpec(["poetry"], 4, concurrency=2, max_new_tokens=20, redact_text=True)))
    req = store.read("requests", "r").to_pylist()
    assert req and all(r["prompt_text"] is None and r["output_text"] is None for r in req)
    assert dict(store.read("runs", "r").to_pylist()[0]["labels"])["redact_text"] == "true"
    assert store.read("tokens", "r").num_rows == 0  # output token ids and top-k spell the text too
    collect(store, CollectOptions(url=srv.url, run_id="k", flush_interval=0.2, redact_text=True, keep_token_ids=True,
                                  drive=DriveSpec(["poetry"], 2, concurrency=2, max_new_tokens=20, redact_text=True)))
    assert store.read("tokens", "k").num_rows > 0


# -- object store --------------------------------------------------------------

@pytest.fixture(scope="module")
def s3_url(s3_endpoint):
    url = (f"s3://dspark-obs/runs?endpoint_override={s3_endpoint}&scheme=http"
           "&region=us-east-1&allow_bucket_creation=true")
    store = Store(url, writer_id="setup")
    store.fs.create_dir("dspark-obs")
    return url


def test_object_store_round_trip_with_sidecars_side_by_side(s3_url, emulator):
    srv = emulator(mode="compact", seed=24, dp_size=2)
    summaries = {}
    for writer in ("hostA.1", "hostB.2"):  # two sidecars, same bucket, no coordination
        store = open_store(s3_url, writer_id=writer)
        summaries[writer] = collect(store, CollectOptions(
            url=srv.url, run_id=f"s3-{writer.split('.')[0]}", poll_interval=0.05, flush_interval=0.2, clear_at=0,
            drive=DriveSpec(["gsm8k"], 8, concurrency=4, max_new_tokens=40)))
    reader = Store(s3_url, writer_id="reader")
    assert reader.runs() == ["s3-hostA", "s3-hostB"]
    names = [i.base_name for i in reader.fs.get_file_info(
        __import__("pyarrow.fs", fromlist=["FileSelector"]).FileSelector(f"{reader.base}/steps", recursive=True))
        if i.base_name.startswith("part-")]
    assert {n.split("-")[2] for n in names} == {"hostA.1", "hostB.2"}   # writer id in every file name
    con = connect_sql(s3_url)
    counts = dict(con.execute("SELECT run_id, count(*) FROM steps GROUP BY 1").fetchall())
    assert counts == {f"s3-{w.split('.')[0]}": s.steps for w, s in summaries.items()}
    runs = con.execute("SELECT run_id, end_reason, dp_size FROM runs ORDER BY 1").fetchall()
    assert runs == [("s3-hostA", "completed", 2), ("s3-hostB", "completed", 2)]
    assert con.execute("SELECT count(*) FROM step_reqs_w WHERE workload = 'gsm8k'").fetchone()[0] == \
        sum(s.step_reqs for s in summaries.values())


def test_the_grafana_dashboard_only_uses_metrics_the_sidecar_serves():
    import json
    import re
    from pathlib import Path

    import pyarrow as pa

    dash = json.loads((Path(__file__).resolve().parents[1] / "examples" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"dspark_obs:[a-z_]+", e)}
    metrics = SidecarMetrics()
    metrics.on_poll(0.01)
    metrics.on_rank(0, 5, 9)
    metrics.on_step_reqs(pa.table({"verify_len": pa.array([3], pa.int16()), "correct_drafts": pa.array([2], pa.int16()),
                                   "acc_len": pa.array([3], pa.int16()), "draft_tokens": [[1] * 6],
                                   "confidence": [[0.9] * 6]}))
    from dspark_obs import schema
    from tests.test_health import REQS, STEPS

    metrics.on_batch(pa.Table.from_pylist(STEPS, schema=schema.schema_for("steps")),
                     pa.Table.from_pylist(REQS, schema=schema.schema_for("step_reqs")), gamma=3)
    for name, labels in (("rows", ("steps",)), ("rows_written", ("steps",)), ("rows_dropped", ("steps",)),
                         ("gaps", ("clear",)), ("lost", ("clear",)), ("dead_letters", ("/server_info",))):
        getattr(metrics, name).labels(*labels).inc()
    served = {s.name for fam in metrics.registry.collect() for s in fam.samples}
    assert used and used <= served, used - served


def test_sidecar_aggregates_equal_a_row_by_row_reference():
    import numpy as np
    import pyarrow as pa

    from collectors.sglang import metrics

    rng = np.random.default_rng(0)
    conf = [None if rng.random() < 0.2 else
            [None if rng.random() < 0.05 else float(np.float32(x)) for x in rng.random(rng.integers(0, 9))]
            for _ in range(3000)]
    w = rng.integers(0, 7, 3000)
    c = np.minimum(w, rng.integers(0, 7, 3000))
    reqs = pa.table({"verify_len": pa.array(w + 1, pa.int16()), "correct_drafts": pa.array(c, pa.int16()),
                     "acc_len": pa.array(c + 1, pa.int16()), "draft_tokens": [[1] * 6] * 3000,
                     "confidence": pa.array(conf, pa.list_(pa.float32()))})
    agg = metrics.aggregate_step_reqs(reqs, positions=8)
    conf_sum, conf_n, reached = np.zeros(8), np.zeros(8, int), np.zeros(8, int)
    for i, row in enumerate(conf):
        for k in range(1, 9):
            if w[i] >= k and c[i] >= k - 1:
                reached[k - 1] += 1
                if row is not None and k <= len(row) and row[k - 1] is not None:
                    conf_sum[k - 1] += row[k - 1]
                    conf_n[k - 1] += 1
    assert agg["reached"].tolist() == reached.tolist() and agg["conf_n"].tolist() == conf_n.tolist()
    assert np.allclose(agg["conf_sum"], conf_sum)
