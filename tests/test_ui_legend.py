"""Legends name only what a reader can see: the chart builders' tidy_legend, on hand-made frames.

Each case is one way a series used to stay in the legend while hidden: bars of height
zero, a key for a style nothing draws, a series drawn exactly under another, and two
keys that look the same.  ``legend_checks.legend_problems`` (written apart from the fix)
judges every figure; tests/test_ui_app.py runs it over every chart of every page.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dspark_obs.ui import charts
from legend_checks import legend_problems


def _entries(fig) -> list[str]:
    return [t.name for t in fig.data if t.showlegend is not False and t.visible is not False and t.name]


def test_a_category_of_zero_share_everywhere_has_no_legend_entry():
    df = pd.DataFrame({"run_id": "c", "workload": ["gsm8k", "gsm8k", "poetry", "poetry"],
                       "category": ["exact_in_window", "censored_eos"] * 2, "request_steps": [10, 0, 8, 0],
                       "share": [1.0, 0.0, 1.0, 0.0]})
    fig = charts.estimate_categories(df)
    assert "censored_eos" not in _entries(fig) and "exact_in_window" in _entries(fig)
    assert legend_problems(fig) == []


def test_two_runs_with_the_same_budget_line_share_one_legend_entry_naming_both():
    df = pd.DataFrame({"run_id": ["a", "a", "b", "b"], "mode": "compact", "forward_ct": [0, 10, 0, 10],
                       "mean_budget": [20.0, 30.0, 20.0, 30.0], "mean_bs": [4.0, 6.0, 4.0, 6.0]})
    fig = charts.budget_timeline(df)
    assert _entries(fig) == ["b (compact) (= a (compact), drawn under it)"]
    assert legend_problems(fig) == []
    df.loc[df["run_id"] == "b", "mean_bs"] = [5.0, 7.0]  # the batch panel tells them apart: both stay
    fig = charts.budget_timeline(df)
    assert _entries(fig) == ["a (compact)", "b (compact)"]


def test_a_key_for_a_line_style_nothing_draws_is_dropped():
    rows = dict(workload="gsm8k", position=[1, 2], committed_share=[0.8, 0.6], full_block_lo=np.nan,
                full_block_hi=np.nan)
    df = pd.concat([
        pd.DataFrame({"run_id": "c", "mode": "compact", "full_block_share": [0.85, 0.7], "source": "estimate",
                      **rows}).assign(full_block_lo=[0.84, 0.65], full_block_hi=[0.9, 0.8]),
        pd.DataFrame({"run_id": "s", "mode": "static", "full_block_share": np.nan, "source": "exact", **rows})])
    fig = charts.acceptance_by_position(df)
    names = _entries(fig)
    assert "full block, estimate ([lo, hi] band): compact" in names and "committed" in names
    assert not any(n.startswith("full block, exact") for n in names)  # the static run's full block has no point
    assert legend_problems(fig) == []


def _latency(p90: list[float], p99: list[float]) -> pd.DataFrame:
    row = {f"{k}_p{q}_s": 0.1 * q for k in ("ttft", "itl", "e2e") for q in (50, 90, 99)}
    df = pd.DataFrame([{"run_id": r, "clock": "virtual", "workload": "*", **row} for r in ("a", "b")])
    df["ttft_p90_s"], df["ttft_p99_s"] = p90, p99
    return df


def test_a_percentile_hidden_in_one_panel_keeps_its_entry_and_one_hidden_in_all_loses_it():
    fig = charts.latency_percentiles(_latency([1.0, 2.0], [1.0, 2.0]))  # p90 == p99 for TTFT only
    assert _entries(fig) == ["p50", "p90", "p99"] and legend_problems(fig) == []
    everywhere = _latency([1.0, 2.0], [1.0, 2.0])
    for k in ("itl", "e2e"):
        everywhere[f"{k}_p99_s"] = everywhere[f"{k}_p90_s"]
    fig = charts.latency_percentiles(everywhere)
    assert _entries(fig) == ["p50", "p99 (= p90, drawn under it)"] and legend_problems(fig) == []


def test_two_runs_of_one_mode_share_one_pattern_key():
    df = pd.DataFrame({"run_id": ["a", "b"], "mode": "compact", "workload": "gsm8k", "mean_acc_len": [4.0, 4.5],
                       "ceiling_len": [4.2, 4.6], "ceiling_len_lo": [4.1, 4.5], "ceiling_len_hi": [4.4, 4.8],
                       "ceiling_source": "estimate", "utilisation": [0.95, 0.97]})
    fig = charts.accept_vs_ceiling(df)
    assert "accepted: a (compact); accepted: b (compact)" in _entries(fig)
    assert legend_problems(fig) == []


def test_the_check_itself_sees_each_kind_of_problem():
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_bar(x=["a"], y=[0.0], name="zero")
    fig.add_scatter(x=[1, 2], y=[3, 4], name="under", mode="lines", line_color="red")
    fig.add_scatter(x=[1, 2], y=[3, 4], name="over", mode="lines", line_color="blue")
    fig.add_scatter(x=[None], y=[None], name="diamond 1", mode="markers", marker=dict(symbol="diamond", color="#111"))
    fig.add_scatter(x=[None], y=[None], name="diamond 2", mode="markers", marker=dict(symbol="diamond", color="#111"))
    found = " | ".join(legend_problems(fig))
    assert "'zero': its series draws nothing" in found and "'under': drawn exactly under 'over'" in found
    assert "'diamond 1' and 'diamond 2' look the same" in found
