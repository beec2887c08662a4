"""``dspark-obs companion`` over real HTTP: emulators as child processes, lockstep at the run's concurrency.

One compact run collected with ``collect --workload ... --temperature 0.7``; then
replays of it on cap-accept emulators started with the same seed: the whole run
(token-identical, every compact request-step pairs), a copy with one stored
prompt edited (that request diverges, is excluded and reported), an
attach-mode copy replayed from an SGLang request log with suffixed rids, and a
compact server (refused).

Lockstep holds each forward until the closed-loop client has refilled, but
only while the last submission is less than ``lockstep_wait_s`` old: on a
loaded 2-core machine two finishes can be further apart than any fixed wait,
the engine then goes on without the refill, and the batches differ.  The
child emulators here are told the run's total (as ``sweep`` tells them), so
they wait for every refill up to 30 s and never at the run's tail.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import socket
import subprocess
import sys
import time

import httpx
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from dspark_obs import sql
from dspark_obs.cli import app
from collectors.sglang.companion_run import CompanionOptions, run_companion
from dspark_obs.emulator.engine import EngineConfig, tokenize
from dspark_obs.emulator.server import BackgroundServer
from dspark_obs.estimators import pairing
from dspark_obs.store import Store

SEED, CONC, N = 7, 6, 30
runner = CliRunner()


@contextlib.contextmanager
def _emulator(mode: str, seed: int = SEED):
    """An emulator child process in lockstep at CONC for N requests; yields its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = ("from dspark_obs.emulator.engine import EngineConfig\n"
            "from dspark_obs.emulator.server import serve\n"
            f"serve(EngineConfig(mode={mode!r}, seed={seed}, lockstep_concurrency={CONC}, lockstep_wait_s=30.0), "
            f"port={port})")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")[-2000:]
            assert time.monotonic() < deadline, f"{url}/health did not answer"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            time.sleep(0.05)
        told = httpx.post(f"{url}/set_internal_state", timeout=30, json={"server_args": {
            "emulator_lockstep_concurrency": CONC, "emulator_lockstep_total": N}}).json()
        assert told["updated"], told
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cap_accept(seed: int = SEED):
    return _emulator("cap-accept", seed)


@pytest.fixture(scope="module")
def compact(tmp_path_factory):
    """A compact run collected by the CLI with --workload and --temperature 0.7."""
    root = tmp_path_factory.mktemp("companion")
    with _emulator("compact") as url:
        result = runner.invoke(app, [
            "collect", "--url", url, "--out", str(root), "--run-id", "cmp",
            "--workload", "gsm8k,arena-hard,poetry", "--temperature", "0.7", "--requests", str(N),
            "--concurrency", str(CONC), "--max-new-tokens", "96", "--seed", "3", "--poll-interval", "0.2"])
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def replayed(compact):
    """``dspark-obs companion --of cmp`` against a cap-accept emulator on the same seed."""
    with _cap_accept() as url:
        result = runner.invoke(app, ["companion", "--of", "cmp", "--url", url, "--out", str(compact),
                                     "--run-id", "cap", "--poll-interval", "0.2"])
    assert result.exit_code == 0, result.output
    return Store(compact), result.output


def _copy(root, tmp_path) -> Store:
    shutil.copytree(root, tmp_path / "store")
    return Store(tmp_path / "store")


def _token_lists(store: Store, run: str) -> dict[str, list[int]]:
    rows = store.read("tokens", run).sort_by([("rid", "ascending"), ("pos", "ascending")]).to_pylist()
    out: dict[str, list[int]] = {}
    for r in rows:
        out.setdefault(r["rid"], []).append(r["token_id"])
    return out


