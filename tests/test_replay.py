"""Tests for dspark_obs.estimators.replay: conformance with the one scheduler, and what-if."""

from __future__ import annotations

import datetime as dt
import json

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from collectors.sglang.decode import decode_server_info, records_to_tables
from conftest import run_engine
from dspark_obs import costtable as ct
from dspark_obs import sql
from dspark_obs.cli import app
from dspark_obs.estimators import replay as rp
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)
CASES = [("compact", 1), ("compact", 2), ("cap-accept", 1), ("cap-accept", 2)]


def write_engine(store: Store, run_id: str, eng, *, drop_forward_ct: int | None = None) -> None:
    """The engine's records as the collector stores them; optionally lose one record of rank 0."""
    body = msgspec.json.encode({"internal_states": [{"dspark_info_record": p} for p in eng.dump()],
                                "startup_time": 1.0})
    for rank in decode_server_info(body).ranks:
        records = [r for r in rank.records if not (rank.dp_rank == 0 and r.forward_ct == drop_forward_ct)]
        steps, reqs = records_to_tables(records, dp_rank=rank.dp_rank, segment=0)
        store.write("steps", run_id, steps)
        store.write("step_reqs", run_id, reqs)
    store.upsert_run(run_id, started_at=T0, source="emulator", mode=eng.cfg.mode, gamma=eng.cfg.gamma,
                     dp_size=eng.cfg.dp_size, server_info=json.dumps({"emulator": True}))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    store = Store(root)
    for mode, dp in CASES:
        eng, _ = run_engine(mode, n=36, conc=18, temperature=0.7, seed=5, dp_size=dp)
        write_engine(store, f"{mode}-dp{dp}", eng)
    eng, _ = run_engine("static", n=8, conc=4, temperature=0.7, seed=5)
    write_engine(store, "static-dp1", eng)
    return root


@pytest.fixture(scope="module")
def con(runs):
    return sql.connect(runs)


# -- pure functions ------------------------------------------------------------------------

def test_recalibrate_by_hand():
    # logit(0.8) = ln 4; T_current 1 -> T_new 2 halves it: sigmoid(ln 2) = 2/3
    out = rp.recalibrate(np.array([[0.8, 0.8, 1.0, 0.0]], dtype=np.float32), [1, 2, 1, 1], [2, 2, 3, 3])
    assert out.dtype == np.float32
    assert out[0, 0] == pytest.approx(2 / 3, rel=1e-6)
    assert out[0, 1] == np.float32(0.8)  # unchanged where the temperatures agree
    assert out[0, 2] == 1.0 and out[0, 3] == 0.0  # certain stays certain
    with pytest.raises(ValueError, match=r"new STS temperatures must be 4 positive numbers.*\[1.0, -1.0\]"):
        rp.recalibrate(out, [1, 1, 1, 1], [1, -1])


def test_lag_restarts_per_rank_and_segment():
    dp = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    seg = np.array([0, 0, 0, 1, 1, 0, 0, 0])
    assert rp.lag_indices(dp, seg, np.full(8, 2)).tolist() == [-1, -1, 0, -1, -1, -1, -1, 5]
    assert rp.lag_indices(dp, seg, np.full(8, 1)).tolist() == [-1, 0, 1, -1, 3, -1, 5, 6]


def test_expected_block_accept_given_the_window_was_all_accepted():
    # S = .5, .25, .125; window 1 accepted: 1 + (.25 + .125) / .5 = 1.75; window 0: sum of S
    got = rp.expected_block_accept(np.array([[0.5, 0.25, 0.125]] * 2), np.array([1, 0]))
    assert got.tolist() == [1.75, 0.875]


def test_block_acceptance_prefers_truth_then_ceiling_then_survival():
    surv = np.array([[0.5, 0.25, 0.125]] * 4)
    lo, mid, hi, src = rp.block_acceptance(
        mode="compact", gamma=3, window=np.array([1, 1, 1, 3]), correct_drafts=np.array([1, 1, 1, 3]),
        cap_trim=np.zeros(4), survival=surv, truth=np.array([2.0, np.nan, np.nan, np.nan]),
        ceiling=(np.array([np.nan, 1.0, np.nan, np.nan]), np.array([np.nan, 1.5, np.nan, np.nan]),
                 np.array([np.nan, 3.0, np.nan, np.nan])))
    assert [rp.SOURCES[i] for i in src] == ["truth", "ceiling", "survival", "truth"]
    assert mid.tolist() == [2.0, 1.5, 1.75, 3.0]
    assert lo.tolist() == [2.0, 1.0, 1.0, 3.0] and hi.tolist() == [2.0, 3.0, 3.0, 3.0]
    # cap-accept shows the whole block: correct + cap_trim, whatever else is passed
    lo, mid, hi, src = rp.block_acceptance(mode="cap-accept", gamma=3, window=np.array([1]),
                                           correct_drafts=np.array([1]), cap_trim=np.array([1]),
                                           survival=surv[:1])
    assert (lo[0], mid[0], hi[0], src[0]) == (2.0, 2.0, 2.0, 0)


