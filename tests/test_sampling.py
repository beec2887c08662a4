"""Which sampling a request used: recorded, overridden, or inferred from its committed tokens."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.estimators import sampling
from dspark_obs.estimators.ceiling import estimate_run


def test_a_short_all_top1_sampled_request_is_not_called_greedy():
    # 5 tokens, each the top-1 with probability 0.9: a sampled request does this 59% of the time.
    log_p = 5 * np.log(0.9)
    assert sampling.infer_greedy(np.array([5]), np.array([5]), np.array([log_p])).tolist() == ["unknown"]
    # 70 such tokens: 0.9 ** 70 = 6.3e-4 <= 1e-3, so greedy can be claimed.
    assert sampling.infer_greedy(np.array([70]), np.array([70]), np.array([70 * np.log(0.9)])).tolist() == ["greedy"]
    # ... but not at a stricter alpha.
    assert sampling.infer_greedy(np.array([70]), np.array([70]), np.array([70 * np.log(0.9)]),
                                 alpha=1e-4).tolist() == ["unknown"]


def test_one_token_off_the_top1_makes_a_request_sampled():
    got = sampling.infer_greedy(np.array([40, 0]), np.array([39, 0]), np.array([-30.0, 0.0]))
    assert got.tolist() == ["sampled", "unknown"]


def test_the_false_greedy_rate_is_at_most_alpha():
    """Simulated sampled requests (top-1 probability 0.5..0.99, 1..60 tokens): the share called greedy <= alpha."""
    rng = np.random.default_rng(0)
    n = 200_000
    p_top1 = rng.uniform(0.5, 0.99, n)
    length = rng.integers(1, 61, n)
    hits = rng.binomial(length, p_top1)
    got = sampling.infer_greedy(length, hits, length * np.log(p_top1), alpha=1e-3)
    assert (got == "greedy").mean() <= 1e-3
    assert (got == "greedy").sum() == 0 or np.all(length[got == "greedy"] * np.log(p_top1[got == "greedy"]) <= np.log(1e-3))


def test_alpha_is_checked():
    with pytest.raises(ValueError, match="alpha must be in"):
        sampling.infer_greedy(np.array([1]), np.array([1]), np.array([0.0]), alpha=1.5)


def test_recorded_beats_override_beats_inferred():
    s, src = sampling.resolve_sampling(np.array([0.0, np.nan, np.nan]), np.array([0.7, 0.7, np.nan]),
                                       np.array(["sampled", "greedy", "sampled"], dtype=object))
    assert s.tolist() == ["greedy", "sampled", "sampled"]
    assert src.tolist() == ["recorded", "override", "inferred"]


@pytest.fixture(scope="module")
def unrecorded(tmp_path_factory):
    """Greedy and t=0.7 emulator runs whose requests lost their temperature (as a /generate import does)."""
    from collectors.sglang.driver import DriveSpec
    from collectors.sglang.session import CollectOptions, collect
    from dspark_obs.emulator.engine import EngineConfig
    from dspark_obs.emulator.server import BackgroundServer
    from dspark_obs.store import Store

    store = Store(tmp_path_factory.mktemp("sampling"))
    for run, temperature in (("greedy", 0.0), ("temp", 0.7)):
        with BackgroundServer(EngineConfig(mode="compact", seed=11)) as server:
            collect(store, CollectOptions(url=server.url, run_id=run, poll_interval=0.1, flush_interval=1.0,
                                          drive=DriveSpec(["gsm8k", "poetry"], 24, concurrency=8,
                                                          temperature=temperature, seed=11)))
    recorded = {run: estimate_run(store, run, n_bootstrap=0, write=False).ceiling for run in ("greedy", "temp")}
    for run in ("greedy", "temp"):
        req = store.read("requests", run).drop_columns(["run_id"])
        req = req.set_column(req.schema.get_field_index("temperature"), "temperature",
                             pa.nulls(req.num_rows, pa.float32()))
        store.drop_run("requests", run)
        store.write("requests", run, req)
    return store, recorded


def test_greedy_is_recognised_without_a_recorded_temperature(unrecorded):
    store, recorded = unrecorded
    result = estimate_run(store, "greedy", n_bootstrap=0, write=False)
    counts = result.sampling_counts
    inferred = counts.get(("greedy", "inferred"), 0)
    total = sum(counts.values())
    print(f"\ngreedy run without temperatures: {counts}")
    assert inferred >= 0.9 * total and ("sampled", "inferred") not in counts
    got = result.ceiling.to_pydict()
    assert set(got["sampling_source"]) <= {"inferred", "unknown"}
    want = recorded["greedy"].to_pydict()
    same = np.asarray(got["sampling"]) == "greedy"
    for name in ("lo", "mid", "hi"):   # the exact rule, as with the recorded temperature
        assert np.array_equal(np.asarray(got[name])[same], np.asarray(want[name])[same]), name


def test_sampled_requests_are_never_inferred_greedy(unrecorded):
    store, _ = unrecorded
    result = estimate_run(store, "temp", n_bootstrap=0, write=False)
    assert ("greedy", "inferred") not in result.sampling_counts
    assert result.sampling_counts.get(("sampled", "inferred"), 0) > 0


def test_an_override_fills_what_the_run_did_not_record(unrecorded):
    store, _ = unrecorded
    result = estimate_run(store, "temp", n_bootstrap=0, write=False, temperature=0.7)
    assert set(result.sampling_counts) == {("sampled", "override")}
    got = result.ceiling.to_pydict()
    assert np.allclose(got["temperature"], 0.7)


def test_ingest_states_the_sampling_of_generate_bodies(tmp_path):
    """/generate bodies carry no sampling: ingest --temperature and a map's temperature column state it."""
    import json

    from typer.testing import CliRunner

    from dspark_obs.cli import app
    from dspark_obs.emulator.engine import EngineConfig
    from dspark_obs.emulator.server import BackgroundServer

    import httpx

    bodies, infos = [], []
    with BackgroundServer(EngineConfig(mode="compact", seed=2)) as server:
        for i in range(6):
            bodies.append(httpx.post(f"{server.url}/generate", json={
                "rid": f"gsm8k-{i:06d}", "text": f"q {i}", "return_logprob": True, "top_logprobs_num": 3,
                "sampling_params": {"temperature": 0.7, "max_new_tokens": 40, "sampling_seed": i}}, timeout=30).json())
        infos.append(httpx.get(f"{server.url}/server_info", timeout=30).json())
    gen, info = tmp_path / "generate.jsonl", tmp_path / "server_info.jsonl"
    gen.write_text("\n".join(json.dumps(b) for b in bodies) + "\n")
    info.write_text("\n".join(json.dumps(b) for b in infos) + "\n")
    mapping = tmp_path / "map.csv"
    mapping.write_text("rid,workload,temperature\ngsm8k-000000,gsm8k,0.7\ngsm8k-000001,gsm8k,\n")
    data = tmp_path / "data"
    got = CliRunner().invoke(app, ["ingest", "--out", str(data), "--run-id", "imp", "--server-info", str(info),
                                   "--generate", str(gen), "--workload-map", str(mapping), "--temperature", "0.7"])
    assert got.exit_code == 0, got.output
    result = estimate_run(data, "imp", n_bootstrap=0, write=False)
    assert set(result.sampling_counts) == {("sampled", "override")}
    bad = tmp_path / "bad.csv"
    bad.write_text("rid,temperature\ngsm8k-000000,warm\n")
    got = CliRunner().invoke(app, ["ingest", "--out", str(tmp_path / "d2"), "--run-id", "imp", "--generate", str(gen),
                                   "--workload-map", str(bad)])
    assert got.exit_code != 0 and "is not a number" in " ".join(got.output.split())


