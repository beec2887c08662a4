"""``--engine ray`` gives the local path's tables: per-step rows exactly, summaries and bootstrap CIs to
the order of float additions, on the demo store and a generated 1M-request-step store, on a directory and
on S3."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.fs as pafs
import pytest
from typer.testing import CliRunner

from dspark_obs import sql
from dspark_obs.cli import app
from dspark_obs.estimators import calibration as cal
from dspark_obs.estimators import ceiling
from dspark_obs.store import Store
from tests.ray_tier.conftest import INPUTS, assert_rows_match, inputs_copy, upload

STEP_KEYS = ["rid", "dp_rank", "forward_ct"]
CAL_KEYS = ["labels", "workload", "position", "binning"]
BIN_KEYS = CAL_KEYS + ["bin"]


def _compare_estimates(local, remote, what: str) -> None:
    assert_rows_match(local.table, remote.table, keys=STEP_KEYS, rtol=0.0, what=f"{what} ceiling")
    assert_rows_match(local.summary, remote.summary, keys=["workload"], what=f"{what} ceiling_summary")
    assert (local.validation is None) == (remote.validation is None)
    if local.validation is not None:
        assert_rows_match(local.validation, remote.validation, keys=["group_kind", "group"],
                          what=f"{what} ceiling_validation")
    assert local.sampling_counts == remote.sampling_counts and local.truth_source == remote.truth_source


def test_estimate_on_ray_equals_local_on_the_demo_store(demo_store, ray_engine):
    run = "demo-compact-s0"
    local = ceiling.estimate_run(demo_store, run, n_bootstrap=300, seed=11, write=False)
    remote = ceiling.estimate_run(demo_store, run, n_bootstrap=300, seed=11, write=False, engine=ray_engine)
    assert local.truth_source == "companion" and local.summary.column("n_bootstrap")[0].as_py() == 300
    _compare_estimates(local, remote, "demo")
    ci = local.summary.to_pylist()[0]
    assert ci["mean_acc_len_ci95_low"] < ci["mean_acc_len"] < ci["mean_acc_len_ci95_high"]


def test_calibrate_on_ray_equals_local_on_the_demo_store(demo_store, ray_engine):
    run = "demo-compact-s0"
    for labels in ("observed", "reconstructed", "companion"):
        local = cal.calibrate_run(demo_store, run, labels=labels, n_bootstrap=200, seed=5, write=False)
        remote = cal.calibrate_run(demo_store, run, labels=labels, n_bootstrap=200, seed=5, write=False,
                                   engine=ray_engine)
        assert local.summary.num_rows > 0 and local.summary.column("ece_ci_lo").null_count < local.summary.num_rows
        assert_rows_match(local.summary, remote.summary, keys=CAL_KEYS, what=f"calibration {labels}")
        assert_rows_match(local.bins, remote.bins, keys=BIN_KEYS, what=f"calibration_bins {labels}")
        assert local.notes == remote.notes


RESULTS = (("ceiling", STEP_KEYS), ("ceiling_summary", ["workload"]), ("ceiling_validation", ["group_kind", "group"]),
           ("calibration", CAL_KEYS), ("calibration_bins", BIN_KEYS))


def _cli(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output


def _commands(data: str, run: str, engine: list[str], *, labels=("observed", "reconstructed")) -> None:
    """What a nightly job runs on one run: estimate, then calibrate (reconstructed labels read the ceiling)."""
    _cli("estimate", "--data", data, "--run", run, "--bootstrap", "100", "--seed", "4", *engine)
    for label in labels:
        _cli("calibrate", "--data", data, "--run", run, "--labels", label, "--bootstrap", "100", "--seed", "7",
             *engine)


def _assert_results_match(here, there, run: str, what: str, *, labels=None) -> None:
    """Every result table of ``run``: the local store's against the Ray run's (per-step rows exactly;
    calibration rows of ``labels`` only, when given)."""
    for table, keys in RESULTS:
        local = here.read(table, run)
        if labels is not None and "labels" in local.column_names:
            local = local.filter(pa.compute.is_in(local.column("labels"), pa.array(list(labels))))
        assert local.num_rows > 0, f"{what}: no {table} rows locally"
        assert_rows_match(local, there.read(table, run), keys=keys, rtol=0.0 if table == "ceiling" else 1e-9,
                          what=f"{what} {table}")
    summary = here.read("ceiling_summary", run).to_pylist()
    assert all(r["n_bootstrap"] == 100 and r["mean_acc_len_ci95_low"] < r["mean_acc_len_ci95_high"] for r in summary)


@pytest.fixture(scope="session")
def generated_local(generated_store, tmp_path_factory) -> Store:
    """The 1M store's tables from the local commands (computed once, compared with every Ray run)."""
    data = inputs_copy(generated_store, tmp_path_factory.mktemp("ray-local-1m") / "data")
    _commands(str(data), "bench", [])   # both label sources: observed on Ray there, reconstructed over S3
    return Store(data)


