"""The sharded path without Ray: shards by rid hash, partial results that merge, staged files the driver
commits, and the options' errors.  (Ray itself runs in the Ray tier: tests/ray_tier, make test-ray.)"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from dspark_obs.cli import app
from dspark_obs.estimators import calibration as cal
from dspark_obs.estimators import ceiling
from dspark_obs.estimators.chunks import plan_chunks
from dspark_obs.estimators.chunks import dealt_groups, sample_parts, sample_requests, split_chunks
from dspark_obs.store import Store


class InlineEngine:
    """RayEngine's interface, running the tasks here one after the other (as Ray would, elsewhere)."""

    def __init__(self, tasks: int) -> None:
        self.tasks, self.calls = tasks, 0

    def start(self):
        return self

    def parallelism(self) -> int:
        return self.tasks

    def map(self, fn, calls, *, done=None):
        out = []
        for call in calls:
            self.calls += 1
            out.append(fn(*call))
            if done is not None:
                done(out[-1])
        return out


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Store:
    from bench.gen_store import generate

    root = tmp_path_factory.mktemp("shards")
    generate(root, rows=6000, seed=9)
    return Store(root)


def test_tasks_get_contiguous_groups_of_the_local_chunks():
    rids = [f"r{i:03d}" for i in range(200)] + [None]
    counts = np.arange(201) + 1
    chunks = plan_chunks(rids, counts, chunk_rows=1500)
    groups = split_chunks(rids, counts, chunks, 3)
    assert [c for g in groups for c in g] == chunks          # the local path's chunks, in run order
    sizes = [sum(c.rows for c in g) for g in groups]
    assert len(groups) == 3 and max(sizes) - min(sizes) <= 2 * max(c.rows for c in chunks)
    assert all("IN" not in c.where for c in chunks)            # rid ranges, which the Parquet scan applies
    one = plan_chunks(rids[:10], counts[:10], chunk_rows=10_000)
    recut = split_chunks(rids[:10], counts[:10], one, 2)       # one chunk, two tasks: re-cut into ranges
    assert len(one) == 1 and len(recut) == 2
    assert sum(c.rows for g in recut for c in g) == int(counts[:10].sum())
    assert split_chunks(rids, counts, chunks, 1) == [chunks]
    sample = sample_requests(rids, counts, max_rows=4000)      # the fit's parts: a fifth of the run's steps
    parts = sample_parts(rids, counts, sample, part_rows=500)
    shares = split_chunks(rids, counts, parts, 3, recut=False)
    assert [c for g in shares for c in g] == parts and len(shares) == 3   # every worker holds a share of the sample
    assert max(sum(c.rows for c in g) for g in shares) < 0.5 * sample.rows


def test_dealt_tasks_each_get_every_workload():
    """Rids sort by workload name, so contiguous halves of a run are different workloads (of different cost per
    step); chunks dealt in turn give each task the same mix, every chunk once."""
    rids = [f"{w}-{i:04d}" for w in ("arena-hard", "gsm8k", "poetry") for i in range(300)]
    counts = np.full(len(rids), 10)
    chunks = plan_chunks(rids, counts, chunk_rows=200)
    assert len(chunks) % 2 == 1                                                  # 45: they do not divide in two
    dealt = dealt_groups(rids, counts, chunks, 2)
    assert len(dealt) == 2 and len(dealt[0]) == len(dealt[1])
    ranges = [(c.params["chunk_lo"], c.params["chunk_hi"]) for g in dealt for c in g]
    assert all(sum(lo <= r <= hi for lo, hi in ranges) == 1 for r in rids)     # every request once
    shares = [sum(c.rows for c in g) for g in dealt]
    assert sum(shares) == counts.sum() and abs(shares[0] - shares[1]) <= 10      # equal steps, to a request

    def steps_by_workload(group):
        named = {r: n for r, n in zip(rids, counts)}
        out = {}
        for c in group:
            for r in rids:
                if c.params["chunk_lo"] <= r <= c.params["chunk_hi"]:
                    out[r.rsplit("-", 1)[0]] = out.get(r.rsplit("-", 1)[0], 0) + named[r]
        return out

    halves = [steps_by_workload(g) for g in split_chunks(rids, counts, chunks, 2)]
    assert "arena-hard" not in halves[1] and "poetry" not in halves[0]      # contiguous: workloads apart
    for share in (steps_by_workload(g) for g in dealt):
        assert set(share) == {"arena-hard", "gsm8k", "poetry"}
        assert all(abs(n - 1500) <= 200 for n in share.values())             # half of each, within a chunk
    even = plan_chunks(rids, counts, chunk_rows=300)                             # 30 chunks: dealt as they are
    assert len(even) % 2 == 0 and dealt_groups(rids, counts, even, 2) == [even[0::2], even[1::2]]
    assert dealt_groups(rids[:3], counts[:3], plan_chunks(rids[:3], counts[:3], chunk_rows=10_000), 2) == \
        split_chunks(rids[:3], counts[:3], plan_chunks(rids[:3], counts[:3], chunk_rows=10_000), 2)