def test_the_replay_is_token_identical_and_every_compact_request_step_pairs(replayed):
    store, output = replayed
    run = {r["run_id"]: r for r in store.read("runs").to_pylist()}["cap"]
    assert run["mode"] == "cap-accept" and run["companion_of"] == "cmp"
    assert dict(run["labels"])["concurrency_source"] == "requests.concurrency"
    original, replay = _token_lists(store, "cmp"), _token_lists(store, "cap")
    assert len(original) == N and original == replay  # checked independently of the pairing table

    rows = store.read("companion_pairing", "cap").to_pylist()
    assert len(rows) == N and {r["status"] for r in rows} == {"identical"}
    assert all(r["rid"] == r["companion_rid"] and r["input_kind"] == "text" and r["input_source"] == "requests"
               for r in rows)
    steps = store.read("step_reqs", "cmp").group_by("rid").aggregate([("rid", "count")])
    by_rid = dict(zip(steps.column("rid").to_pylist(), steps.column("rid_count").to_pylist()))
    assert all(r["steps"] == r["paired_steps"] == by_rid[r["rid"]] > 0 for r in rows)

    (summary,) = store.read("companion_pairing_summary", "cap").to_pylist()
    assert (summary["selected"], summary["replayed"], summary["identical"], summary["diverged"]) == (N, N, N, 0)
    assert summary["concurrency"] == CONC and summary["sample"] == "all"
    assert summary["paired_steps"] == summary["pairable_steps"] == sum(by_rid.values())
    assert summary["pairing_share"] == 1.0
    assert f"identical {N}, diverged 0" in output and "(100.0%)" in output

    con = sql.connect(store.root)  # what the estimators read: every step, same drafts, a truth
    paired = pairing.paired_steps(con, "cmp", "cap")
    assert paired.num_rows == sum(by_rid.values()) and pc.all(paired.column("same_drafts")).as_py()
    assert pairing.companion_of(con, "cmp") == "cap"


def test_a_request_whose_replay_diverges_is_excluded_and_reported(compact, tmp_path):
    store = _copy(compact, tmp_path)
    requests = store.read("requests", "cmp")
    victim = requests.column("rid")[4].as_py()
    prompts = [p + " edited" if r == victim else p for r, p in zip(requests.column("rid").to_pylist(),
                                                                    requests.column("prompt_text").to_pylist())]
    edited = requests.set_column(requests.schema.get_field_index("prompt_text"), "prompt_text",
                                 pa.array(prompts, pa.string())).drop_columns(["run_id"])
    store.drop_run("requests", "cmp")
    store.write("requests", "cmp", edited)

    with _cap_accept() as url:
        report = run_companion(store, CompanionOptions(of="cmp", url=url, run_id="cap-edit",
                                                       poll_interval=0.2, flush_interval=1.0))
    rows = {r["rid"]: r for r in report.pairing.to_pylist()}
    bad = rows[victim]
    assert (bad["status"], bad["identical"], bad["paired_steps"]) == ("diverged", False, 0)
    assert bad["first_divergence"] is not None and bad["steps"] > 0
    assert all(r["status"] == "identical" for rid, r in rows.items() if rid != victim)
    s = report.summary
    assert (s["diverged"], s["identical"], s["excluded_steps"]) == (1, N - 1, bad["steps"])
    paired = pairing.paired_steps(sql.connect(store.root), "cmp", "cap-edit")
    assert victim not in set(paired.column("rid").to_pylist()) and paired.num_rows > 0
    assert store.read("companion_pairing_summary", "cap-edit").to_pylist()[0]["diverged"] == 1


def _request_log(store: Store, run: str) -> str:
    """SGLang's JSON request log (--log-requests-level 3) of the run's requests, prompts as token ids."""
    tokens = _token_lists(store, run)
    lines = []
    for r in sorted(store.read("requests", run).to_pylist(), key=lambda r: r["submitted_at"]):
        obj = {"rid": r["rid"], "input_ids": tokenize(r["prompt_text"]), "text": None, "stream": False,
               "sampling_params": {"temperature": 0.7, "max_new_tokens": r["max_new_tokens"],
                                   "sampling_seed": r["sampling_seed"]}}
        received = r["submitted_at"].astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat()
        lines.append(f"[{received[:19].replace('T', ' ')}] " + json.dumps(
            {"timestamp": received, "event": "request.received", "rid": r["rid"], "obj": obj}))
        lines.append(json.dumps({"timestamp": received, "event": "request.finished", "rid": r["rid"], "obj": obj,
                                 "out": {"output_ids": tokens[r["rid"]], "meta_info": {"id": r["rid"]}}}))
    return "\n".join(lines) + "\n"


