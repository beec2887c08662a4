"""Tests for dspark_obs.estimators.figures and the canned figure_*.sql queries."""

from __future__ import annotations

import datetime as dt
import json
import re

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from collectors.sglang.decode import decode_server_info, records_to_tables
from conftest import run_engine
from dspark_obs import costtable as ct
from dspark_obs import sql
from dspark_obs.estimators import costmodel as cm
from dspark_obs.estimators import figures as fg
from dspark_obs.store import Store

T0 = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)
TRUE = ct.default_additive_table()


def write_run(store: Store, run_id: str, mode: str, *, conc: int, n: int = 24) -> None:
    """An in-process emulator run: steps, step_reqs, requests (virtual-clock latencies) and runs."""
    eng, results = run_engine(mode, n=n, conc=conc, temperature=0.7, seed=7)
    body = msgspec.json.encode({"internal_states": [{"dspark_info_record": p} for p in eng.dump()],
                                "startup_time": 1.0})
    for rank in decode_server_info(body).ranks:
        steps, reqs = records_to_tables(rank.records, dp_rank=rank.dp_rank, segment=0)
        store.write("steps", run_id, steps)
        store.write("step_reqs", run_id, reqs)
    rows = []
    for rid, res in results.items():
        meta = res["meta_info"]
        rows.append({"rid": rid, "workload": rid.rsplit("-", 1)[0], "api": "generate",
                     "completion_tokens": meta["completion_tokens"], "e2e_latency_s": meta["e2e_latency"],
                     "spec_verify_ct": meta.get("spec_verify_ct"), "concurrency": conc, "temperature": 0.7,
                     "submitted_at": T0, "finished_at": T0 + dt.timedelta(seconds=1)})
    store.write("requests", run_id, rows)
    store.upsert_run(run_id, started_at=T0, source="emulator", mode=mode, gamma=6, dp_size=1,
                     server_info=json.dumps({"emulator": True}))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("figures")
    store = Store(root)
    write_run(store, "c4", "compact", conc=4)
    write_run(store, "c16", "compact", conc=16)
    write_run(store, "s8", "static", conc=8, n=12)
    write_run(store, "k8", "cap-accept", conc=8, n=12)
    return root


def _output_columns(name: str) -> list[str]:
    text = sql.canned_queries()[name][1]
    block = text.split("-- Output columns:")[1].split("\n")[1:]
    cols = []
    for line in block:
        if not line.startswith("--"):
            break
        cols += [c.strip() for c in line.lstrip("-").split(",") if c.strip()]
    return cols


@pytest.mark.parametrize("name", ["figure_throughput", "figure_windows", "figure_verify_len",
                                  "figure_costmodel_error", "figure_costmodel_fit"])
def test_each_figure_query_documents_its_parameters_and_columns(root, name):
    text = sql.canned_queries()[name][1]
    assert "-- Parameters:" in text and "$run_id" in text
    result = sql.query(sql.connect(root), name)
    assert result.column_names == _output_columns(name)


def test_throughput_by_hand(tmp_path):
    store = Store(tmp_path)
    store.upsert_run("a", started_at=T0, source="emulator", mode="compact", gamma=6)
    store.write("requests", "a", [
        {"rid": "x", "completion_tokens": 100, "e2e_latency_s": 1.0, "spec_verify_ct": 20, "concurrency": 2,
         "submitted_at": T0, "finished_at": T0 + dt.timedelta(seconds=1)},
        {"rid": "y", "completion_tokens": 50, "e2e_latency_s": 0.5, "spec_verify_ct": 10, "concurrency": 2,
         "submitted_at": T0, "finished_at": T0 + dt.timedelta(seconds=2)},
    ])
    (row,) = fg.throughput_points(sql.connect(tmp_path)).to_pylist()
    assert row["requests"] == 2 and row["completion_tokens"] == 150
    assert row["per_user_tok_s"] == pytest.approx(100.0)  # 100/1 and 50/0.5
    assert row["throughput_tok_s"] == pytest.approx(150 / (1.5 / 2))  # Little's law: busy 0.75 s
    assert row["wall_throughput_tok_s"] == pytest.approx(75.0)  # 150 tokens over the 2 s span
    assert row["mean_accept_length"] == pytest.approx(5.0)


def test_more_concurrency_buys_throughput_with_per_user_speed(root):
    points = {r["run_id"]: r for r in fg.throughput_points(sql.connect(root)).to_pylist()}
    assert points["c16"]["throughput_tok_s"] > points["c4"]["throughput_tok_s"]
    assert points["c16"]["per_user_tok_s"] < points["c4"]["per_user_tok_s"]
    assert points["c4"]["mode"] == "compact" and points["c4"]["concurrency"] == 4
    assert 1 < points["c4"]["mean_accept_length"] <= 7