def test_shards_merged_give_the_one_pass_estimate_and_commit_their_files(generated):
    opts = dict(n_bootstrap=120, seed=1, chunk_rows=1500, fit_rows=2500)
    one = ceiling.estimate_run(generated, "bench", write=False, **opts)
    engine = InlineEngine(tasks=3)
    ceiling.estimate_run(generated, "bench", engine=engine, **opts)
    assert engine.calls == 3
    keys = [(k, "ascending") for k in ("rid", "dp_rank", "forward_ct")]
    written = generated.read("ceiling", "bench").drop_columns(["run_id"])
    assert written.sort_by(keys).to_pylist() == one.table.sort_by(keys).to_pylist()
    for name, local in (("ceiling_summary", one.summary), ("ceiling_validation", one.validation)):
        merged = generated.read(name, "bench").drop_columns(["run_id"]).to_pylist()
        for a, b in zip(local.to_pylist(), merged):
            for col, u in a.items():
                assert b[col] == pytest.approx(u, rel=1e-9) if isinstance(u, float) else b[col] == u, (name, col)
    assert not list((generated.root / "ceiling").glob("*/_staged-*"))   # committed, nothing left staged


def test_shards_merged_give_the_one_pass_calibration(generated):
    ceiling.estimate_run(generated, "bench", n_bootstrap=0)
    for labels in ("observed", "reconstructed"):
        one = cal.calibrate_run(generated, "bench", labels=labels, n_bootstrap=80, seed=2, write=False)
        many = cal.calibrate_run(generated, "bench", labels=labels, n_bootstrap=80, seed=2, write=False,
                                 chunk_rows=1000, engine=InlineEngine(tasks=4))
        for a, b in zip(one.summary.to_pylist(), many.summary.to_pylist()):
            for col, u in a.items():
                if col == "auroc":
                    continue   # one pass ranks every step; the chunked path its (here: whole) sample
                assert b[col] == pytest.approx(u, rel=1e-9, abs=1e-12) if isinstance(u, float) else b[col] == u, col
        assert one.bins.num_rows == many.bins.num_rows


def test_staged_files_are_invisible_until_committed(generated, tmp_path):
    rows = ceiling.estimate_run(generated, "bench", n_bootstrap=0, write=False).table.slice(0, 50)
    store = Store(tmp_path)
    path = store.stage("ceiling", "r", rows, "b1")
    assert path.exists() and store.read("ceiling").num_rows == 0 and store.runs() == []
    store.stage("ceiling", "r", rows, "b2")
    store.discard_staged("ceiling", "r", "b2")     # a failed run: its files go, nothing was visible
    assert store.commit_staged("ceiling", "r", "b1") == 1
    assert store.read("ceiling", "r").num_rows == 50 and not path.exists()
    assert list((tmp_path / "ceiling" / "run_id=r").iterdir()) == [tmp_path / "ceiling" / "run_id=r" / path.name]
    with pytest.raises(ValueError, match="staged batch"):
        store.stage("ceiling", "r", rows, "../escape")


def test_engine_ray_without_ray_says_how_to_get_it(generated, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # as if not installed: `import ray` raises ImportError
    result = CliRunner().invoke(app, ["estimate", "--data", str(generated.root), "--run", "bench", "--engine", "ray"],
                                terminal_width=200)
    assert result.exit_code == 2
    assert "pip install 'dspark-obs[ray]'" in " ".join(result.output.split())


@pytest.mark.parametrize("args, message", [
    (["--engine", "spark"], "--engine 'spark' is not one of local, ray"),
    (["--ray-address", "ray://h:10001"], "--ray-address and --ray-workers need --engine ray"),
    (["--engine", "ray", "--ray-address", "h:6379", "--ray-workers", "2"], "with --ray-address the cluster"),
])
def test_engine_options_are_checked(generated, args, message):
    for command in (["estimate"], ["calibrate", "--labels", "observed"]):
        result = CliRunner().invoke(app, [*command, "--data", str(generated.root), "--run", "bench", *args],
                                    terminal_width=200)
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