def test_the_commands_on_ray_equal_local_on_a_generated_1m_store(generated_store, generated_local, tmp_path,
                                                                  ray_engine):
    """1M request-steps: 7 chunks, a fitting sample of 8 parts on the workers, the bootstrap (CIs) — Ray's
    tables are the local ones (estimate and calibrate --labels observed)."""
    data = inputs_copy(generated_store, tmp_path / "data")
    _commands(str(data), "bench", ["--engine", "ray"], labels=("observed",))
    assert generated_local.read("ceiling", "bench").num_rows >= 1_000_000
    _assert_results_match(generated_local, Store(data), "bench", "generated 1M", labels=("observed",))


def _s3_url(endpoint: str, prefix: str) -> str:
    return (f"s3://ray-tier/{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"
            "&allow_bucket_creation=true")


@pytest.mark.parametrize("store", ["demo_store", "generated_store"])
def test_the_commands_on_ray_over_s3_write_the_local_tables(store, request, tmp_path, s3_endpoint, ray_engine):
    """estimate and calibrate --engine ray on an s3:// store (moto) write what the local commands write
    into a directory: the tasks read S3, stage their files there, and the driver commits them (the 1M
    store against the local tables of the directory test; its calibration from the reconstructed labels,
    which read the ceiling the Ray estimate wrote to S3)."""
    src = request.getfixturevalue(store)
    url = _s3_url(s3_endpoint, store)
    upload(src, url, tables=INPUTS)
    if store == "demo_store":
        run, here = "demo-compact-s0", Store(inputs_copy(src, tmp_path / "local"))
        _commands(str(here.root), run, [], labels=("observed",))
        _commands(url, run, ["--engine", "ray"], labels=("observed",))
    else:
        run, here = "bench", request.getfixturevalue("generated_local")
        _commands(url, run, ["--engine", "ray"], labels=("reconstructed",))   # it reads the ceiling Ray wrote
    there = Store(url)
    _assert_results_match(here, there, run, store, labels=None if store == "demo_store" else ("reconstructed",))
    staged = [i.path for i in there.fs.get_file_info(pafs.FileSelector(there.base, recursive=True))
              if "_staged-" in i.path]
    assert staged == []    # every staged file was committed
    con = sql.connect(url)  # DuckDB reads what Ray wrote, as any reader would
    assert con.sql("SELECT count(*) FROM ceiling WHERE run_id = $r", params={"r": run}).fetchall()[0][0] == \
        here.read("ceiling", run).num_rows


def test_report_on_ray_gates_as_the_local_report(demo_store, tmp_path, ray_engine):
    """The nightly command: report --engine ray recomputes the stages on Ray; its figures are the local ones."""
    import json

    figures = {}
    for engine in ("local", "ray"):
        data = tmp_path / f"data-{engine}"
        shutil.copytree(demo_store, data)
        out = tmp_path / f"report-{engine}"
        result = CliRunner().invoke(app, ["report", "--data", str(data), "--run", "demo-compact-s0", "--out",
                                          str(out), "--recompute", "--no-png", "--no-history", "--bootstrap", "200",
                                          "--now", "2030-01-01T00:00:00Z", "--engine", engine])
        assert result.exit_code in (0, 1), result.output
        summary = json.loads((out / "summary.json").read_text())
        figures[engine] = {f["id"]: f for f in summary["figures"]}
    assert figures["local"].keys() == figures["ray"].keys() and len(figures["local"]) > 10
    for key, a in figures["local"].items():
        b = figures["ray"][key]
        for u, v in ((a["value"], b["value"]), (a["ci"]["low"], b["ci"]["low"]), (a["ci"]["high"], b["ci"]["high"]),
                     (a["verdict"], b["verdict"])):
            assert u == v or (isinstance(u, float) and v == pytest.approx(u, rel=1e-9, abs=1e-12)), (key, u, v)


def test_the_nightly_report_on_ray_over_s3(demo_store, tmp_path, s3_endpoint, ray_engine):
    """The fleet recipe's nightly command on an s3:// store: the stages run on Ray, results go back to S3."""
    import json

    url = (f"s3://ray-tier/nightly?endpoint_override={s3_endpoint}&scheme=http&region=us-east-1"
           "&allow_bucket_creation=true")
    upload(demo_store, url, tables=INPUTS)
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", "--data", url, "--run", "demo-compact-s0", "--out", str(out),
                                      "--no-png", "--bootstrap", "100", "--engine", "ray"])
    assert result.exit_code in (0, 1), result.output
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["figures"]) > 10
    assert Store(url).read("ceiling_summary", "demo-compact-s0").num_rows > 0
