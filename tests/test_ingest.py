"""dspark-obs ingest: every artifact kind from real files, bad lines to dead letters."""

import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from collectors.workloads import WorkloadResolver
from collectors.importers.estimator import estimator_row
from dspark_obs import sql
from dspark_obs.cli import app
from dspark_obs.store import Store
from tests.conftest import run_engine

runner = CliRunner()


def _ingest(out, run_id, *args):
    result = runner.invoke(app, ["ingest", "--out", str(out), "--run-id", run_id, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_server_info_bodies_as_curl_saves_them(tmp_path, emulator):
    srv = emulator(mode="compact", seed=31, track_produced=True)
    path = tmp_path / "info.jsonl"
    with httpx.Client(base_url=srv.url, timeout=60) as client, open(path, "wb") as f:
        for i in range(3):
            for j in range(4):
                client.post("/generate", json={"text": f"[gsm8k] {i}{j}", "rid": f"gsm8k-{i}{j:03d}",
                                               "sampling_params": {"max_new_tokens": 30}})
            f.write(client.get("/server_info").content)  # no newline: bodies run together
        f.write(b"\n<html>502 Bad Gateway</html>\n")
    _ingest(tmp_path / "d", "si", "--server-info", str(path))
    store = Store(tmp_path / "d")
    produced = {fct for fct, _ in srv.emulator.engine.ranks[0].dumper.produced}
    steps = store.read("steps", "si").column("forward_ct").to_pylist()
    assert sorted(steps) == sorted(produced)  # overlapping bodies read once
    assert store.read("dead_letters", "si").num_rows == 1
    run = store.read("runs", "si").to_pylist()[0]
    assert (run["mode"], run["gamma"], run["source"], run["end_reason"]) == ("compact", 6, "import", "completed")
    workloads = set(store.read("requests", "si").column("workload").to_pylist())
    assert workloads == {"gsm8k"}


def test_generate_bodies_and_request_logs(tmp_path, emulator):
    srv = emulator(mode="cap-accept", seed=32)
    bodies = []
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        for i in range(4):
            obj = {"text": f"[poetry] {i}", "rid": f"poetry-{i:06d}", "return_logprob": True, "top_logprobs_num": 2,
                   "sampling_params": {"max_new_tokens": 25, "temperature": 0.5, "sampling_seed": i}}
            bodies.append((obj, client.post("/generate", json=obj).json()))
    gen = tmp_path / "gen.jsonl"
    gen.write_text("\n".join(json.dumps(b) for _, b in bodies) + "\n{not json\n")
    log = tmp_path / "requests.log"
    lines = ["INFO server started on port 30000"]
    for obj, body in bodies[:2]:
        lines.append("[2026-11-29 10:00:00] " + json.dumps({"timestamp": "2026-11-29T10:00:00", "event": "request.received",
                                                            "rid": obj["rid"], "obj": obj}))
        lines.append("[2026-11-29 10:00:01] " + json.dumps({"timestamp": "2026-11-29T10:00:01", "event": "request.finished",
                                                            "rid": obj["rid"], "obj": obj, "out": body}))
    for obj, body in bodies[2:]:  # --export-metrics-to-file lines
        lines.append(json.dumps({"request_parameters": json.dumps(obj), **body["meta_info"]}))
    lines.append('{"event": "request.finished", "rid": "x", "obj": {}}')  # no out: dead letter
    log.write_text("\n".join(lines) + "\n")
    out = _ingest(tmp_path / "d", "rq", "--generate", str(gen), "--request-log", str(log))
    assert "3 lines skipped" in out
    store = Store(tmp_path / "d")
    req = store.read("requests", "rq").to_pylist()
    assert sorted(r["api"] for r in req) == ["generate"] * 4 + ["log"] * 4
    logged = {r["rid"]: r for r in req if r["api"] == "log"}
    assert all(r["temperature"] == pytest.approx(0.5) and r["spec_block_accept_length"] > 0 for r in logged.values())
    assert logged["poetry-000000"]["prompt_text"] == "[poetry] 0" and logged["poetry-000002"]["workload"] == "poetry"
    assert store.read("dead_letters", "rq").num_rows == 2
    con = sql.connect(tmp_path / "d")
    n_tokens = con.execute("SELECT count(*) FROM tokens WHERE run_id = 'rq'").fetchone()[0]
    # every request twice: once from the generate file, once from the log (exported meta_info keeps logprobs too)
    assert n_tokens == 2 * sum(b["meta_info"]["completion_tokens"] for _, b in bodies)


def test_estimator_jsonl_from_the_emulator(tmp_path):
    path = tmp_path / "est.jsonl"
    eng, _ = run_engine("compact", n=12, temperature=0.8, seed=33, estimate_path=str(path), folded_proposal=False)
    eng.ranks[0].estimator.close()
    lines = path.read_text().splitlines()
    with open(path, "a") as f:
        f.write('{"rid": "r", "fct": "NaN", "w": 1, "cl": 1, "ct": 0}\n{"rid": "r", "fct": 3, "w": 2, "cl": 2, "ct": 0, '
                '"trimmed_tokens": [5], "q_lp": [-Infinity], "new_field": 1}\n')
    _ingest(tmp_path / "d", "est", "--estimator-jsonl", str(path))
    store = Store(tmp_path / "d")
    rows = store.read("estimator_records", "est").to_pylist()
    assert len(rows) == len(lines) + 1 and store.read("dead_letters", "est").num_rows == 1
    assert rows[-1]["q_logprob"] == [float("-inf")]
    censored = [r for r in rows[:-1] if r["kind"] == "step" and r["correct_drafts"] == r["window"] < 6]
    assert censored and all(len(r["trimmed_tokens"]) == 6 - r["window"] for r in censored)
    for r in censored:  # a censored step's own block is settled first at offset w + 1 against the bonus token
        own = [g for g in r["pending_gathers"] if g["block_forward_ct"] == r["forward_ct"]]
        assert own[0]["offset"] == r["window"] + 1
    assert {r["rid"] for r in rows[:-1]} <= set(store.read("requests", "est").column("rid").to_pylist())


def test_cost_tables_profiler_outputs_and_sts(tmp_path):
    one_d = tmp_path / "sps.json"
    one_d.write_text(json.dumps({"sample_batch_tokens": [7, 14, 28], "sample_steps_per_sec": [50.0, 45.0, 30.0],
                                 "max_batch_tokens": 64}))
    additive = tmp_path / "sps_add.json"
    additive.write_text(json.dumps({"bias_seconds": 0.01, "bs_probes": [1, 8], "alpha_seconds": [0.0, 0.002],
                                    "m_probes": [8, 64], "theta_seconds": [0.0, 0.004]}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sample_batch_tokens": [14, 7], "sample_steps_per_sec": [1.0, 2.0], "max_batch_tokens": 64}))
    records = tmp_path / "sps.records.jsonl"
    records.write_text("\n".join(json.dumps({"repeat": 0, "batch_size": 8, "batch_size_per_rank": 8, "dp_rank": 0,
                                             "forward_ct": i, "num_running_reqs": 8, "num_verify_tokens": 56,
                                             "step_time": 0.02}) for i in range(5)) + "\n")
    rnd = {"repeat": 0, "batch_size": 8, "batch_size_per_rank": 8, "frac": None, "batch_tokens": 56,
           "steps_per_sec": 50.0, "num_steady_steps": 32, "match_fraction": 1.0, "per_rank_median_step_time": [0.02],
           "load_info": {"num_requests": 8, "max_new_tokens": 300, "wall_seconds": 12.0, "reached_target": True}}
    rounds = tmp_path / "sps.rounds.jsonl"
    rounds.write_text(json.dumps(rnd) + "\n" + json.dumps({**rnd, "steps_per_sec": "fast"}) + "\n")
    manifest = tmp_path / "sps.json.manifest.json"
    manifest.write_text(json.dumps({"base_url": "http://x", "round_summaries": [rnd, rnd]}, indent=2).replace("\n", " "))
    sts = tmp_path / "sts.json"
    sts.write_text(json.dumps({"temperatures": [1.1, 1.2, 1.3], "dataset": "gsm8k", "num_samples": 100,
                               "ece_before": [0.05] * 3, "ece_after": [0.01] * 3}))
    sts_bad = tmp_path / "sts_bad.json"
    sts_bad.write_text(json.dumps({"temperatures": [1.0, 0.0]}))
    _ingest(tmp_path / "d", "art", "--sps-table", str(one_d), "--sps-table", str(additive), "--sps-table", str(bad),
            "--sps-records", str(records), "--sps-records", str(rounds), "--sps-records", str(manifest),
            "--sts", str(sts), "--sts", str(sts_bad))
    store = Store(tmp_path / "d")
    kinds = sorted(r["kind"] for r in store.read("cost_tables", "art").to_pylist())
    assert kinds == ["1d", "additive"]
    assert store.read("sps_records", "art").num_rows == 5 and store.read("sps_rounds", "art").num_rows == 3
    assert store.read("sts_calibrations", "art").to_pylist()[0]["temperatures"] == [1.1, 1.2, 1.3]
    dead = _dead_letters(store, "art")
    assert len(dead) == 3   # bad table, bad round, bad STS
    assert dead["sps-table:bad.json"] == NOT_A_1D_TABLE + "sample_batch_tokens must be strictly increasing, got [14, 7]."
    assert dead["sts:sts_bad.json"] == NOT_STS + "STS temperatures must all be finite and > 0, got [1.0, 0.0]"


NOT_A_1D_TABLE = ('not an SGLang DSpark cost table (1-D: {sample_batch_tokens, sample_steps_per_sec, '
                  'max_batch_tokens}; the additive kind has "bias_seconds"): ')
NOT_STS = "not an SGLang STS calibration ({temperatures: [...], ...}): "


def _dead_letters(store: Store, run_id: str) -> dict[str, str]:
    return {r["source"]: r["reason"] for r in store.read("dead_letters", run_id).to_pylist()}


def test_a_cost_table_or_sts_file_that_is_not_json_is_a_dead_letter_naming_the_kind(tmp_path):
    broken, additive, sts = tmp_path / "broken.json", tmp_path / "additive.json", tmp_path / "sts.json"
    broken.write_text('{"sample_batch_tokens": [1,')
    additive.write_text(json.dumps({"bias_seconds": 0.0, "bs_probes": [1], "alpha_seconds": [0.0],
                                    "m_probes": [1], "theta_seconds": [0.0]}))
    sts.write_text("[1.0, 2.0]")
    result = runner.invoke(app, ["ingest", "--out", str(tmp_path / "d"), "--run-id", "bad", "--sps-table", str(broken),
                                 "--sps-table", str(additive), "--sts", str(sts)])
    assert result.exit_code == 1 and "all 3 went to dead_letters" in " ".join(result.output.split())
    dead = _dead_letters(Store(tmp_path / "d"), "bad")
    assert dead["sps-table:broken.json"].startswith("not an SGLang DSpark cost table: not JSON: ")
    assert dead["sps-table:additive.json"] == ("not an SGLang DSpark cost table (additive: {bias_seconds, bs_probes, "
                                               "alpha_seconds, m_probes, theta_seconds}): bias_seconds must be > 0, "
                                               "got 0.0.")
    assert dead["sts:sts.json"] == NOT_STS + "Expected `object`, got `array`"


def test_workload_map_and_rid_pattern(tmp_path):
    m = tmp_path / "map.csv"
    m.write_text("rid,workload\nabc,chat\n")
    r = WorkloadResolver.from_csv(m)
    assert (r("abc"), r("gsm8k-000001"), r("nodigits")) == ("chat", "gsm8k", None)
    assert WorkloadResolver(r"req_(\w+?)_\d+")("req_poetry_7") == "poetry"
    with pytest.raises(ValueError, match="needs a group"):
        WorkloadResolver(r"\d+")
    result = runner.invoke(app, ["ingest", "--out", str(tmp_path), "--run-id", "x"])
    assert result.exit_code == 2 and "nothing to import" in result.output


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["rid", "fct", "w", "cl", "ct", "trimmed_tokens", "q_lp", "pg", "eos_end", "x"]),
                       st.none() | st.integers(-2**66, 2**66) | st.floats() | st.text(max_size=3)
                       | st.lists(st.integers(-2**40, 2**40) | st.floats() | st.lists(st.integers(), max_size=5), max_size=4)))
def test_estimator_rows_are_accepted_or_rejected_never_crash(value):
    try:
        estimator_row(value, 1)
    except ValueError:
        pass


def test_ingest_of_an_empty_file_exits_1_and_creates_no_run(tmp_path):
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = CliRunner().invoke(app, ["ingest", "--out", str(tmp_path / "d"), "--run-id", "e",
                                      "--server-info", str(empty)])
    assert result.exit_code == 1
    assert "e" not in Store(tmp_path / "d").runs()


def test_ingest_of_only_bad_lines_exits_1_and_closes_the_run_as_an_error(tmp_path):
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n{\"neither\": 1}\n")
    result = CliRunner().invoke(app, ["ingest", "--out", str(tmp_path / "d"), "--run-id", "b",
                                      "--generate", str(bad)])
    assert result.exit_code == 1
    store = Store(tmp_path / "d")
    run = store.read("runs", "b").to_pylist()[0]
    assert run["end_reason"].startswith("error: nothing usable imported")
    assert store.read("dead_letters", "b").num_rows == 2


def test_replace_drops_the_runs_results_with_its_data(tmp_path):
    from bench.ingest import make_bodies

    body = tmp_path / "body.jsonl"
    make_bodies(str(body), bodies=1, records=2)
    out = tmp_path / "d"
    _ingest(out, "r", "--server-info", str(body))
    _ingest(out, "other", "--server-info", str(body))
    store = Store(out)
    steps = store.read("step_reqs", "r").num_rows
    for run in ("r", "other"):  # a result of each run, as `estimate` would leave it
        store.write("ceiling_summary", run, [{"workload": "*", "method": "default", "requests": 1, "steps": 1, "censored_steps": 0}])
    refused = runner.invoke(app, ["ingest", "--out", str(out), "--run-id", "r", "--server-info", str(body)])
    assert refused.exit_code != 0 and "--replace" in " ".join(refused.output.split())
    _ingest(out, "r", "--server-info", str(body), "--replace")
    store = Store(out)
    assert store.read("step_reqs", "r").num_rows == steps  # the data once, not twice
    assert store.read("ceiling_summary", "r").num_rows == 0  # its old results are gone with its old data
    assert store.read("ceiling_summary", "other").num_rows == 1  # another run's stay
