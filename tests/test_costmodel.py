"""Tests for dspark_obs.estimators.costmodel: binned least squares on hat bases, recovery, context, CLI."""

from __future__ import annotations

import datetime as dt
import json

import msgspec
import numpy as np
import pytest
from typer.testing import CliRunner

from collectors.sglang.decode import decode_server_info, records_to_tables
from dspark_obs import costtable as ct
from dspark_obs import sql
from dspark_obs.cli import app
from dspark_obs.emulator.engine import Engine, EngineConfig, GenerateRequest
from dspark_obs.estimators import costmodel as cm
from dspark_obs.store import Store

TRUE = ct.default_additive_table()
# Per-token cost so steep that k* = 0: the target runs one token per request (M = bs,
# rounded up to a graph tier) -- the low-M edge SGLang's profiler pins with --fracs.
TIGHT = ct.SpsAdditiveCostTable(bias_seconds=1e-3, bs_probes=[1], alpha_seconds=[0.0],
                                m_probes=[1, 4096], theta_seconds=[0.0, 100.0])
WORKLOADS = ("gsm8k", "arena-hard", "poetry")
T0 = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)


# -- in-process emulator runs ----------------------------------------------------------

def steady_run(cfg: EngineConfig, levels, steps_at, *, prompt_words: int = 0) -> Engine:
    """Closed loop: hold each concurrency level for ``steps_at(level)`` decode steps, rising.

    Finished requests are replaced at once, so the batch sits at the level; levels only
    rise, so nothing drains (requests still running at the end are simply left).
    """
    eng = Engine(cfg)
    rank = eng.ranks[0]
    futures, n = [], 0
    for level in levels:
        done = 0
        while done < steps_at(level):
            futures = [f for f in futures if not f.done()]
            while len(futures) < level:
                w = WORKLOADS[n % 3]
                words = " x" * ((n * 7919) % prompt_words) if prompt_words else ""
                futures.append(eng.submit(GenerateRequest(
                    rid=f"{w}-{n:06d}", text=f"[{w}] request {n}{words}", temperature=0.7,
                    max_new_tokens=4096, sampling_seed=n)))
                n += 1
            decodes = not rank.waiting and bool(rank.running)
            eng.step()
            done += decodes
    return eng


def write_engine(store: Store, run_id: str, eng: Engine) -> None:
    """The engine's records, decoded as the collector decodes /server_info, into the store."""
    body = msgspec.json.encode({"internal_states": [{"dspark_info_record": p} for p in eng.dump()],
                                "startup_time": 1.0})
    for rank in decode_server_info(body).ranks:
        steps, reqs = records_to_tables(rank.records, dp_rank=rank.dp_rank, segment=0)
        store.write("steps", run_id, steps)
        store.write("step_reqs", run_id, reqs)
    store.upsert_run(run_id, started_at=T0, source="emulator", mode=eng.cfg.mode, gamma=eng.cfg.gamma,
                     dp_size=eng.cfg.dp_size, server_info=json.dumps({"emulator": True}))


def three_regimes(store: Store, prefix: str, levels, steps_at, **cfg) -> list[str]:
    """Static (M = 7 bs), compact at k* = 0 (M ~ bs) and compact on the default table (between)."""
    runs = []
    for name, mode, table in (("static", "static", None), ("tight", "compact", TIGHT),
                              ("compact", "compact", ct.default_additive_table())):
        extra = {} if table is None else {"sps_table": table}
        eng = steady_run(EngineConfig(mode=mode, seed=3, **extra, **cfg), levels, steps_at)
        write_engine(store, f"{prefix}-{name}", eng)
        runs.append(f"{prefix}-{name}")
    return runs