# -- conformance -------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,dp", CASES)
def test_replay_reproduces_every_logged_window_and_budget(con, mode, dp):
    log = rp.load_step_log(con, f"{mode}-dp{dp}")
    assert set(log.dp_rank.tolist()) == set(range(dp))
    assert log.num_steps > 40
    budgets, lens = rp.replay_schedule(log, ct.default_additive_table())
    result = rp.conformance(log, budgets, lens)
    assert result["unknown_history_steps"] == 0
    assert result["share"] == 1.0 and result["matching_steps"] == result["steps"] == log.num_steps
    assert result["budget_matches"] == log.num_steps


def _shuffled_copy(runs, root, *, keep_batch_index: bool) -> None:
    """compact-dp2 with its request rows shuffled, as a store clustered by rid holds them."""
    src, store = Store(runs), Store(root)
    reqs = src.read("step_reqs", "compact-dp2")
    if not keep_batch_index:
        reqs = reqs.drop_columns(["batch_index"])
    store.write("step_reqs", "compact-dp2", reqs.take(np.random.default_rng(3).permutation(reqs.num_rows)))
    store.write("steps", "compact-dp2", src.read("steps", "compact-dp2"))
    store.upsert_run("compact-dp2", started_at=T0, source="emulator", mode="compact", gamma=6, dp_size=2)


def test_a_steps_rows_replay_in_batch_order_whatever_the_file_order(con, runs, tmp_path):
    """The replay orders a step's rows by batch_index (SGLang's batch order, the scheduler's tie-break), so a
    store that keeps them in any order, as one clustered by request does, replays the same log."""
    log = rp.load_step_log(con, "compact-dp2")
    for keep, root in ((True, tmp_path / "kept"), (False, tmp_path / "lost")):
        _shuffled_copy(runs, root, keep_batch_index=keep)
        got = rp.load_step_log(sql.connect(root), "compact-dp2")
        same = all(np.array_equal(getattr(got, name), getattr(log, name))
                   for name in ("row_ptr", "rid", "verify_len", "acc_len", "confidence", "block_mid"))
        assert same == keep   # without batch_index the shuffled rows stay shuffled: the check can fail


