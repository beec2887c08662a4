"""Tests for collectors.sglang.losses and runlife: the pure bookkeeping behind the loss rows."""

from __future__ import annotations

import datetime as dt

import pytest

from collectors.sglang import runlife
from collectors.sglang.losses import Outage, RequestAccounting, dropped_rows
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


def test_consecutive_failed_polls_are_one_outage_with_its_duration():
    now = [100.0]
    outage = Outage(clock=lambda: now[0])
    assert outage.close() is None
    assert outage.failed("refused", timeout=False) is True  # opens: dead-letter this one
    now[0] = 101.5
    assert outage.failed("refused again", timeout=False) is False
    now[0] = 102.25
    fields = outage.close()
    assert fields["reason"] == "poll_error" and fields["duration_s"] == pytest.approx(2.25)
    assert "2 failed polls (0 timed out); first: refused" == fields["detail"]
    assert outage.close() is None


def test_an_outage_of_timeouts_only_is_a_stall():
    now = [0.0]
    outage = Outage(clock=lambda: now[0])
    outage.failed("timed out", timeout=True)
    now[0] = 30.0
    assert outage.close()["reason"] == "poll_stall"
    outage.failed("timed out", timeout=True)
    outage.failed("refused", timeout=False)
    assert outage.close()["reason"] == "poll_error"  # mixed: not only a stall


def test_request_accounting_reports_each_mismatch_with_the_likely_cause():
    acc = RequestAccounting()
    acc.add_steps(["a", "a", "b", None, "c", "c", "c"])
    acc.finished("a", 2)      # all stored
    acc.finished("b", 4)      # 3 missing
    acc.finished("c", 2)      # one more stored than the server counted
    acc.finished("d", None)   # no spec_verify_ct: nothing to check
    rows = acc.mismatches({"clear", "request_failed"})
    assert [(r["rid"], r["rows_lost"]) for r in rows] == [("b", 3), ("c", -1)]
    assert rows[0]["detail"] == "spec_verify_ct 4, stored request-steps 1; the run's gaps: clear"
    assert "no forward_ct gap explains it" in acc.mismatches()[0]["detail"]


def test_dropped_rows_one_row_per_table_and_kind():
    rows = dropped_rows({"tokens": 14160, "requests": 883, "gaps": 0}, {"steps": 5})
    assert [(r["reason"], r["table_name"], r["rows_lost"]) for r in rows] == [
        ("write_backlog", "requests", 883), ("write_backlog", "tokens", 14160), ("write_failed", "steps", 5)]


def test_runlife_refuses_then_resumes_and_marks_the_crash(tmp_path):
    store = Store(tmp_path)
    assert runlife.check_new_run(store, "r", resume=False) is None  # a new run
    store.upsert_run("r", started_at=T0, source="emulator", labels={"a": "1"})
    store.write("steps", "r", [{"dp_rank": 0, "forward_ct": f, "segment": 0, "bs": 1, "num_running_reqs": 1,
                                "mode": "compact", "num_verify_tokens": 4, "verify_tokens_local": 4,
                                "verify_tokens_dp_synced": 4, "verify_tokens_graph_key": 4} for f in (3, 9)])
    with pytest.raises(runlife.RunExists, match=r"unclosed .*--resume"):
        runlife.check_new_run(store, "r", resume=False)
    row = runlife.check_new_run(store, "r", resume=True)
    assert row["end_reason"].startswith("crashed: the collector ended without closing the run")
    stored = store.read("runs", "r").to_pylist()[0]
    assert stored["ended_at"] is not None and stored["started_at"] == T0
    point = runlife.resume_point(store, "r", row)
    assert point.high_water == {0: 9} and point.segment == 0
    assert point.labels["resume_1_previous_end"].startswith("crashed") and point.labels["a"] == "1"


def test_resume_keeps_a_mark_per_table_when_a_kill_split_a_flush(tmp_path):
    """steps committed up to 9, step_reqs only up to 3: the cursor re-reads from 3, each table keeps its own."""
    store = Store(tmp_path)
    store.upsert_run("r", started_at=T0, source="emulator")
    store.write("steps", "r", [{"dp_rank": 0, "forward_ct": f, "segment": 0, "bs": 1, "num_running_reqs": 1,
                                "mode": "compact", "num_verify_tokens": 4, "verify_tokens_local": 4,
                                "verify_tokens_dp_synced": 4, "verify_tokens_graph_key": 4} for f in (3, 9)])
    store.write("step_reqs", "r", [{"dp_rank": 0, "forward_ct": 3, "segment": 0, "rid": "a", "req_pool_index": 0,
                                    "prefix_len": 1, "verify_len": 2, "acc_len": 1, "correct_drafts": 0,
                                    "cap_trim": 0, "bonus_token": 1, "draft_tokens": [1, 2, 3]}])
    store.write("requests", "r", [{"rid": "a", "spec_verify_ct": 2}])
    row = runlife.check_new_run(store, "r", resume=True)
    point = runlife.resume_point(store, "r", row)
    assert point.high_water == {0: 9} and point.reqs_high_water == {0: 3}
    assert point.verify_ct == {"a": 2} and point.request_steps == {"a": 1}
