"""Tests for dspark_obs.report.inputs: choosing the runs and the baseline, durations, unreadable files."""

from __future__ import annotations

import datetime as dt

import pytest

from dspark_obs.report.inputs import InputError, RunInfo, check_readable, parse_duration, select_runs
from dspark_obs.store import Store

NOW = dt.datetime(2026, 12, 1, 6, 0, tzinfo=dt.timezone.utc)


def _run(run_id, hours_ago, *, mode="compact", companion_of=None, request_steps=100) -> RunInfo:
    return RunInfo(run_id, mode, 6, "emulator", NOW - dt.timedelta(hours=hours_ago), None, companion_of,
                   10, request_steps, 5)


RUNS = [
    _run("mon", 50), _run("tue", 26), _run("tue-cap", 25.5, mode="cap-accept", companion_of="tue"),
    _run("wed", 3), _run("wed-cap", 2.5, mode="cap-accept", companion_of="wed"), _run("old", 24 * 20),
]


def test_parse_duration():
    assert parse_duration("24h") == dt.timedelta(hours=24)
    assert parse_duration("1.5d") == dt.timedelta(hours=36)
    assert parse_duration(" 90 m ") == dt.timedelta(minutes=90)
    for bad in ("24", "h", "-1h", "0d", "3y"):
        with pytest.raises(ValueError, match="is not a positive number with a unit"):
            parse_duration(bad)


def test_since_picks_runs_started_in_the_window_without_companions():
    sel = select_runs(RUNS, since="24h", now=NOW)
    assert [r.run_id for r in sel.runs] == ["wed"]
    assert sel.companions == {"tue": "tue-cap", "wed": "wed-cap"}
    assert sel.window["kind"] == "since" and sel.window["start"] == "2026-11-30T06:00:00Z"
    assert sel.baseline == [] and sel.baseline_window is None


def test_baseline_since_is_the_span_before_the_reported_runs():
    sel = select_runs(RUNS, since="24h", baseline_since="7d", now=NOW)
    assert [r.run_id for r in sel.baseline] == ["mon", "tue"]  # not companions, not 'old', not 'wed'
    assert sel.baseline_window["end"] == "2026-12-01T03:00:00Z"
    sel = select_runs(RUNS, runs=["tue"], baseline_since="2d", now=NOW)
    assert [r.run_id for r in sel.baseline] == ["mon"]


def test_named_runs_and_baselines():
    sel = select_runs(RUNS, runs=["tue-cap"], baseline=["mon", "tue"], now=NOW)
    assert [r.run_id for r in sel.runs] == ["tue-cap"]  # a companion named explicitly is reported
    assert [r.run_id for r in sel.baseline] == ["mon", "tue"]


@pytest.mark.parametrize("kwargs, message", [
    ({"runs": ["fri"]}, r"--run fri: no such run in the store; runs: mon, tue, wed, old"),
    ({"since": "1h"}, r"no runs started in the last 1h .*the newest run is wed, started 2026-12-01T03:00:00Z"),
    ({"runs": ["wed"], "baseline": ["sat"]}, "--baseline sat: no such run"),
    ({"runs": ["wed"], "baseline": ["wed"]}, "a run cannot be its own baseline"),
])
def test_selection_errors_name_the_fix(kwargs, message):
    with pytest.raises(InputError, match=message):
        select_runs(RUNS, now=NOW, **kwargs)


def test_an_empty_store_and_runs_without_request_steps_are_unusable():
    with pytest.raises(InputError, match="the store holds no runs"):
        select_runs([], now=NOW)
    with pytest.raises(InputError, match="no data in the window: run\\(s\\) wed recorded no request-steps"):
        select_runs([_run("wed", 1, request_steps=0)], since="24h", now=NOW)
    sel = select_runs([_run("a", 1), _run("b", 2, request_steps=0)], since="24h", now=NOW)
    assert [r.run_id for r in sel.runs] == ["a"] and "no request-steps, left out: b" in sel.notes[0]


def test_check_readable_names_a_truncated_part_file(tmp_path):
    store = Store(tmp_path)
    path = store.write("gaps", "r1", [{"dp_rank": 0, "first_missing_forward_ct": 1, "last_missing_forward_ct": 2,
                                       "reason": "clear", "segment": 0, "detected_at": NOW}])
    check_readable(tmp_path, ["r1"])
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(InputError, match=f"unreadable part file {path}"):
        check_readable(tmp_path, ["r1"])
    check_readable(tmp_path, ["r2"])  # only the named runs are opened