def test_request_rows_of_a_step_the_store_lacks_are_refused(runs, tmp_path):
    """A step_reqs row whose step has no steps row (a store written half-way) names the fix, whichever rows
    are missing: the first, a middle or the last step's."""
    src = Store(runs)
    steps = src.read("steps", "compact-dp1").drop_columns(["run_id"])
    for drop in (0, steps.num_rows // 2, steps.num_rows - 1):
        root = tmp_path / f"lost-{drop}"
        store = Store(root)
        store.write("steps", "compact-dp1", steps.filter(pa.array(np.arange(steps.num_rows) != drop)))
        store.write("step_reqs", "compact-dp1", src.read("step_reqs", "compact-dp1").drop_columns(["run_id"]))
        store.upsert_run("compact-dp1", started_at=T0, source="emulator", mode="compact", gamma=6, dp_size=1)
        with pytest.raises(ValueError, match="have no steps row"):
            rp.load_step_log(sql.connect(root), "compact-dp1")


def test_conformance_notices_a_different_table(con):
    log = rp.load_step_log(con, "compact-dp1")
    flat = ct.SpsAdditiveCostTable(bias_seconds=0.008, bs_probes=[1], alpha_seconds=[0.0],
                                   m_probes=[1, 64], theta_seconds=[0.0, 0.0001])
    result = rp.conformance(log, *rp.replay_schedule(log, flat))
    assert result["share"] < 0.5 and result["budget_matches"] < log.num_steps


def test_the_lag_matters(con):
    log = rp.load_step_log(con, "compact-dp2")
    wrong = rp.StepLog(**{**log.__dict__, "lag_steps": np.ones_like(log.lag_steps)})
    assert rp.conformance(wrong, *rp.replay_schedule(wrong, ct.default_additive_table()))["budget_matches"] \
        < log.num_steps


def test_steps_after_a_collection_gap_are_set_apart(tmp_path):
    eng, _ = run_engine("compact", n=24, conc=12, temperature=0.7, seed=6)
    decode_cts = [r["forward_ct"] for r in eng.dump()[0]["records"]]
    lost = decode_cts[len(decode_cts) // 2]
    store = Store(tmp_path)
    write_engine(store, "gappy", eng, drop_forward_ct=lost)
    store.write("gaps", "gappy", [{"dp_rank": 0, "first_missing_forward_ct": lost,
                                   "last_missing_forward_ct": lost, "reason": "clear", "segment": 0,
                                   "detected_at": T0}])
    report = rp.replay_run(sql.connect(tmp_path), "gappy")
    c = report.conformance
    assert c["unknown_history_steps"] == 2  # the two steps whose lag-2 step is unknown
    assert c["steps"] == len(decode_cts) - 1 - 2
    assert c["share"] == 1.0


# -- what-if -----------------------------------------------------------------------------------

def _rows(report) -> dict[str, dict]:
    return {w["scenario"]: w for w in report.whatif}


@pytest.mark.parametrize("run", ["compact-dp1", "cap-accept-dp2"])
def test_identity_sts_reproduces_the_logged_outcome(con, run):
    report = rp.replay_run(con, run, sts_temperatures=[1.0] * 6)
    rows = _rows(report)
    logged, replay, sts = rows["logged"], rows["replay"], rows["sts"]
    assert logged["steps"] == replay["steps"] == sts["steps"]
    assert sts["accepted_tokens_mean"] == logged["accepted_tokens_mean"]
    assert sts["accepted_tokens_lo"] == sts["accepted_tokens_hi"] == logged["accepted_tokens_mean"]
    assert sts["acc_len_mean"] == logged["acc_len_mean"]
    assert {k: v for k, v in sts.items() if k != "scenario"} == {k: v for k, v in replay.items() if k != "scenario"}
    assert sts["acceptance_source"] == "truth" and sts["estimated_share"] == 0.0
    # priced by the planning table at the logged graph tiers: within noise of the measured time
    assert sts["step_ms_mean"] == pytest.approx(logged["step_ms_mean"], rel=0.05)


def test_hotter_temperatures_trim_more(con):
    rows = _rows(rp.replay_run(con, "compact-dp1", sts_temperatures=[3.0] * 6))
    assert rows["sts"]["accepted_tokens_mean"] <= rows["replay"]["accepted_tokens_mean"]
    assert rows["sts"]["step_ms_mean"] <= rows["replay"]["step_ms_mean"]


def test_a_flat_table_verifies_full_blocks_and_commits_the_ceiling(con):
    flat = ct.uninitialized_table(max_batch_tokens=256 * 7)
    report = rp.replay_run(con, "compact-dp1", whatif_table=flat, sts_temperatures=[1.0] * 6)
    rows = _rows(report)
    log = rp.load_step_log(con, "compact-dp1")
    ceiling = np.add.reduceat(log.block_mid + 1, log.row_ptr[:-1]).mean()
    # every draft is verified except those whose survival fell below survival_eps (1e-6)
    assert ceiling * 0.99 <= rows["table"]["accepted_tokens_mean"] <= ceiling
    assert rows["table"]["accepted_tokens_mean"] >= rows["replay"]["accepted_tokens_mean"]
    assert rows["table"]["step_ms_mean"] > rows["replay"]["step_ms_mean"]
    assert rows["sts+table"]["accepted_tokens_mean"] == rows["table"]["accepted_tokens_mean"]


def test_without_truth_the_interval_comes_from_survival_and_covers_the_truth(con):
    truth = _rows(rp.replay_run(con, "compact-dp1", whatif_table=ct.uninitialized_table(max_batch_tokens=7)))
    report = rp.replay_run(con, "compact-dp1", whatif_table=ct.uninitialized_table(max_batch_tokens=7),
                           use_emulator_truth=False)
    est = _rows(report)["table"]
    assert est["acceptance_source"] == "survival" and 0 < est["estimated_share"] < 1
    assert est["accepted_tokens_lo"] <= truth["table"]["accepted_tokens_mean"] <= est["accepted_tokens_hi"]
    assert est["accepted_tokens_lo"] < est["accepted_tokens_mean"] < est["accepted_tokens_hi"]
    assert any("survival-based expectation" in n for n in report.notes)
    # the logged windows stay exact: censored steps commit their whole window either way
    assert _rows(report)["replay"]["accepted_tokens_lo"] == _rows(report)["replay"]["accepted_tokens_hi"]


def test_ceiling_rows_fill_in_censored_steps(con, runs, tmp_path):
    from dspark_obs import schema

    if "ceiling" not in schema.TABLES:
        pytest.skip("no ceiling estimator in this tree")
    log_rows = con.sql("SELECT dp_rank, forward_ct, segment, rid, prefix_len, verify_len - 1 AS w, "
                       "correct_drafts, emu_block_accept FROM step_reqs WHERE run_id = 'compact-dp1'").fetchall()
    rows = [{"dp_rank": d, "forward_ct": f, "segment": s, "rid": r, "prefix_len": p, "window": w,
             "correct_drafts": c, "censored": c == w < 6, "category": "censored_resolved_exact",
             "lo": float(b), "mid": float(b), "hi": float(b), "method": "default"}
            for d, f, s, r, p, w, c, b in log_rows]
    Store(runs).write("ceiling", "compact-dp1", rows)
    try:
        con2 = sql.connect(runs)
        table = ct.uninitialized_table(max_batch_tokens=7)
        with_ceiling = _rows(rp.replay_run(con2, "compact-dp1", whatif_table=table, use_emulator_truth=False))
        truth = _rows(rp.replay_run(con2, "compact-dp1", whatif_table=table))
    finally:
        Store(runs).drop_run("ceiling", "compact-dp1")
    assert with_ceiling["table"]["acceptance_source"] == "ceiling"
    assert with_ceiling["table"]["accepted_tokens_mean"] == pytest.approx(truth["table"]["accepted_tokens_mean"])


def test_results_are_written_and_replaced(con, tmp_path):
    report = rp.replay_run(con, "cap-accept-dp1", sts_temperatures=[1.2] * 6)
    store = Store(tmp_path)
    rp.write_results(store, report)
    rp.write_results(store, report)
    assert store.read("replay_conformance", "cap-accept-dp1").to_pylist()[0]["share"] == 1.0
    assert [r["scenario"] for r in store.read("replay_whatif").to_pylist()] == ["logged", "replay", "sts"]


# -- errors and the command line ---------------------------------------------------------------

def test_bad_inputs_are_refused_with_the_fix(con):
    with pytest.raises(ValueError, match="static steps carry no confidences"):
        rp.replay_run(con, "static-dp1")
    with pytest.raises(ValueError, match="run 'nope' has no decode steps"):
        rp.replay_run(con, "nope")
    with pytest.raises(ValueError, match="STS temperatures must be 6 positive numbers"):
        rp.replay_run(con, "compact-dp1", sts_temperatures=[1.0, 1.0])
    with pytest.raises(ValueError, match="timer 'wall' is not one of"):
        rp.replay_run(con, "compact-dp1", timer="wall")


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_cli_reports_conformance_and_what_if(runs, tmp_path):
    sts = tmp_path / "sts.json"
    sts.write_text(json.dumps({"temperatures": [1.0] * 6, "dataset": "x"}))
    result = CliRunner().invoke(app, ["replay", "--data", str(runs), "--run", "compact-dp2", "--sts", str(sts),
                                      "--no-write"])
    assert result.exit_code == 0, result.output
    out = _flat(result.output)
    assert "steps replay to the logged verify_len (100.00%)" in out
    assert "logged" in out and "sts" in out


def test_cli_errors_name_the_fix(runs, tmp_path):
    runner = CliRunner()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"temperatures": [0, 1]}))
    result = runner.invoke(app, ["replay", "--data", str(runs), "--run", "compact-dp1", "--sts", str(bad)])
    assert result.exit_code == 2 and '{"temperatures": [positive numbers' in _flat(result.output)
    result = runner.invoke(app, ["replay", "--data", str(runs), "--run", "compact-dp1",
                                 "--sps-table", str(tmp_path / "none.json")])
    assert result.exit_code == 2 and "--sps-table" in result.output and "cannot read it" in _flat(result.output)
    result = runner.invoke(app, ["replay", "--data", str(runs), "--run", "static-dp1"])
    assert result.exit_code == 2 and "replay a compact or cap-accept run" in _flat(result.output)
    result = runner.invoke(app, ["replay", "--data", str(runs), "--run", "bad id"])
    assert result.exit_code == 2 and "invalid run_id" in _flat(result.output)
