"""Tests for estimate_run and `dspark-obs estimate`: reading a run, writing the result tables, the CLI."""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest
from typer.testing import CliRunner

from dspark_obs import sql
from dspark_obs.cli import app
from dspark_obs.estimators.ceiling import estimate_run
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
GAMMA = 3
# Request g (greedy): prompt 3 tokens; output positions 0..7, position 0 from prefill, EOS (2) last.
G_OUT = [100, 11, 12, 13, 14, 15, 16, 2]
# Request t (temperature 1): prompt 4 tokens; cut by max_new_tokens after 5 tokens.
T_OUT = [200, 21, 22, 23, 24]
#          rid  fct prefix drafts         verify_len correct bonus truth(full block)
STEPS = [("g", 2, 3, [11, 12, 99], 2, 1, 12, 2),    # censored; d_2 matches, d_3 does not (at gamma): exact 2
         ("g", 3, 5, [13, 14, 15], 4, 3, 16, 3),    # full window: exact 3
         ("g", 4, 9, [2, 50, 51], 1, 0, 2, 1),      # window 0; d_1 = EOS matches, then the output ends: 1
         ("t", 2, 4, [21, 22, 88], 2, 1, 22, 2),    # censored; d_2 matches, d_3 diverges at gamma
         ("t", 3, 6, [23, 24, 77], 2, 1, 24, 3)]    # censored; d_2 matches, then the length cut


def _write_run(store: Store, run: str, mode: str, *, companion_of=None, prompt=(3, 4), steps=STEPS):
    store.upsert_run(run, started_at=T0, source="emulator", mode=mode, gamma=GAMMA, companion_of=companion_of)
    store.write("requests", run, [
        {"rid": "g", "workload": "math", "temperature": 0.0, "prompt_tokens": prompt[0],
         "completion_tokens": len(G_OUT), "finish_reason": "stop"},
        {"rid": "t", "workload": "poetry", "temperature": 1.0, "prompt_tokens": prompt[1],
         "completion_tokens": len(T_OUT), "finish_reason": "length"}])
    store.write("tokens", run, [
        {"rid": rid, "pos": i, "token_id": tok, "logprob": math.log(0.5), "top_ids": [tok, tok + 1000],
         "top_logprobs": [math.log(0.5), math.log(0.2)]}
        for rid, out in (("g", G_OUT), ("t", T_OUT)) for i, tok in enumerate(out)])
    rows = []
    for rid, fct, prefix, drafts, vlen, correct, bonus, truth in steps:
        if mode == "static":
            vlen, correct = GAMMA + 1, truth
        cap_trim = truth - correct if mode == "cap-accept" else 0
        rows.append({"dp_rank": 0, "forward_ct": fct, "segment": 0, "rid": rid, "req_pool_index": 0,
                     "prefix_len": prefix, "verify_len": vlen, "acc_len": correct + 1, "correct_drafts": correct,
                     "cap_trim": cap_trim, "bonus_token": bonus, "draft_tokens": drafts,
                     "confidence": None if mode == "static" else [0.9, 0.6, 0.5]})
    store.write("step_reqs", run, rows)


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path)
    _write_run(s, "cmp", "compact")
    _write_run(s, "cap", "cap-accept", companion_of="cmp")
    return s


def _rows(result):
    return {(r["rid"], r["forward_ct"]): r for r in result.ceiling.to_pylist()}


def test_estimate_run_writes_ceilings_and_validates_against_the_recorded_companion(store):
    result = estimate_run(store, "cmp", n_bootstrap=50)
    rows = _rows(result)
    assert [(rows[k]["category"], rows[k]["lo"], rows[k]["hi"]) for k in (("g", 2), ("g", 3), ("g", 4))] == [
        ("censored_resolved_exact", 2.0, 2.0), ("exact_in_window", 3.0, 3.0), ("censored_eos", 1.0, 1.0)]
    assert rows[("t", 2)]["category"] == "censored_resolved_exact"
    t3 = rows[("t", 3)]
    assert t3["category"] == "censored_at_end" and t3["lo"] == pytest.approx(1.5) and t3["hi"] == 3.0
    assert rows[("g", 2)]["temperature"] == 0.0 and rows[("g", 2)]["walked"] == 2
    assert result.truth_source == "companion" and result.companion == "cap" and result.steps_with_truth == 5

    con = sql.connect(store.root)
    assert sql.query(con, "SELECT count(*) AS n FROM ceiling WHERE run_id = 'cmp'").column("n")[0].as_py() == 5
    overall = sql.query(con, "SELECT * FROM ceiling_validation WHERE group_kind = 'overall'").to_pylist()[0]
    assert overall["n"] == 4 and overall["coverage"] == 1.0 and overall["companion_run"] == "cap"
    summary = {r["workload"]: r for r in sql.query(con, "SELECT * FROM ceiling_summary").to_pylist()}
    assert set(summary) == {"*", "math", "poetry"} and summary["math"]["steps"] == 3
    assert summary["math"]["mean_acc_len"] == pytest.approx((2 + 4 + 1) / 3)
    assert summary["math"]["ceiling_len_mid"] == pytest.approx((3 + 4 + 2) / 3)


