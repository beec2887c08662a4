"""``--jobs N``: the run's shards on worker processes give the tables of one process (per-step rows exactly,
summaries and bootstrap CIs to the order of float additions), and the options check each other."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dspark_obs.cli import app
from dspark_obs.estimators import calibration as cal
from dspark_obs.estimators import ceiling
from dspark_obs.process_engine import ProcessEngine, default_jobs
from dspark_obs.store import Store

STEP_KEYS = [(k, "ascending") for k in ("rid", "dp_rank", "forward_ct")]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Store:
    from bench.gen_store import generate

    root = tmp_path_factory.mktemp("jobs")
    generate(root, rows=6000, seed=4)
    return Store(root)


@pytest.fixture(scope="module")
def pool():
    engine = ProcessEngine(2, preload=("dspark_obs.estimators.ceiling.ray",)).start()
    yield engine
    engine.close()


def _same_rows(a, b, keys, what: str) -> None:
    a, b = a.sort_by(keys).to_pylist(), b.sort_by(keys).to_pylist()
    assert len(a) == len(b) > 0, what
    for x, y in zip(a, b):
        for col, u in x.items():
            assert y[col] == pytest.approx(u, rel=1e-9, nan_ok=True) if isinstance(u, float) else y[col] == u, (what, col)


def test_the_pool_maps_in_call_order_on_other_processes(pool):
    seen = []
    out = pool.map(os.getpid, [()] * 4, done=seen.append)
    assert len(out) == 4 and sorted(seen) == sorted(out) and os.getpid() not in out
    assert pool.parallelism() == 2 and default_jobs() >= 1


def _set_warmed() -> None:
    os.environ["DSPARK_OBS_TEST_WARMED"] = str(os.getpid())


def _warmed() -> str | None:
    return os.environ.get("DSPARK_OBS_TEST_WARMED")


def _fail_to_warm() -> None:
    raise RuntimeError("a warm-up that fails")


def test_workers_warm_up_before_their_first_call_and_a_failed_warm_up_is_dropped():
    """The warm-ups' replies are not taken for a call's, whether the first call is a pool's or a map's."""
    for first in ("apply", "map"):
        engine = ProcessEngine(2, warm=(f"{__name__}:_fail_to_warm", f"{__name__}:_set_warmed")).start()
        try:
            if first == "apply":
                pids = engine.pool().apply(_state_pid)
            else:
                pids = engine.map(os.getpid, [()] * 2)
            assert len(set(pids)) == 2 and os.getpid() not in pids
            assert set(engine.map(_warmed, [()] * 6)) <= {str(p) for p in pids}
        finally:
            engine.close()
    assert _warmed() is None   # they ran in the workers, not here


def _state_pid(state) -> int:
    return os.getpid()


@pytest.mark.parametrize("chunk_rows", [1600, 1500])   # 4 chunks dealt as they are; 5, re-cut into 6 equal ones
def test_two_processes_give_the_one_process_estimate(generated, pool, chunk_rows):
    opts = dict(n_bootstrap=150, seed=3, chunk_rows=chunk_rows, fit_rows=2500, write=False)
    one = ceiling.estimate_run(generated, "bench", **opts)
    two = ceiling.estimate_run(generated, "bench", engine=pool, **opts)
    assert one.truth_source == two.truth_source == "emulator"
    _same_rows(one.table, two.table, STEP_KEYS, "ceiling")
    _same_rows(one.summary, two.summary, [("workload", "ascending")], "ceiling_summary")
    _same_rows(one.validation, two.validation, [("group_kind", "ascending"), ("group", "ascending")],
               "ceiling_validation")
    assert one.sampling_counts == two.sampling_counts


def test_two_processes_give_the_one_process_calibration(generated, pool):
    ceiling.estimate_run(generated, "bench", n_bootstrap=0, chunk_rows=1500, fit_rows=2500)
    keys = [(k, "ascending") for k in ("workload", "position", "binning")]
    for labels in ("observed", "reconstructed"):
        kw = dict(labels=labels, n_bootstrap=80, seed=2, write=False, chunk_rows=1500, sample_rows=3000)
        one = cal.calibrate_run(generated, "bench", **kw)
        two = cal.calibrate_run(generated, "bench", engine=pool, **kw)
        _same_rows(one.summary, two.summary, keys, f"calibration {labels}")
        _same_rows(one.bins, two.bins, keys + [("bin", "ascending")], f"calibration_bins {labels}")
        assert one.notes == two.notes


def test_a_run_of_one_chunk_stays_in_this_process(generated):
    class Refusing(ProcessEngine):
        def map(self, *a, **k):
            raise AssertionError("a one-chunk run was sent to the pool")

    engine = Refusing(2)   # never started: nothing forked
    one = ceiling.estimate_run(generated, "bench", n_bootstrap=50, write=False)
    same = ceiling.estimate_run(generated, "bench", n_bootstrap=50, write=False, engine=engine)
    assert one.table.to_pylist() == same.table.to_pylist() and one.summary.equals(same.summary)
    assert cal.calibrate_run(generated, "bench", n_bootstrap=20, write=False,
                             engine=engine).summary.equals(cal.calibrate_run(generated, "bench", n_bootstrap=20,
                                                                            write=False).summary)


def test_jobs_is_for_the_local_engine():
    result = CliRunner().invoke(app, ["estimate", "--data", ".", "--engine", "ray", "--jobs", "2"])
    assert result.exit_code != 0 and "--jobs sizes the local engine" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["calibrate", "--data", ".", "--run", "x", "--jobs", "0"])
    assert result.exit_code != 0


def test_a_command_s_workers_fork_with_its_modules_loaded(tmp_path):
    """A process that imported DuckDB but opened no database forks its workers (they start with the modules
    loaded); one that opened a database spawns them (a forked child would inherit its threads)."""
    import subprocess
    import sys

    script = ("from dspark_obs import sql\n"
              "from dspark_obs.process_engine import ProcessEngine\n"
              "e = ProcessEngine(2, preload=('dspark_obs.estimators.ceiling.ray',)).start(); print(e.start_method)\n"
              "e.close(); sql.connect(sys.argv[1])\n"
              "e = ProcessEngine(2).start(); print(e.start_method); e.close()\n")
    out = subprocess.run([sys.executable, "-c", "import sys\n" + script, str(tmp_path)], capture_output=True,
                         text=True, check=True, cwd=str(Path(__file__).resolve().parents[1])).stdout.split()
    assert out == ["fork", "spawn"]


def test_one_job_is_one_core(generated, monkeypatch):
    """``--jobs 1`` runs in this process on one thread (DuckDB, BLAS, Arrow), as each of N workers does: N jobs,
    N cores; the command's end gives the caller its threads back."""
    import duckdb
    import pyarrow as pa
    from threadpoolctl import threadpool_info

    from dspark_obs import sql
    from dspark_obs.engine_options import engine_for

    def blas() -> list:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    arrow, blas_threads = pa.cpu_count(), blas()

    def threads() -> int:
        return sql.connect(generated.root).sql("SELECT current_setting('threads')").fetchall()[0][0]

    monkeypatch.setattr(sql, "WORKER_THREADS", None)
    assert threads() == duckdb.connect().sql("SELECT current_setting('threads')").fetchall()[0][0]
    result = CliRunner().invoke(app, ["estimate", "--data", str(generated.root), "--run", "bench", "--jobs", "1",
                                      "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    assert sql.WORKER_THREADS is None and pa.cpu_count() == arrow and blas() == blas_threads
    assert engine_for("local", None, None, 1) is None
    try:
        assert threads() == 1 and pa.cpu_count() == 1 and set(blas()) <= {1}
    finally:
        pa.set_cpu_count(arrow)
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=blas_threads[0] if blas_threads else None, user_api="blas")


def test_the_command_s_workers_end_with_it(generated):
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    result = CliRunner().invoke(app, ["calibrate", "--data", str(generated.root), "--run", "bench", "--labels",
                                      "observed", "--bootstrap", "0", "--jobs", "2"])
    assert result.exit_code == 0, result.output
    assert {p.pid for p in multiprocessing.active_children()} <= before


def test_workers_start_whatever_the_callers_main_module_is(monkeypatch):
    """A caller whose __main__ is a script that cannot run again (Streamlit's AppTest puts the page there):
    spawned workers must not re-run it, or they die before their first task."""
    import sys
    import types

    import duckdb  # noqa: F401  (loaded: the pool spawns rather than forks)

    script = types.ModuleType("__main__")
    script.__file__ = "/nonexistent/page_script.py"
    monkeypatch.setitem(sys.modules, "__main__", script)
    engine = ProcessEngine(2).start()
    try:
        assert engine.map(pow, [(2, 3), (3, 2)]) == [8, 9]
    finally:
        engine.close()
    assert sys.modules["__main__"] is script


def _remember(value):
    return {"pid": os.getpid(), "value": value}


def _recall(state, extra):
    return state["pid"], state["value"] + extra


def _fail(message):
    raise KeyError(message)


def test_a_pool_s_workers_keep_what_they_loaded(pool):
    """The ceiling's fit holds its sample's parts on the workers: worker i keeps load's call i."""
    workers = pool.pool()
    try:
        workers.load(_remember, [(10,), (20,)])
        got = workers.apply(_recall, 1)
        assert [v for _, v in got] == [11, 21]
        assert len({pid for pid, _ in got}) == 2 and os.getpid() not in {pid for pid, _ in got}
        with pytest.raises(ValueError, match="one per worker"):
            workers.load(_remember, [(1,)])
    finally:
        workers.close()


def test_a_task_s_error_comes_back_with_its_traceback_and_the_workers_go_on(pool):
    with pytest.raises(KeyError, match="no such chunk") as err:
        pool.map(_fail, [("no such chunk",), ("no such chunk",), ("no such chunk",)])
    assert any("in worker process" in note and "_fail" in note for note in getattr(err.value, "__notes__", []))
    assert pool.map(pow, [(2, 5), (3, 3), (5, 1)]) == [32, 27, 5]


def test_a_worker_that_dies_is_an_error_that_says_so():
    engine = ProcessEngine(2).start()
    try:
        with pytest.raises(ChildProcessError, match="died"):
            engine.map(os._exit, [(3,)])
    finally:
        engine.close()