def test_windows_and_utilisation_per_workload(root):
    rows = fg.window_summary(sql.connect(root)).to_pylist()
    static = [r for r in rows if r["run_id"] == "s8"]
    assert static and all(r["mean_window"] == 6 and r["full_window_share"] == 1.0 for r in static)
    assert all(r["utilisation"] == pytest.approx(1.0) for r in static)  # a full verify commits the ceiling
    compact = [r for r in rows if r["run_id"] == "c16"]
    assert {r["workload"] for r in compact} == {"gsm8k", "arena-hard", "poetry"}
    for r in compact + [r for r in rows if r["run_id"] == "k8"]:
        assert r["known_share"] == 1.0  # emulator truth for every request-step
        assert 0.5 < r["utilisation"] <= 1.0
        assert r["mean_acc_len"] <= r["mean_block_accept_len"]
    by = {r["workload"]: r["mean_window"] for r in compact}
    assert by["gsm8k"] > by["poetry"]  # easy text earns longer windows


def test_verify_len_distribution_covers_every_length_and_sums_to_one(root):
    rows = fg.verify_len_distribution(sql.connect(root), run_id="c16").to_pylist()
    for workload in {r["workload"] for r in rows}:
        mine = [r for r in rows if r["workload"] == workload]
        assert [r["verify_len"] for r in mine] == list(range(1, 8))
        assert sum(r["share"] for r in mine) == pytest.approx(1.0)
        for r in mine:
            assert (r["utilisation"] is None) == (r["known_steps"] == 0)
            if r["verify_len"] == 7 and r["utilisation"] is not None:
                assert r["utilisation"] == pytest.approx(1.0)  # a full window commits the ceiling
    static = fg.verify_len_distribution(sql.connect(root), run_id="s8").to_pylist()
    assert {r["verify_len"] for r in static if r["request_steps"]} == {7}


def _steps_frame(bs, m, measured_ms, context=None, predicted_ms=None) -> pa.Table:
    n = len(bs)
    return pa.table({
        "run_id": ["r"] * n, "bs": np.asarray(bs, np.int64), "m": np.asarray(m, np.int64),
        "measured_s": np.asarray(measured_ms, np.float64) / 1e3,
        "predicted_s": pa.array(None if predicted_ms is None else np.asarray(predicted_ms) / 1e3, pa.float64())
        if predicted_ms is not None else pa.nulls(n, pa.float64()),
        "context_tokens": np.asarray(context if context is not None else np.zeros(n), np.float64),
    })


def test_costmodel_cells_are_medians_beside_the_table():
    frame = _steps_frame([8, 8, 8, 16], [56, 56, 56, 16], [10.0, 30.0, 11.0, 9.0])
    cells = fg.costmodel_cells(frame, TRUE).to_pylist()
    assert [(c["bs"], c["m"], c["n"], c["measured_ms"]) for c in cells] == [(8, 56.0, 3, 11.0), (16, 16.0, 1, 9.0)]
    assert cells[0]["fitted_ms"] == pytest.approx(float(TRUE.step_seconds(num_reqs=8, budget=48)) * 1e3)


def test_predicted_vs_measured_keeps_steps_with_a_time_and_adds_context():
    frame = _steps_frame([4, 4], [28, 28], [9.0, np.nan], context=[1000, 1000], predicted_ms=[9.5, 9.6])
    base = fg.predicted_vs_measured(frame, TRUE).to_pylist()
    assert len(base) == 1 and base[0]["server_ms"] == 9.5
    fit = cm.AdditiveFit(table=TRUE, context_seconds_per_token=1e-6, context_stderr=0.0, alpha_stderr=[],
                         theta_stderr=[], bias_stderr=0.0, bs_covered=[], m_covered=[], n_cells=1, n_steps=1)
    with_ctx = fg.predicted_vs_measured(frame, fit).to_pylist()
    assert with_ctx[0]["fitted_ms"] == pytest.approx(base[0]["fitted_ms"] + 1.0)  # 1000 tokens * 1 us


def test_curves_span_one_token_per_request_to_the_full_block():
    curves = fg.costmodel_curves(TRUE, [1, 64], gamma=6, points=3).to_pylist()
    assert [(c["bs"], c["m"]) for c in curves] == [(1, 1.0), (1, 4.0), (1, 7.0), (64, 64.0), (64, 256.0),
                                                   (64, 448.0)]
    assert curves[3]["step_ms"] == pytest.approx((0.008 + 0.0032 + 0.00275) * 1e3)
    with pytest.raises(ValueError, match="batch sizes must be >= 1, got 0"):
        fg.costmodel_curves(TRUE, [0])


def test_cost_model_figures_from_a_real_fit(root):
    con = sql.connect(root)
    steps = cm.load_steps(con, ["c4", "c16", "s8"])
    report = cm.fit_runs(con, ["c4", "c16", "s8"], bs_probes=[1, 8, 16], m_probes=[1, 64, 128])
    cells = fg.costmodel_cells(steps, report.fit)
    assert cells.num_rows == report.fit.n_cells
    pvm = fg.predicted_vs_measured(steps, report.fit)
    rel = np.abs(np.array(pvm.column("fitted_ms")) / np.array(pvm.column("measured_ms")) - 1)
    assert rel.mean() == pytest.approx(report.overall_mape("fitted"), rel=1e-9)
    with pytest.raises(ValueError, match=re.escape("steps frame lacks columns ['m']")):
        fg.costmodel_cells(steps.drop_columns(["m"]), report.fit)