def test_rerunning_replaces_the_runs_results(store):
    estimate_run(store, "cmp", n_bootstrap=0)
    estimate_run(store, "cmp", method="sglang", n_bootstrap=0)
    table = store.read("ceiling", "cmp")
    assert table.num_rows == 5 and set(table.column("method").to_pylist()) == {"sglang"}
    assert store.read("ceiling_summary", "cmp").num_rows == 3


def test_cap_accept_and_static_runs_validate_against_their_own_steps(store):
    assert estimate_run(store, "cap", n_bootstrap=0).truth_source == "cap-accept"
    _write_run(store, "stat", "static")
    result = estimate_run(store, "stat", n_bootstrap=0)
    assert result.truth_source == "static"
    assert not any(result.ceiling.column("censored").to_pylist())   # static verifies the whole block
    overall = next(r for r in result.validation.to_pylist() if r["group_kind"] == "all_steps")
    assert overall["mae"] == 0.0


def test_missing_prompt_tokens_are_inferred_from_the_first_step(tmp_path):
    store = Store(tmp_path)
    _write_run(store, "cmp", "compact", prompt=(None, None))
    rows = _rows(estimate_run(store, "cmp", n_bootstrap=0))
    assert rows[("g", 2)]["lo"] == 2.0 and rows[("g", 4)]["category"] == "censored_eos"


def test_errors_name_the_fix(tmp_path, store):
    with pytest.raises(LookupError, match=r"run 'nope' has no step_reqs.*runs with steps: cap, cmp"):
        estimate_run(store, "nope")
    with pytest.raises(ValueError, match=r"invalid run_id"):
        estimate_run(store, "../x")
    shifted = Store(tmp_path / "shifted")
    _write_run(shifted, "cmp", "compact", prompt=(2, 3))
    with pytest.raises(ValueError, match=r"requests.prompt_tokens must be the prompt length"):
        estimate_run(shifted, "cmp")
    short = Store(tmp_path / "short")
    _write_run(short, "cmp", "compact", steps=[(*STEPS[0][:3], [11, 12], *STEPS[0][4:])])
    with pytest.raises(ValueError, match=r"draft_tokens hold \[2\] tokens, expected gamma=3"):
        estimate_run(short, "cmp")


def test_estimate_run_accepts_a_connection_and_sglang_logprobs(store):
    from dspark_obs.estimators.ceiling.jsonl import logprobs_from_sglang_jsonl

    lp = logprobs_from_sglang_jsonl([
        {"rid": "t", "fct": 3, "w": 1, "cl": 1, "ct": 0, "q_lp": [math.log(0.5), math.log(0.8)],
         "pg": [[3, 2, math.log(0.25), 24, 24]]}], gamma=GAMMA)
    result = estimate_run(sql.connect(store.root), "cmp", sglang_logprobs=lp, write=False)
    t3 = _rows(result)[("t", 3)]
    # a_2 = min(1, .25/.5) = .5 exactly; then the output ends: hi = lo + .5 * 1
    assert (t3["lo"], t3["hi"]) == (pytest.approx(1.5), pytest.approx(2.0))
    assert store.read("ceiling", "cmp").num_rows == 0   # write=False


# -- CLI ---------------------------------------------------------------------------------------------

def test_cli_estimates_the_only_compact_run_and_prints_a_summary(store):
    result = CliRunner().invoke(app, ["estimate", "--data", str(store.root), "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    assert "Ceiling of cmp (default)" in result.output and "companion cap" in result.output
    assert store.read("ceiling", "cmp").num_rows == 5


def test_cli_reads_sglang_jsonl(store, tmp_path):
    path = tmp_path / "est.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"rid": "t", "fct": 3, "w": 1, "cl": 1, "ct": 0, "q_lp": [-0.7, -0.2]}, {"rid": "t", "eos_end": [3]}]))
    result = CliRunner().invoke(app, ["estimate", "--data", str(store.root), "--run", "cmp", "--method", "sglang",
                                      "--sglang-jsonl", str(path), "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    assert "draft logprobs for 1 censored steps" in " ".join(result.output.split())


@pytest.mark.parametrize("args, message", [
    (["--method", "best"], "--method 'best' is not one of default, sglang"),
    (["--bootstrap", "-1"], "-1 is not in the range x>=0"),
    (["--run", "nope"], "--run 'nope' has no request-steps"),
    (["--companion", "nope"], "--companion 'nope' has no request-steps"),
    (["--sglang-jsonl", "/nonexistent.jsonl"], "cannot read it"),
])
def test_cli_rejects_bad_input_with_the_fix(store, args, message):
    result = CliRunner().invoke(app, ["estimate", "--data", str(store.root), *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_cli_needs_run_when_ambiguous_and_data_must_exist(store, tmp_path):
    _write_run(store, "cmp2", "compact")
    result = CliRunner().invoke(app, ["estimate", "--data", str(store.root)])
    assert result.exit_code == 2 and "--run is needed: the store has 2 compact runs" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["estimate", "--data", str(tmp_path / "none")])
    assert result.exit_code == 2 and "is not a directory" in result.output


def test_cli_help_teaches():
    result = CliRunner().invoke(app, ["estimate", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for phrase in ("censored", "greedy", "--sglang-jsonl", "ceiling_validation", "Examples"):
        assert phrase in text
