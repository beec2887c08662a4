"""dspark_obs.compare: headline deltas of two runs with bootstrap intervals, and sweeps point by point."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dspark_obs import compare
from dspark_obs.ui import charts


def _requests(run: str, n: int, *, tokens: int, e2e: float, steps: int, ttft: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"run_id": run, "completion_tokens": tokens, "spec_verify_ct": steps,
                         "e2e_latency_s": e2e * rng.uniform(0.9, 1.1, n), "ttft_s": ttft, "concurrency": 4})


def test_identical_runs_have_zero_delta_inside_the_interval():
    a = _requests("a", 200, tokens=100, e2e=2.0, steps=25, ttft=0.01, seed=1)
    out = compare.compare_runs(a, a.assign(run_id="b")).set_index("metric")
    assert np.allclose(out["delta"], 0.0)
    assert (out["delta_ci_low"] <= 0).all() and (out["delta_ci_high"] >= 0).all()
    assert out.loc["accept_length", "baseline"] == 4.0  # 100 tokens / 25 steps


def test_a_faster_candidate_is_a_significant_positive_throughput_delta():
    base = _requests("a", 300, tokens=100, e2e=2.0, steps=25, ttft=0.01, seed=1)
    cand = _requests("b", 300, tokens=100, e2e=1.0, steps=20, ttft=0.01, seed=2)
    out = compare.compare_runs(base, cand).set_index("metric")
    tp = out.loc["throughput_tok_s"]
    # Little's law: 100 tokens / (mean e2e / concurrency 4) ~ 200 vs ~ 400 tok/s
    assert tp["baseline"] == pytest.approx(200, rel=0.03) and tp["candidate"] == pytest.approx(400, rel=0.03)
    assert tp["delta_ci_low"] > 0 and tp["relative"] == pytest.approx(1.0, rel=0.05)
    assert out.loc["accept_length", "delta"] == pytest.approx(1.0)  # 5.0 - 4.0
    assert out.loc["e2e_p50_s", "delta_ci_high"] < 0 and out.loc["e2e_p50_s", "better"] == "lower"
    fig = charts.compare_deltas(out.reset_index(), clock="virtual clock")
    assert "virtual clock" in fig.layout.title.text and "virtual clock" in fig.layout.xaxis.title.text
    colours = dict(zip(fig.data[0].y, fig.data[0].marker.color))
    assert colours["total throughput (tok/s)"] == colours["end-to-end p50 (s)"] == "#2E7D32"  # both improvements
    assert colours["TTFT p50 (s)"] == "#8A8A8A"  # no change


def test_missing_figures_are_nan_not_errors():
    base = _requests("a", 50, tokens=10, e2e=1.0, steps=0, ttft=np.nan, seed=1)
    out = compare.compare_runs(base, base).set_index("metric")
    assert np.isnan(out.loc["accept_length", "baseline"]) and np.isnan(out.loc["ttft_p50_s", "delta"])
    assert out.loc["accept_length", "n_baseline"] == 0
    with pytest.raises(ValueError, match="n_bootstrap must be >= 10"):
        compare.compare_runs(base, base, n_bootstrap=5)


def test_sweeps_compare_the_points_both_have():
    points = pd.DataFrame({"sweep_id": ["s1", "s1", "s2"], "method": "compact", "workload": "w",
                           "concurrency": [1, 8, 8], "run_id": ["s1-1", "s1-8", "s2-8"]})
    reqs = pd.concat([_requests("s1-8", 80, tokens=50, e2e=1.0, steps=10, ttft=0.01, seed=1),
                      _requests("s2-8", 80, tokens=50, e2e=0.5, steps=10, ttft=0.01, seed=2)])
    out = compare.compare_sweeps(points, reqs, "s1", "s2", n_bootstrap=50)
    assert set(out["concurrency"]) == {8} and set(out["metric"]) == {"throughput_tok_s", "per_user_tok_s"}
    row = out[out["metric"] == "throughput_tok_s"].iloc[0]
    assert (row["baseline_run"], row["candidate_run"]) == ("s1-8", "s2-8") and row["delta_ci_low"] > 0