def test_an_attach_mode_run_replays_from_the_request_log_with_suffixed_rids(compact, tmp_path):
    store = _copy(compact, tmp_path)
    for table in ("steps", "step_reqs"):  # what attach mode sees: steps only, no requests, no labels
        store.write(table, "attached", store.read(table, "cmp").drop_columns(["run_id"]))
    store.upsert_run("attached", started_at=dt.datetime.now(dt.timezone.utc), source="sglang", mode="compact",
                     gamma=6)
    log = tmp_path / "requests.log"
    log.write_text(_request_log(store, "cmp"))

    with _cap_accept() as url:
        result = runner.invoke(app, ["companion", "--of", "attached", "--url", url, "--out", str(store.root),
                                     "--run-id", "cap-log", "--log-requests", str(log), "--rid-suffix", ".cap",
                                     "--poll-interval", "0.2"])
    assert result.exit_code == 0, result.output
    rows = store.read("companion_pairing", "cap-log").to_pylist()
    assert len(rows) == N and all(r["companion_rid"] == r["rid"] + ".cap" for r in rows)
    assert {(r["status"], r["input_kind"], r["input_source"]) for r in rows} == {
        ("identical", "input_ids", "request-log")}
    (s,) = store.read("companion_pairing_summary", "cap-log").to_pylist()
    assert s["concurrency_source"] == "steps (median running requests)" and s["concurrency"] == CONC
    assert s["rid_suffix"] == ".cap" and s["pairing_share"] == 1.0
    paired = pairing.paired_steps(sql.connect(store.root), "attached", "cap-log")
    assert paired.num_rows == s["pairable_steps"] == store.read("step_reqs", "attached").num_rows


def test_a_server_not_in_cap_accept_mode_is_refused_before_anything_is_written(compact, tmp_path):
    store = _copy(compact, tmp_path)
    with BackgroundServer(EngineConfig(mode="compact", seed=SEED)) as server:
        result = runner.invoke(app, ["companion", "--of", "cmp", "--url", server.url, "--out", str(store.root),
                                     "--run-id", "nope"])
    assert result.exit_code == 2
    assert "SGLANG_RAGGED_VERIFY_MODE=cap-accept" in result.output and "'compact'" in result.output
    assert "nope" not in store.runs()


def test_a_missing_run_and_a_sample_are_handled_at_the_edge(compact, tmp_path):
    store = _copy(compact, tmp_path)
    with BackgroundServer(EngineConfig(mode="cap-accept", seed=SEED)) as server:
        missing = runner.invoke(app, ["companion", "--of", "no-such-run", "--url", server.url,
                                      "--out", str(store.root)])
        both = runner.invoke(app, ["companion", "--of", "cmp", "--url", server.url, "--out", str(store.root),
                                   "--sample", "3", "--fraction", "0.5"])
        report = run_companion(store, CompanionOptions(of="cmp", url=server.url, run_id="cap-sample", sample=5,
                                                       seed=1, concurrency=2, poll_interval=0.1))
    assert missing.exit_code == 2 and "run 'no-such-run' is not in" in missing.output
    assert both.exit_code == 2 and "not both" in both.output
    s = report.summary
    assert (s["selected"], s["identical"], s["sample"], s["concurrency"]) == (5, 5, "5 of 30 (seed 1)", 2)
    assert s["concurrency_source"] == "--concurrency"
    order = [r["rid"] for r in sorted(store.read("requests", "cmp").to_pylist(), key=lambda r: r["submitted_at"])]
    sampled = report.pairing.column("rid").to_pylist()
    assert sampled == sorted(sampled, key=order.index)  # the original order
