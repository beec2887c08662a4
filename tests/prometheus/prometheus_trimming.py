"""A real Prometheus scrapes the sidecar during emulator runs: every panel and alert rule returns data.

Four emulators: ``bare`` (compact, no cost table: ``--sps-table none``),
``eager`` (compact, the built-in table, an under-confident head: it trims
windows that would have been accepted, so its trim regret is high),
``sampled`` (compact, the built-in table, temperature 0.8; its sidecar has
the ceiling fit of an earlier run on the same server, as ``collect
--ceiling-fit`` would) and ``capped`` (cap-accept, for SGLang's block-accept
gauge).  The first three are collected with a sidecar each while Prometheus
scrapes the sidecars and the servers every second with
``examples/prometheus-alerts.yml`` loaded.  Then every PromQL target of
``examples/grafana-dashboard.json`` and every alert rule's expression is
evaluated by that Prometheus and must return data; the health targets, with
``rate(X[w])`` replaced by ``X`` (the whole run), must equal the figures
computed from the store (the sampled live ceiling: ``estimate`` with the same
fit); and the alerts that should be pending are.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from collectors.sglang.driver import DriveSpec
from collectors.sglang.metrics import SidecarMetrics
from collectors.sglang.session import CollectOptions, Collector
from dspark_obs import health, sql
from dspark_obs.emulator.engine import EngineConfig
from dspark_obs.estimators.ceiling import estimate_run
from dspark_obs.estimators.ceiling.fit import CeilingFit
from dspark_obs.emulator.server import BackgroundServer
from dspark_obs.store import Store
from tests.prometheus.conftest import ROOT, Prometheus

DASHBOARD = ROOT / "examples" / "grafana-dashboard.json"
ALERTS = ROOT / "examples" / "prometheus-alerts.yml"
RUNS = {"bare": {"sps_table": None}, "eager": {"head_bias": (-2.0,)}, "sampled": {}}
TEMPERATURE = {"sampled": 0.8}  # its sidecar gets the ceiling fit of an earlier run on the same server


@dataclass
class World:
    prom: Prometheus
    root: Path
    instance: dict[str, str]  # run -> the sidecar's host:port (Prometheus' instance label)
    metrics: dict[str, SidecarMetrics]
    fit: CeilingFit


def _drive(server: BackgroundServer, store: Store, run: str, metrics: SidecarMetrics | None, *,
           requests: int = 48, seed: int = 0) -> None:
    opts = CollectOptions(url=server.url, run_id=run, poll_interval=0.1, flush_interval=0.5, drive=DriveSpec(
        ["gsm8k", "arena-hard", "poetry"], requests, concurrency=8, max_new_tokens=96,
        temperature=TEMPERATURE.get(run.removesuffix("-earlier"), 0.0), seed=seed))
    asyncio.run(Collector(store, opts, metrics=metrics).run())


def _earlier_fit(server: BackgroundServer, store: Store, work: Path) -> CeilingFit:
    """``estimate --fit-out`` of an earlier sampled run of the same deployment, read back from its file."""
    _drive(server, store, "sampled-earlier", None, requests=16, seed=1)
    estimate_run(store, "sampled-earlier", n_bootstrap=0).fit.save(work / "fit.json")
    return CeilingFit.load(work / "fit.json")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("prometheus")
    servers = {run: BackgroundServer(EngineConfig(mode="compact", seed=7, dp_size=2, real_time=1.0, **cfg)).start()
               for run, cfg in RUNS.items()}
    capped = BackgroundServer(EngineConfig(mode="cap-accept", seed=7)).start()
    store = Store(work / "data")
    fit = _earlier_fit(servers["sampled"], store, work)
    metrics = {run: SidecarMetrics(ceiling_fit=fit if run in TEMPERATURE else None) for run in RUNS}
    instance = {run: f"127.0.0.1:{m.serve(0)}" for run, m in metrics.items()}
    prom = Prometheus(work, sidecars=list(instance.values()),
                      servers=[s.url.removeprefix("http://") for s in [*servers.values(), capped]], rules=ALERTS)
    for run, m in metrics.items():
        _scraped_at_zero_before_traffic(m, prom, instance[run])
    try:
        threads = [threading.Thread(target=_drive, args=(servers[run], store, run, metrics[run])) for run in RUNS]
        for t in threads:
            t.start()
        for i in range(8):  # the cap-accept server's gauges need recent steps
            httpx.post(f"{capped.url}/generate", json={"text": f"[gsm8k] q {i}",
                                                       "sampling_params": {"max_new_tokens": 40}}, timeout=60)
        for t in threads:
            t.join()
        _wait_for_final_scrape(prom, instance, metrics)
        yield World(prom, work / "data", instance, metrics, fit)
    finally:
        prom.stop()
        for m in metrics.values():
            m.close()
        for s in [*servers.values(), capped]:
            s.stop()


def _scraped_at_zero_before_traffic(metrics: SidecarMetrics, prom: Prometheus, inst: str) -> None:
    """The sidecar's run start waits until Prometheus holds its zero-valued series.

    A production run is long against the scrape interval; these last a few
    seconds, so without this a fast machine could finish one before its first
    scrape and leave ``rate()`` nothing to see.
    """
    on_run = metrics.health.on_run

    def on_run_then_wait(*args, **kwargs):
        on_run(*args, **kwargs)
        deadline = time.monotonic() + 120
        while not prom.query(f'dspark_obs:request_steps_total{{instance="{inst}"}}'):
            assert time.monotonic() < deadline, f"Prometheus never scraped {inst}'s zero-valued series"
            time.sleep(0.1)

    metrics.health.on_run = on_run_then_wait


def _wait_for_final_scrape(prom: Prometheus, instance: dict, metrics: dict) -> None:
    """Until Prometheus holds each sidecar's final request-step count (a bound so a broken scrape fails)."""
    deadline = time.monotonic() + 120
    want = {run: sum(t["request_steps"] for t in m.health.totals().values()) for run, m in metrics.items()}
    got = {}
    while time.monotonic() < deadline:
        got = {run: sum(float(r["value"][1]) for r in prom.query(
            f'dspark_obs:request_steps_total{{instance="{instance[run]}"}}')) for run in RUNS}
        if got == want and all(want.values()):
            time.sleep(3.0)  # a few more scrapes, so every rate() window holds the end of the runs
            return
        time.sleep(0.25)
    raise AssertionError(f"Prometheus never saw the sidecars' final counts: {got} != {want}")


