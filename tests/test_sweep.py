"""dspark-obs sweep (dspark_obs.sweep): the run set, the emulator's methods, and the trimming mechanism.

The mechanism test runs a real (small) sweep on the embedded emulator: compact
and no-trim at concurrency 1, 16, 64 and 128 on gsm8k (drafts easy) and poetry
(drafts hard), each point collected as its own run, and checks the write-up's
Fig. 3 claim on what was collected: at batch 1 compact matches no-trim; as the
batch grows compact pulls ahead, earlier and further on the low-acceptance workload.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dspark_obs import sql, sweep
from dspark_obs.emulator.engine import Engine, EngineConfig, GenerateRequest
from dspark_obs.store import Store
from dspark_obs.ui import charts

CONCURRENCY = (1, 16, 64, 128)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    opts = sweep.SweepOptions.quick("t", methods=("compact", "no-trim"), concurrency=CONCURRENCY)
    run_ids = sweep.run_sweep(Store(root), opts)
    return root, run_ids


def _points(root) -> pd.DataFrame:
    return sql.query(sql.connect(root), "sweep_points").to_pandas()


def test_each_point_is_its_own_run_with_sweep_method_concurrency_and_clock(swept):
    root, run_ids = swept
    assert len(run_ids) == 2 * 2 * len(CONCURRENCY) and len(set(run_ids)) == len(run_ids)
    runs = sql.connect(root).execute(
        "SELECT run_id, sweep_id, method, concurrency, clock, mode FROM runs ORDER BY run_id").df()
    assert set(runs["run_id"]) == set(run_ids)
    assert set(runs["sweep_id"]) == {"t"} and set(runs["clock"]) == {"virtual"}
    assert set(runs["mode"]) == {"compact"}  # no-trim is compact's ragged path with the budget forced whole
    assert sorted(set(runs["concurrency"])) == list(CONCURRENCY)
    row = runs[runs["run_id"] == "t-no-trim-poetry-c016"].iloc[0]
    assert (row["method"], row["concurrency"]) == ("no-trim", 16)


def test_no_trim_verifies_every_block_whole_and_the_batch_is_the_concurrency(swept):
    root, _ = swept
    con = sql.connect(root)
    full = con.execute("""SELECT r.method, avg((s.verify_len = 7)::INT) AS share FROM step_reqs s
                          JOIN runs r USING (run_id) GROUP BY 1""").df().set_index("method")["share"]
    assert full["no-trim"] == 1.0 and full["compact"] < 0.7, full  # gamma 6 + the anchor, every step
    points = _points(root).set_index("run_id")
    # lockstep: the decode batch is the driver's concurrency (less the drain at the end of a point)
    assert points.loc["t-compact-gsm8k-c128", "mean_batch"] > 0.8 * 128
    assert points.loc["t-compact-gsm8k-c001", "mean_batch"] == 1.0


def test_compact_pulls_ahead_of_no_trim_as_the_batch_grows_more_for_low_acceptance(swept):
    gap = charts.trim_gap_frame(_points(swept[0])).pivot(index="concurrency", columns="workload", values="gap")
    assert list(gap.index) == list(CONCURRENCY)
    # batch 1: verified tokens are nearly free, so trimming neither gains nor loses much
    assert (gap.loc[1].abs() < 0.05).all(), gap
    for workload in ("gsm8k", "poetry"):
        g = gap[workload]
        assert g.loc[128] > g.loc[64] > 0, gap  # positive and growing at high concurrency
        assert g.loc[128] > g.loc[1] + 0.05, gap
    assert gap.loc[128, "poetry"] > gap.loc[128, "gsm8k"] + 0.1, gap  # larger where drafts are hard
    assert gap.loc[16, "poetry"] > gap.loc[16, "gsm8k"], gap  # and earlier


def test_fig1_and_fig3_are_curves_on_the_virtual_clock(swept):
    points = _points(swept[0])
    fig1 = charts.sweep_throughput(points)
    curves = [t for t in fig1.data if t.x is not None and len(t.x)]
    assert len(curves) == 2 * 2 and all(len(t.x) == len(CONCURRENCY) for t in curves)  # method x workload
    assert all("virtual clock" in v for v in charts.base.axis_titles(fig1).values())
    fig3 = charts.trim_gap_by_batch(charts.trim_gap_frame(points))
    assert [t.name for t in fig3.data] == ["gsm8k", "poetry"]
    assert list(fig3.layout.xaxis.tickvals) == list(CONCURRENCY) and "virtual clock" in fig3.layout.yaxis.title.text


def test_trim_gap_frame_hand_computed():
    rows = [{"sweep_id": "s", "method": m, "workload": "w", "concurrency": c, "clock": "virtual",
             "per_user_tok_s": 1.0, "throughput_tok_s": tp}
            for m, c, tp in (("compact", 1, 99.0), ("no-trim", 1, 100.0), ("compact", 8, 150.0),
                             ("no-trim", 8, 100.0), ("no-spec", 8, 70.0), ("compact", 64, 10.0))]
    out = charts.trim_gap_frame(pd.DataFrame(rows))
    assert list(out["concurrency"]) == [1, 8]  # 64 has no no-trim point
    assert np.allclose(out["gap"], [-0.01, 0.5])
    assert charts.trim_gap_frame(pd.DataFrame(rows[:1])).empty


def test_sweep_options_refuse_what_cannot_run():
    with pytest.raises(sweep.SweepError, match=r"methods \['mtp'\] are not among no-spec"):
        sweep.SweepOptions("s", methods=("compact", "mtp"))
    with pytest.raises(sweep.SweepError, match="concurrency must be integers >= 1"):
        sweep.SweepOptions("s", concurrency=(0, 4))
    with pytest.raises(sweep.SweepError, match="no-spec on a real server needs a server without DSpark"):
        sweep.SweepOptions("s", url="http://127.0.0.1:1")
    quick = sweep.SweepOptions.quick("s")
    assert len(quick.concurrency) >= 6 and len(quick.methods) == 4 and len(quick.workloads) == 2
    assert len(sweep.points(quick)) == 6 * 4 * 2
    assert sweep.SweepPoint("compact", "gsm8k", 4).run_id("s") == "s-compact-gsm8k-c004"
    assert quick.requests_at(1) == 8 and quick.requests_at(64) == 128


def _finish_all(cfg: EngineConfig, n: int = 6) -> list[dict]:
    eng = Engine(cfg)
    futs = [eng.submit(GenerateRequest(rid=f"poetry-{i}", text=f"[poetry] r {i}", temperature=0.7,
                                       max_new_tokens=40, sampling_seed=i)) for i in range(n)]
    eng.run_until_idle()
    return [f.result() for f in futs], eng


def test_no_speculation_commits_one_token_per_step_and_keeps_no_records():
    results, eng = _finish_all(EngineConfig(mode="compact", speculative=False))
    spec, _ = _finish_all(EngineConfig(mode="compact"))
    assert [r["output_ids"] for r in results] == [r["output_ids"] for r in spec]  # same tokens, position-indexed
    assert all("spec_verify_ct" not in r["meta_info"] for r in results)
    payload = eng.dump()[0]
    assert payload is None or not payload["records"]
    assert eng.ranks[0].forward_ct >= 40  # one decode step per token (plus the prefill)
    slower = sum(r["meta_info"]["e2e_latency"] for r in results)
    assert slower > sum(r["meta_info"]["e2e_latency"] for r in spec)
    assert all(0 < r["meta_info"]["emu_first_token_latency"] <= r["meta_info"]["e2e_latency"] for r in results)


def test_force_budget_frac_is_checked_and_forces_whole_blocks():
    with pytest.raises(ValueError, match=r"force_budget_frac must be in \(0, 1\] or null, got 1.5"):
        EngineConfig(force_budget_frac=1.5)
    _, eng = _finish_all(EngineConfig(mode="compact", force_budget_frac=1.0))
    lens = {r["verify_len"] for rec in eng.dump()[0]["records"] for r in rec["reqs"]}
    assert lens == {7}


def test_set_internal_state_takes_the_forced_budget(tmp_path):
    import httpx

    from dspark_obs.emulator.server import BackgroundServer

    with BackgroundServer(EngineConfig(mode="compact")) as server:
        def post(args):
            return httpx.post(f"{server.url}/set_internal_state", json={"server_args": args}, timeout=10)

        assert post({"dspark_force_budget_frac": 1.0}).json() == {"updated": True}
        assert server.emulator.engine.cfg.force_budget_frac == 1.0
        bad = post({"dspark_force_budget_frac": 0})
        assert bad.status_code == 400 and "(0, 1]" in bad.json()["error"]
        assert post({"dspark_force_budget_frac": None}).json() == {"updated": True}
        assert server.emulator.engine.cfg.force_budget_frac is None
        assert httpx.get(f"{server.url}/server_info", timeout=10).json()["emulator_clock"] == "virtual"


def test_the_report_draws_fig1_and_fig3_of_the_newest_sweep(swept):
    from dspark_obs.report.plots import newest_sweep, sweep_charts

    points = _points(swept[0])
    older = points.assign(sweep_id="older", started_at=points["started_at"] - pd.Timedelta(days=1))
    newest = newest_sweep(pd.concat([older, points], ignore_index=True))
    assert set(newest["sweep_id"]) == {"t"}
    got = sweep_charts(newest)
    assert [c.section for c in got] == ["throughput", "throughput"]
    assert got[0].title.startswith("Total throughput vs per-user speed") and "virtual clock" in got[0].title
    assert got[1].title.startswith("Compact vs no-trim across batch size")
    assert sweep_charts(points.iloc[:0]) == []


def test_sweep_command_refuses_bad_options_before_running(tmp_path):
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["sweep", "--out", str(tmp_path / "d"), "--concurrency", "0,4"])
    assert bad.exit_code == 2 and "integers >= 1" in " ".join(bad.output.split())
    bad = runner.invoke(app, ["sweep", "--out", str(tmp_path / "d"), "--method", "compact,mtp"])
    assert bad.exit_code != 0 and "not among" in " ".join(bad.output.split())
    assert not (tmp_path / "d").exists()


def test_a_real_server_sweep_drives_each_method_on_its_own_server(tmp_path, emulator):
    """Two HTTP servers launched for two methods (compact; static for fixed-window), one --server each."""
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    compact, static = emulator(mode="compact", seed=0), emulator(mode="static", seed=0)
    out = tmp_path / "d"
    res = CliRunner().invoke(app, [
        "sweep", "--out", str(out), "--sweep-id", "real", "--quick", "--concurrency", "1,4", "--workload", "gsm8k",
        "--max-new-tokens", "24", "--server", f"compact={compact.url}", "--server", f"fixed-window={static.url}"])
    assert res.exit_code == 0, res.output
    runs = sql.query(sql.connect(out), "SELECT run_id, sweep_id, method, concurrency, mode, server_url FROM runs "
                                       "ORDER BY run_id").to_pandas()
    assert list(runs["run_id"]) == ["real-compact-gsm8k-c001", "real-compact-gsm8k-c004",
                                    "real-fixed-window-gsm8k-c001", "real-fixed-window-gsm8k-c004"]
    assert set(runs["sweep_id"]) == {"real"} and list(runs["concurrency"]) == [1, 4, 1, 4]
    by_method = runs.groupby("method").agg({"server_url": set, "mode": set})
    assert by_method.loc["compact", "server_url"] == {compact.url} and by_method.loc["compact", "mode"] == {"compact"}
    assert by_method.loc["fixed-window", "server_url"] == {static.url}
    assert by_method.loc["fixed-window", "mode"] == {"static"}
    served = sql.query(sql.connect(out), "SELECT run_id, count(*) AS n FROM requests GROUP BY 1").to_pandas()
    assert len(served) == 4 and (served["n"] == 8).all()  # quick: max(8, 2 x concurrency) requests per point


def test_a_real_server_sweep_refuses_a_method_without_its_server_or_on_the_wrong_one(tmp_path, emulator):
    from typer.testing import CliRunner

    from dspark_obs.cli import app

    runner = CliRunner()
    static = emulator(mode="static", seed=0)
    base = ["sweep", "--out", str(tmp_path / "d"), "--quick", "--concurrency", "1", "--workload", "gsm8k"]
    bad = runner.invoke(app, [*base, "--method", "compact,fixed-window", "--server", f"fixed-window={static.url}"])
    assert bad.exit_code == 2 and "no server for method compact" in " ".join(bad.output.split())
    bad = runner.invoke(app, [*base, "--server", "compact"])
    assert bad.exit_code == 2 and "METHOD=URL" in " ".join(bad.output.split())
    bad = runner.invoke(app, [*base, "--server", f"compact={static.url}"])  # a static server is not compact
    assert bad.exit_code == 1 and "method compact needs compact" in " ".join(bad.output.split())