def test_estimate_prints_how_the_sampling_is_known_and_the_fix_for_unknown(unrecorded, tmp_path):
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    store, _ = unrecorded
    got = CliRunner().invoke(app, ["estimate", "--data", str(store.root), "--run", "greedy", "--bootstrap", "0"])
    assert got.exit_code == 0, got.output
    text = " ".join(got.output.split())
    assert "sampling: 24 greedy (inferred)" in text
    # without top-k logprobs nothing can be inferred: the line names the flags that fix it
    tokens = store.read("tokens", "temp").drop_columns(["run_id"])
    for name in ("top_ids", "top_logprobs"):
        tokens = tokens.set_column(tokens.schema.get_field_index(name), name,
                                   pa.nulls(tokens.num_rows, tokens.schema.field(name).type))
    store.drop_run("tokens", "temp")
    store.write("tokens", "temp", tokens)
    got = CliRunner().invoke(app, ["estimate", "--data", str(store.root), "--run", "temp", "--bootstrap", "0"])
    assert got.exit_code == 0, got.output
    text = " ".join(got.output.split())
    assert "24 unknown" in text and "--temperature T" in text and "bins of mid" in text


def _first_known(recorded: float, override: float, inferred: str) -> tuple[str, str]:
    """The rule of ``resolve_sampling`` for one request, spelled out."""
    for temperature, source in ((recorded, "recorded"), (override, "override")):
        if not np.isnan(temperature):
            return ("greedy" if temperature == 0.0 else "sampled"), source
    return inferred, "inferred" if inferred != "unknown" else "unknown"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([np.nan, 0.0, 0.7, 1.0]), st.sampled_from([np.nan, 0.0, 0.3]),
                          st.sampled_from(["greedy", "sampled", "unknown"])), max_size=40))
def test_sampling_codes_name_the_first_known_of_recorded_override_and_inferred(rows):
    recorded = np.array([r[0] for r in rows], dtype=np.float64)
    override = np.array([r[1] for r in rows], dtype=np.float64)
    inferred = np.array([r[2] for r in rows], dtype=object)
    kind, source = sampling.resolve_sampling_codes(recorded, override, sampling.kind_codes(inferred))
    assert kind.dtype == source.dtype == np.int8
    got = [(sampling.KINDS[k], sampling.SOURCES[s]) for k, s in zip(kind.tolist(), source.tolist())]
    assert got == [_first_known(*r) for r in rows]
