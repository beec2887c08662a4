"""``dspark_obs.costtable`` against SGLang 0.5.23's ``dspark_sps``.

Files we write load with SGLang's ``load_sps_table_from_path`` (what
``--speculative-dspark-sps-table-path`` runs) and give the same step times and
lookups; files SGLang writes load with ours; both reject the same bad tables.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from sglang.srt.speculative.dspark_components import dspark_sps as sg_sps

from . import _fidelity_gen as gen
from ._fidelity_sglang import sg_table
from dspark_obs import costtable
from dspark_obs.costtable import SpsAdditiveCostTable, SpsCostTable

pytestmark = pytest.mark.fidelity

N_TABLES = 300  # per kind
N_POINTS = 60  # per table
REL_TOL = 1e-9


def _table(kind: str, case: int):
    rng = np.random.default_rng([808 if kind == "additive" else 909, case])
    table = gen.draw_additive_table(rng) if kind == "additive" else gen.draw_sps_table(rng)
    return table, rng


def _points(rng: np.random.Generator, table) -> tuple[np.ndarray, np.ndarray]:
    """(num_reqs, budget) pairs: random, plus every probe hit exactly and overshot."""
    if isinstance(table, SpsAdditiveCostTable):
        num_reqs = np.concatenate(
            [rng.integers(1, 700, N_POINTS), table.bs_probes, np.array(table.bs_probes) + 1]
        )
        m = np.concatenate([rng.integers(1, 3500, N_POINTS), table.m_probes, np.array(table.m_probes) + 1])
    else:
        num_reqs = np.concatenate([rng.integers(1, 400, N_POINTS), np.ones(2 * len(table.sample_batch_tokens), int)])
        m = np.concatenate(
            [rng.integers(1, 4000, N_POINTS), table.sample_batch_tokens, np.array(table.sample_batch_tokens) - 1]
        )
    size = min(num_reqs.size, m.size)
    num_reqs, m = num_reqs[:size], m[:size]
    m = np.maximum(m, num_reqs)  # budget = m - num_reqs >= 0
    return num_reqs.astype(np.int64), (m - num_reqs).astype(np.int64)


@pytest.mark.parametrize("case", range(N_TABLES))
@pytest.mark.parametrize("kind", ["additive", "sps"])
def test_our_json_loads_in_sglang_with_the_same_numbers(tmp_path, kind, case):
    table, rng = _table(kind, case)
    path = tmp_path / "table.json"
    path.write_text(costtable.to_json(table), encoding="utf-8")

    loaded = sg_sps.load_sps_table_from_path(str(path))

    assert type(loaded) is type(sg_table(table))
    assert loaded == sg_table(table)
    assert loaded.to_json() == costtable.to_json(table)  # byte-identical encodings

    num_reqs, budget = _points(rng, table)
    with np.errstate(divide="ignore"):  # a dead probe (0 steps/s) is an infinite step
        ours = table.step_seconds(num_reqs=num_reqs, budget=budget)
    if isinstance(table, SpsAdditiveCostTable):
        theirs = [loaded.step_time(num_reqs=int(n), budget=int(k)) for n, k in zip(num_reqs, budget)]
        for n, k, a, b in zip(num_reqs, budget, ours, theirs):
            assert math.isclose(a, b, rel_tol=REL_TOL), (int(n), int(k), float(a), b, costtable.to_json(table))
    else:
        tokens = num_reqs + budget
        theirs = np.array([loaded.lookup(int(t)) for t in tokens])
        assert np.array_equal(table.steps_per_sec(tokens), theirs), costtable.to_json(table)
        with np.errstate(divide="ignore"):
            expected = 1.0 / theirs
        assert np.array_equal(ours, expected)


@pytest.mark.parametrize("case", range(N_TABLES))
@pytest.mark.parametrize("kind", ["additive", "sps"])
def test_sglang_json_loads_in_ours(tmp_path, kind, case):
    table, _ = _table(kind, case)
    written = sg_table(table).to_json()  # SGLang's own writer
    path = tmp_path / "table.json"
    path.write_text(written, encoding="utf-8")

    assert costtable.load(path) == table
    assert costtable.from_json(written) == table
    assert costtable.from_json(written.encode()) == table


def test_sglang_profiled_table_loads_in_ours():
    rng = np.random.default_rng(1)
    probes = [(int(t), float(s)) for t, s in zip(rng.choice(np.arange(1, 2000), 9, replace=False), rng.uniform(5, 90, 9))]
    built = sg_sps.profile_sps_table(probes=probes, max_batch_tokens=4096)
    ours = costtable.from_json(built.to_json())
    assert isinstance(ours, SpsCostTable)
    assert msgspec.structs.asdict(ours) == msgspec.structs.asdict(built)


def test_uninitialized_tables_agree():
    ours = costtable.uninitialized_table(max_batch_tokens=512)
    theirs = sg_sps.build_uninitialized_sps_table(max_batch_tokens=512)
    assert msgspec.structs.asdict(ours) == msgspec.structs.asdict(theirs)
    assert costtable.is_uninitialized(ours) and sg_sps.is_uninitialized_sps_table(theirs)
    for table in (costtable.default_additive_table(), gen.draw_sps_table(np.random.default_rng(3))):
        assert costtable.is_uninitialized(table) == sg_sps.is_uninitialized_sps_table(sg_table(table))


@pytest.mark.parametrize("cls_name", ["SpsCostTable", "SpsAdditiveCostTable"])
def test_struct_fields_match_sglang(cls_name):
    ours, theirs = getattr(costtable, cls_name), getattr(sg_sps, cls_name)
    as_tuple = lambda cls: [(f.name, f.type, f.default) for f in msgspec.structs.fields(cls)]  # noqa: E731
    assert as_tuple(ours) == as_tuple(theirs)
    assert ours.__struct_config__.frozen == theirs.__struct_config__.frozen


BAD_TABLES = {
    "sps_no_probe": '{"sample_batch_tokens":[],"sample_steps_per_sec":[],"max_batch_tokens":1}',
    "sps_unsorted": '{"sample_batch_tokens":[4,2],"sample_steps_per_sec":[1.0,2.0],"max_batch_tokens":4}',
    "sps_duplicate": '{"sample_batch_tokens":[2,2],"sample_steps_per_sec":[1.0,2.0],"max_batch_tokens":4}',
    "sps_lengths": '{"sample_batch_tokens":[1,2],"sample_steps_per_sec":[1.0],"max_batch_tokens":4}',
    "sps_max_below_probe": '{"sample_batch_tokens":[1,8],"sample_steps_per_sec":[1.0,2.0],"max_batch_tokens":4}',
    "sps_missing_field": '{"sample_batch_tokens":[1],"sample_steps_per_sec":[1.0]}',
    "additive_bias_zero": (
        '{"bias_seconds":0.0,"bs_probes":[1],"alpha_seconds":[0.0],"m_probes":[1],"theta_seconds":[0.0]}'
    ),
    "additive_unsorted_m": (
        '{"bias_seconds":0.1,"bs_probes":[1],"alpha_seconds":[0.0],"m_probes":[3,1],"theta_seconds":[0.0,1.0]}'
    ),
    "additive_no_bs": '{"bias_seconds":0.1,"bs_probes":[],"alpha_seconds":[],"m_probes":[1],"theta_seconds":[0.0]}',
    "additive_lengths": (
        '{"bias_seconds":0.1,"bs_probes":[1,2],"alpha_seconds":[0.0],"m_probes":[1],"theta_seconds":[0.0]}'
    ),
    "not_a_table": '{"temperatures":[1.0]}',
}


@pytest.mark.parametrize("name", sorted(BAD_TABLES))
def test_both_reject_the_same_bad_tables(tmp_path, name):
    path = tmp_path / "bad.json"
    path.write_text(BAD_TABLES[name], encoding="utf-8")
    with pytest.raises((ValueError, msgspec.ValidationError)):
        sg_sps.load_sps_table_from_path(str(path))
    with pytest.raises(ValueError):
        costtable.load(path)