@pytest.fixture(scope="module")
def recovery(tmp_path_factory):
    """Three regimes at 13 batch sizes from 1 to 256 on the true default table, no context cost.

    Step noise is 0.5% (a quarter of the emulator's default): alpha(8) = 0.4 ms is 5% of an
    8.4 ms step, so 5% of *it* is 0.25% of the step; at the default 2% noise that precision
    needs ~100k request-steps of emulation instead of ~10k.
    """
    root = tmp_path_factory.mktemp("costmodel")
    store = Store(root)
    runs = three_regimes(store, "rec", [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256],
                         lambda c: max(5, 250 // c), step_noise=0.005, context_seconds_per_token=0.0)
    return root, runs


def _context_runs(root, ctx: float) -> list[str]:
    store = Store(root)
    runs = []
    for name, mode, table in (("static", "static", None), ("tight", "compact", TIGHT)):
        extra = {} if table is None else {"sps_table": table}
        eng = steady_run(EngineConfig(mode=mode, seed=3, context_seconds_per_token=ctx, **extra),
                         [4, 16], lambda c: 60, prompt_words=1000)
        write_engine(store, f"ctx-{name}", eng)
        runs.append(f"ctx-{name}")
    return runs


# -- pure functions ----------------------------------------------------------------------

def test_hat_basis_is_numpys_linear_interpolation_clamped():
    rng = np.random.default_rng(0)
    probes = [1, 8, 16, 32, 64, 128, 256]
    values = rng.normal(size=len(probes))
    x = np.concatenate([rng.uniform(-5, 300, 200), probes])
    assert np.allclose(cm.hat_basis(x, probes) @ values, np.interp(x, probes, values))
    assert np.allclose(cm.hat_basis(x, probes).sum(axis=1), 1.0)


def test_target_tokens_is_the_full_block_for_cap_accept_and_the_record_otherwise():
    m = cm.target_tokens(["compact", "static", "cap-accept"], np.array([3, 3, 3]), np.array([24, 21, 9]), 6)
    assert m.tolist() == [24, 21, 21]


def test_cells_take_the_median_and_count_steps():
    cells = cm.bin_cells(np.array([2, 2, 2, 4]), np.array([8, 8, 8, 16]), np.array([1.0, 9.0, 2.0, 5.0]),
                         np.array([10.0, 20.0, 30.0, 40.0]))
    assert cells.bs.tolist() == [2, 4] and cells.m.tolist() == [8.0, 16.0]
    assert cells.n.tolist() == [3, 1]
    assert cells.seconds.tolist() == [2.0, 5.0]
    assert cells.context_tokens.tolist() == [20.0, 40.0]
    assert cells.cell_of_step.tolist() == [0, 0, 0, 1]


def test_least_squares_on_a_two_by_two_table_by_hand():
    # y = b + a*[bs=9] + t*[M=17] on the corners: a = ((13-10)+(16-15))/2 = 2,
    # t = ((15-10)+(16-13))/2 = 4, b = mean - a/2 - t/2 = 13.5 - 3 = 10.5 (ms);
    # residuals -0.5, +0.5, +0.5, -0.5.
    cells = cm.Cells(bs=np.array([1, 9, 1, 9]), m=np.array([1.0, 1, 17, 17]), n=np.ones(4, int),
                     seconds=np.array([10.0, 13.0, 15.0, 16.0]) * 1e-3, context_tokens=np.full(4, np.nan))
    fit = cm.fit_additive(cells, bs_probes=[1, 9], m_probes=[1, 17])
    assert fit.table.bias_seconds == pytest.approx(10.5e-3)
    assert fit.table.alpha_seconds == pytest.approx([0.0, 2e-3])
    assert fit.table.theta_seconds == pytest.approx([0.0, 4e-3])
    # residual variance 4 * 0.25 / (4 - 3) = 1 ms^2; var(a) = 1 ms^2 * [(X'X)^-1]_aa = 1, so se = 1 ms
    assert fit.alpha_stderr[1] == pytest.approx(1e-3)
    # linear in between: T(5, 9) = 10.5 + 1 + 2
    assert fit.predict_seconds(np.array([5]), np.array([9]))[0] == pytest.approx(13.5e-3)


def test_cell_weights_are_step_counts():
    # the same corners, but the (1, 1) cell holds 3 steps: it pulls the fit toward 10 ms there
    base = dict(bs=np.array([1, 9, 1, 9]), m=np.array([1.0, 1, 17, 17]),
                seconds=np.array([10.0, 13.0, 15.0, 16.0]) * 1e-3, context_tokens=np.full(4, np.nan))
    even = cm.fit_additive(cm.Cells(n=np.ones(4, int), **base), bs_probes=[1, 9], m_probes=[1, 17])
    heavy = cm.fit_additive(cm.Cells(n=np.array([3, 1, 1, 1]), **base), bs_probes=[1, 9], m_probes=[1, 17])
    assert abs(heavy.predict_seconds(np.array([1]), np.array([1]))[0] - 10e-3) < \
        abs(even.predict_seconds(np.array([1]), np.array([1]))[0] - 10e-3)


def test_bias_stays_positive_as_sglang_requires():
    bs = np.array([1, 9, 1, 9])
    m = np.array([1.0, 1, 17, 17])
    cells = cm.Cells(bs=bs, m=m, n=np.ones(4, int), seconds=(-1.0 + 2 * (bs > 1) + 4 * (m > 1)) * 1e-3,
                     context_tokens=np.full(4, np.nan))
    fit = cm.fit_additive(cells, bs_probes=[1, 9], m_probes=[1, 17])
    assert fit.table.bias_seconds > 0
    ct.from_json(ct.to_json(fit.table))  # SGLang's validation accepts it


def test_probes_without_data_are_dropped_from_the_grid():
    bs = np.array([1, 4, 8, 1, 4, 8])
    m = np.array([8.0, 28, 56, 8, 8, 8])
    seconds = TRUE.step_seconds(num_reqs=bs, budget=m - bs)
    fit = cm.fit_additive(cm.bin_cells(bs, m, seconds), bs_probes=[1, 8, 16, 32], m_probes=[1, 64, 128])
    assert fit.table.bs_probes == [1, 8]  # 16 and 32 have no steps under their hats
    assert fit.table.m_probes == [1, 64]
    assert fit.table.alpha_seconds[1] == pytest.approx(TRUE.alpha_seconds[1])


def test_static_steps_alone_cannot_separate_alpha_from_theta():
    bs = np.arange(1, 200)
    m = 7.0 * bs
    cells = cm.bin_cells(bs, m, TRUE.step_seconds(num_reqs=bs, budget=m - bs))
    with pytest.raises(ValueError, match="cannot separate bias, alpha.*static and a compact run"):
        cm.fit_additive(cells, bs_probes=[1, 64, 128, 199], m_probes=[1, 512, 1393])


def test_bad_probe_grids_and_empty_cells_are_rejected():
    cells = cm.bin_cells(np.array([1, 2]), np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"bs_probes must be strictly increasing positive integers, got \[8, 1\]"):
        cm.fit_additive(cells, bs_probes=[8, 1], m_probes=[1, 64])
    with pytest.raises(ValueError, match="no steps to fit"):
        cm.fit_additive(cm.bin_cells(np.array([], int), np.array([]), np.array([])),
                        bs_probes=[1, 8], m_probes=[1, 64])


def test_context_slope_uses_variation_within_cells_only():
    # cell A at 10 ms, cell B at 50 ms: across cells the context differs wildly, within
    # each it moves by 100 tokens and the time by 1 us per token * 100.
    cell = np.array([0, 0, 1, 1])
    x = np.array([0.0, 100, 5000, 5100])
    y = np.array([10e-3, 10.1e-3, 50e-3, 50.1e-3])
    slope, se = cm.context_slope(cell, y, x)
    assert slope == pytest.approx(1e-6)
    assert se == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="never varies within"):
        cm.context_slope(cell, y, np.array([5.0, 5.0, 7.0, 7.0]))


def test_error_summary_by_hand():
    rows = cm.error_summary(np.array([10.0, 20.0, 40.0, np.nan]), np.array([11.0, 18.0, 40.0, 1.0]),
                            np.array(["1-7", "1-7", "8+", "8+"], dtype=object))
    by = {r["bs_bucket"]: r for r in rows}
    assert by["*"]["n"] == 3 and by["*"]["mape"] == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    assert by["*"]["bias_ms"] == pytest.approx((1.0 - 2.0 + 0.0) / 3 * 1e3)
    assert by["1-7"]["mape"] == pytest.approx(0.1) and by["8+"]["n"] == 1


# -- on emulator runs --------------------------------------------------------------------------

def test_fit_recovers_the_emulators_true_table_within_5_percent_per_covered_probe(recovery):
    root, runs = recovery
    report = cm.fit_runs(sql.connect(root), runs)
    t, fit = report.fit.table, report.fit
    assert t.bs_probes == TRUE.bs_probes and t.m_probes == TRUE.m_probes
    assert all(fit.bs_covered) and all(fit.m_covered)  # static bs 256 runs M = 1792: hat(2048) = 0.75
    assert t.bias_seconds == pytest.approx(TRUE.bias_seconds, rel=0.05)
    for name, got, want, covered in (("alpha", t.alpha_seconds, TRUE.alpha_seconds, fit.bs_covered),
                                     ("theta", t.theta_seconds, TRUE.theta_seconds, fit.m_covered)):
        for probe, g, w, c in zip(t.bs_probes if name == "alpha" else t.m_probes, got, want, covered):
            if w == 0:
                assert g == 0.0  # the pinned first probe
            elif c:
                assert g == pytest.approx(w, rel=0.05), (name, probe, g, w)
    # the fitted table predicts every step to the noise level (0.5% lognormal: mean |e| ~ 0.4%)
    assert report.overall_mape("fitted") < 0.006
    # the server planned with k* over M = bs + k*, but the target ran the rounded-up graph tier
    server = [r for r in report.errors[runs[2]] if r["model"] == "server" and r["bs_bucket"] == "*"][0]
    assert server["mape"] > report.overall_mape("fitted") and server["bias_ms"] < 0


def test_exported_json_is_an_sglang_additive_table_and_the_cli_writes_it(recovery, tmp_path):
    root, runs = recovery
    out = tmp_path / "fit.json"
    args = ["costmodel", "--data", str(root), "--out", str(out), "--no-write"]
    for run in runs:
        args += ["--run", run]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Fitted additive table" in result.output and "MAPE" in result.output
    loaded = ct.load(out)
    assert isinstance(loaded, ct.SpsAdditiveCostTable)
    assert set(json.loads(out.read_text())) == {"bias_seconds", "bs_probes", "alpha_seconds", "m_probes",
                                                "theta_seconds"}
    assert loaded == cm.fit_runs(sql.connect(root), runs).fit.table


def test_results_are_stored_per_run_and_readable_through_the_canned_queries(recovery, tmp_path):
    root, runs = recovery
    report = cm.fit_runs(sql.connect(root), runs, timer="step_cpu_ms")
    store = Store(tmp_path)
    cm.write_results(store, report)
    cm.write_results(store, report)  # rewriting replaces, never doubles
    con = sql.connect(tmp_path)
    fit = sql.query(con, "figure_costmodel_fit", {"run_id": runs[0]}).to_pylist()
    assert [r["term"] for r in fit].count("bias") == 1 and len(fit) == 1 + 7 + 7
    errors = sql.query(con, "figure_costmodel_error", {"run_id": runs[1]}).to_pylist()
    assert {r["model"] for r in errors} == {"fitted", "fitted+context", "server"}
    assert {r["timer"] for r in errors} == {"step_cpu_ms"}
    assert errors[0]["bs_bucket"] == "*"
    # step_cpu_ms also counts the 0.4 ms host overhead, which lands in the bias
    assert report.fit.table.bias_seconds == pytest.approx(TRUE.bias_seconds + 0.0004, rel=0.02)
    assert cm.fitted_table_of(con, runs[0]) == report.fit.table


def test_a_context_cost_is_found_and_lowers_the_error(tmp_path):
    runs = _context_runs(tmp_path, 1e-6)
    report = cm.fit_runs(sql.connect(tmp_path), runs, bs_probes=[1, 16], m_probes=[1, 128])
    fc = report.fit_context
    assert fc.context_seconds_per_token == pytest.approx(1e-6, abs=3 * fc.context_stderr)
    assert fc.context_seconds_per_token > 5 * fc.context_stderr
    assert report.overall_mape("fitted+context") < report.overall_mape("fitted")
    assert report.context_helps is True


def test_without_a_context_cost_the_term_does_not_help(tmp_path):
    runs = _context_runs(tmp_path, 0.0)
    report = cm.fit_runs(sql.connect(tmp_path), runs, bs_probes=[1, 16], m_probes=[1, 128])
    fc = report.fit_context
    assert abs(fc.context_seconds_per_token) < 3 * fc.context_stderr
    assert report.context_helps is False


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_bad_inputs_say_what_to_do(recovery, tmp_path):
    root, runs = recovery
    con = sql.connect(root)
    with pytest.raises(ValueError, match=r"no decode steps for run\(s\) \['nope'\].*run_overview"):
        cm.fit_runs(con, [runs[0], "nope"])
    with pytest.raises(ValueError, match="timer 'wall' is not one of step_gpu_ms"):
        cm.fit_runs(con, runs, timer="wall")
    with pytest.raises(ValueError, match="no run given"):
        cm.fit_runs(con, [])
    with pytest.raises(ValueError, match="cannot separate"):
        cm.fit_runs(con, [runs[0]])  # static alone: M = 7 bs
    runner = CliRunner()
    result = runner.invoke(app, ["costmodel", "--data", str(root), "--run", runs[0], "--timer", "wall"])
    assert result.exit_code == 2 and "--timer 'wall' is not one of" in _flat(result.output)
    result = runner.invoke(app, ["costmodel", "--data", str(tmp_path / "missing"), "--run", "r"])
    assert result.exit_code == 2 and "is not a directory; collect a run first" in _flat(result.output)
    result = runner.invoke(app, ["costmodel", "--data", str(root), "--run", runs[0], "--bs-probes", "8,1"])
    assert result.exit_code == 2 and "strictly increasing" in _flat(result.output)
    result = runner.invoke(app, ["costmodel", "--data", str(root), "--run", runs[0]])
    assert result.exit_code == 2 and "--run A --run B" in _flat(result.output)