def _targets() -> list[tuple[str, str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t.get("legendFormat", ""), t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def _for_instance(expr: str, inst: str) -> str:
    return expr.replace('instance=~"$instance"', f'instance="{inst}"')


def test_every_panel_returns_data(world):
    missing = []
    for title, legend, expr in _targets():
        result = world.prom.query(expr.replace('instance=~"$instance"', 'instance=~".*"'))
        if not result:
            missing.append((title, legend, expr))
    assert not missing, missing


def _whole_run(expr: str) -> str:
    """``rate(X[w])`` -> ``X``: the same figure over the whole run, from the counters' totals."""
    return re.sub(r"rate\((dspark_obs:[a-z_]+(?:\{[^}]*\})?)\[[0-9]+[smh]\]\)", r"\1", expr)


def _store_value(frame, pos, legend: str):
    r = health.run_row(frame)
    table = {
        "budget-trimmed share": r["budget_trimmed_share"], "trim regret": r["trim_regret"],
        "cost-table MAPE": r["costtable_mape"], "window sizes": r["window_sizes"],
        "trim ratio (verified / no-trim slots)": r["trim_ratio"],
        "verify_len < gamma + 1 share": r["trimmed_share"], "accepted / drafts verified": r["acceptance"],
        "accepted / full block (spec_accept_rate's denominator)": r["spec_accept_rate"],
        "expected (sum of survival over the window)": r["expected_accepted"] / r["survival_steps"],
        "actual": r["survival_accepted"] / r["survival_steps"], "graph-tier padding share": r["padding_share"],
        "DP ranks rounding up to the largest tier": 0.0,  # the emulator reports no DP tiers
        "server time answering the sidecar (share of wall time)": r["observation_share"],
        "one poll, in mean steps": r["poll_step_ratio"],
        "MAPE (5m)": r["costtable_mape"], "MAPE (1h): drift shows as the 5m line leaving it": r["costtable_mape"],
    }
    if legend in table:
        return table[legend]
    if legend.startswith(("expected k", "actual k")):
        p = pos.set_index("position")
        return {int(k): float(v) for k, v in p["expected" if legend.startswith("expected") else "actual"].items()}
    return None


@pytest.mark.parametrize("run", list(RUNS))
def test_health_panels_agree_with_the_store(world, run):
    con = sql.connect(world.root)
    frame, pos = health.figures(con, runs=[run]), health.by_position(con, runs=[run])
    checked = 0
    for title, legend, expr in _targets():
        if "dspark_obs:" not in expr:
            continue
        want = _store_value(frame, pos, legend)
        if want is None:
            continue
        result = world.prom.query(_whole_run(_for_instance(expr, world.instance[run])))
        assert result, (title, legend)
        if isinstance(want, dict):  # by position
            got = {int(r["metric"]["position"]): float(r["value"][1]) for r in result}
            assert got.keys() == want.keys(), (legend, got, want)
            for k in want:
                assert got[k] == pytest.approx(want[k], rel=1e-6, abs=1e-9), (legend, k)
        else:
            got = float(result[0]["value"][1])
            assert (math.isnan(got) and (want is None or math.isnan(want))) or got == pytest.approx(
                float(want), rel=1e-6, abs=1e-9), (title, legend, got, want)
        checked += 1
    assert checked >= 17
    # and the panels as written (rate over their windows) show the run's figures too
    share = world.prom.query(_for_instance(_targets()[[t[1] for t in _targets()].index("budget-trimmed share")][2],
                                           world.instance[run]))
    assert (float(share[0]["value"][1]) >= 0.05) == (run != "bare")


def _rules() -> list[dict]:
    return [rule for g in yaml.safe_load(ALERTS.read_text())["groups"] for rule in g["rules"]]


def test_every_alert_rule_returns_data_and_the_right_ones_are_pending(world):
    for rule in _rules():
        assert world.prom.query(rule["expr"]), rule["alert"]
    alerts = world.prom.query('ALERTS{alertstate=~"pending|firing"}')
    active = {(a["metric"]["alertname"], a["metric"].get("instance")) for a in alerts}
    bare, eager = world.instance["bare"], world.instance["eager"]
    assert ("DSparkTrimmingInactive", bare) in active and ("DSparkTrimmingInactive", eager) not in active
    assert ("DSparkTrimRegretHigh", eager) in active and ("DSparkTrimRegretHigh", bare) not in active
    # the flat table predicts 1 step per second: its MAPE is enormous; the built-in table is the true one
    assert ("DSparkCostTableMAPEHigh", bare) in active and ("DSparkCostTableMAPEHigh", eager) not in active


def test_gauges_say_trimming_inactive_without_a_table(world):
    for run, want in (("bare", 0.0), ("eager", 1.0)):
        inst = world.instance[run]
        for name in ("trimming_active", "cost_table_loaded"):
            got = world.prom.query(f'dspark_obs:{name}{{instance="{inst}"}}')
            assert float(got[0]["value"][1]) == want, (run, name)


def test_live_ceiling_of_sampled_requests_agrees_with_the_offline_estimate(world):
    """The sampled panel's counters, as Prometheus holds them, equal ``estimate --fit-in`` on the run."""
    inst = world.instance["sampled"]
    rows = estimate_run(Store(world.root), "sampled", n_bootstrap=0, fit=world.fit, write=False).ceiling.to_pandas()
    censored = rows[rows["censored"]]
    got = world.prom.query(f'dspark_obs:ceiling_sampled_request_steps_total{{instance="{inst}"}}')
    assert float(got[0]["value"][1]) == len(censored) > 0
    for key in ("lo", "mid", "hi"):
        got = world.prom.query(f'dspark_obs:tokens_lost_sampled_{key}_total{{instance="{inst}"}}')
        want = float((censored[key] - censored["correct_drafts"]).sum())
        assert float(got[0]["value"][1]) == pytest.approx(want, rel=1e-9), key
    panel = [t for t in _targets() if t[1] == "sampled: tokens lost per accepted draft (mid)"][0][2]
    assert float(world.prom.query(_for_instance(panel, inst))[0]["value"][1]) > 0
