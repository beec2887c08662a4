"""Tests for collectors.sglang.health_metrics: the sidecar's counters are the health SQL's sums, folded lazily."""

from __future__ import annotations

import pyarrow as pa

from collectors.sglang.health_metrics import HealthCounters
from dspark_obs import health, schema
from tests.test_health import REQS, STEPS


def _tables(offset: int = 0):
    """The hand-computed store's steps, at forward_cts moved by ``offset`` (each poll brings new ones)."""
    def moved(rows):
        return [{**r, "forward_ct": r["forward_ct"] + offset} for r in rows]
    return (pa.Table.from_pylist(moved(STEPS), schema=schema.schema_for("steps")),
            pa.Table.from_pylist(moved(REQS), schema=schema.schema_for("step_reqs")))


def test_counters_are_the_figures_sums_and_survive_many_folds():
    counters = HealthCounters(fold_rows=10**9)
    counters.add(*_tables(0), gamma=3)
    counters.add(*_tables(10), gamma=3)
    counters.fold()
    steps, reqs = _tables(20)
    counters.add(steps.slice(0, 2), reqs.slice(0, 4), gamma=3)  # rank 0 only
    totals = counters.totals()
    # rank 0 of the hand-computed store: 4 request-steps, 2 trimmed, 1 budget-trimmed, 1 censored, padding 3
    assert totals["0"]["request_steps"] == 12 and totals["1"]["request_steps"] == 4
    assert totals["0"]["budget_trimmed_request_steps"] == 3 and totals["0"]["censored_request_steps"] == 3
    assert totals["0"]["padded_tokens"] == 9 and totals["1"]["padded_tokens"] == 8
    assert totals["0"]["dp_tier_tokens"] == 6 and totals["1"]["dp_tier_tokens"] == 0
    assert totals["0"]["costtable_abs_pct_error"] == 3 * 0.25 and totals["1"]["costtable_fit_steps"] == 2


def test_a_full_queue_folds_on_a_background_thread():
    counters = HealthCounters(fold_rows=10)
    counters.add(*_tables(0), gamma=3)
    assert counters._folder is None  # 6 < 10: queued only
    counters.add(*_tables(10), gamma=3)
    counters._folder.join()
    assert counters._pending == [] and counters._rank["0"]["request_steps"] == 8


def test_trimming_active_gauge_follows_the_share_and_the_cost_table():
    counters = HealthCounters(limits=health.Limits(min_request_steps=1))
    steps, reqs = _tables()
    counters.add(steps, reqs, gamma=3)
    names = {fam.name: fam for fam in counters.collect()}
    assert names["dspark_obs:trimming_active"].samples[0].value == 1.0  # 3 of 6 budget-trimmed
    counters.on_run(health.ServerState(mode="compact", sps_table_path=None))
    names = {fam.name: fam for fam in counters.collect()}
    assert names["dspark_obs:trimming_active"].samples[0].value == 0.0
    assert names["dspark_obs:cost_table_loaded"].samples[0].value == 0.0
    lens = {s.labels["verify_len"]: s.value for s in names["dspark_obs:verify_len_request_steps"].samples}
    assert lens == {"1": 1, "2": 1, "3": 2, "4": 2}


def test_observation_counters_sum_the_served_requests_and_the_step_loop():
    counters = HealthCounters()
    counters.on_collect_start(0.0)
    for seconds in (0.25, 0.5, 0.125):
        counters.on_served(seconds)
    counters.on_collect_end(10.0)
    steps, reqs = _tables()
    steps = steps.set_column(steps.schema.get_field_index("step_cpu_ms"), "step_cpu_ms",
                             pa.array([10.0, 20.0, None, 30.0], pa.float64()))
    counters.add(steps, reqs, gamma=3)
    fams = {fam.name: fam for fam in counters.collect()}
    value = lambda name: sum(s.value for s in fams[f"dspark_obs:{name}"].samples)  # noqa: E731
    assert value("observation_server_seconds") == 0.875 and value("observation_requests") == 3
    assert value("observation_collect_seconds") == 10.0
    assert value("step_cpu_steps") == 3 and value("step_cpu_seconds") == 0.060
    per_rank = {s.labels["dp_rank"]: s.value for s in fams["dspark_obs:step_cpu_seconds"].samples}
    assert per_rank == {"0": 0.030, "1": 0.030}


def test_every_series_of_the_run_starts_at_zero_before_its_first_batch():
    """rate() needs a sample before the first increase: ranks, positions and window sizes exist at 0."""
    counters = HealthCounters()
    counters.on_run(health.ServerState(mode="compact", gamma=3, sps_table_path="table.json"), dp_size=2)
    fams = {fam.name: fam for fam in counters.collect()}
    steps = {s.labels["dp_rank"]: s.value for s in fams["dspark_obs:request_steps"].samples}
    assert steps == {"0": 0.0, "1": 0.0}
    positions = {s.labels["position"]: s.value for s in fams["dspark_obs:position_accepted"].samples}
    assert positions == {"1": 0.0, "2": 0.0, "3": 0.0}
    lens = {s.labels["verify_len"]: s.value for s in fams["dspark_obs:verify_len_request_steps"].samples}
    assert lens == {"1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0}
    counters.add(*_tables(), gamma=3)
    fams = {fam.name: fam for fam in counters.collect()}
    steps = {s.labels["dp_rank"]: s.value for s in fams["dspark_obs:request_steps"].samples}
    assert steps["0"] + steps["1"] == 6
