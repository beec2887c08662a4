"""``dspark_obs.records`` against SGLang 0.5.23's ``dspark_observability`` structs.

The collector decodes what a server's ``dump()`` emits (``msgspec.to_builtins``
of each ``DecodeStepRecord``, a field equal to its default omitted), and the
emulator must emit the same bytes.  Checked both ways on hypothesis-drawn
records, plus the struct definitions field for field.
"""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.srt.speculative.dspark_components import dspark_observability as sg_obs

from dspark_obs import records as ours

pytestmark = pytest.mark.fidelity

RECORD_SETTINGS = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

STRUCT_NAMES = ("ReqDetail", "DecodeStepRecord")
# Every public StructConfig attribute (frozen, omit_defaults, array_like, tag, ...).
CONFIG_ATTRS = tuple(a for a in dir(msgspec.structs.StructConfig) if not a.startswith("_"))

# ----------------------------------------------------------------- definitions


def _type_name(tp) -> str:
    # Nested structs live in different modules: compare them by class name.
    return re.sub(r"[\w.]+\.(ReqDetail|DecodeStepRecord)\b", r"\1", repr(tp))


def _field_rows(cls):
    return [
        (f.name, f.encode_name, _type_name(f.type), f.required, f.default, f.default_factory)
        for f in msgspec.structs.fields(cls)
    ]


@pytest.mark.parametrize("name", STRUCT_NAMES)
def test_struct_fields_match_sglang_field_for_field(name):
    mine, theirs = getattr(ours, name), getattr(sg_obs, name)
    assert _field_rows(mine) == _field_rows(theirs)


@pytest.mark.parametrize("name", STRUCT_NAMES)
def test_struct_config_matches_sglang(name):
    mine, theirs = getattr(ours, name).__struct_config__, getattr(sg_obs, name).__struct_config__
    assert {a: getattr(mine, a) for a in CONFIG_ATTRS} == {a: getattr(theirs, a) for a in CONFIG_ATTRS}


def _strip_descriptions(node):
    if isinstance(node, dict):
        return {k: _strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip_descriptions(v) for v in node]
    return node


def test_json_schemas_match_sglang():
    # Our docstrings become schema descriptions; everything else must agree.
    for name in STRUCT_NAMES:
        mine = _strip_descriptions(msgspec.json.schema(getattr(ours, name)))
        assert mine == msgspec.json.schema(getattr(sg_obs, name)), name


def test_dump_limits_match_sglang():
    assert ours.INFO_DUMP_MAX_RECORDS == sg_obs.INFO_DUMP_MAX_RECORDS
    assert ours.INFO_DUMP_MAX_STEP_CPU_SECONDS == sg_obs.INFO_DUMP_MAX_STEP_CPU_SECONDS
    assert sorted(ours.INFO_COMPONENTS) == sorted(c.value for c in sg_obs.InfoComponent)


# ----------------------------------------------------------------- strategies

_INT64 = st.integers(-(2**63), 2**63 - 1)
_ints = st.one_of(st.integers(-2, 4096), _INT64)
_floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(0, 1, width=32),  # what .tolist() of a float32 tensor yields
    st.sampled_from([0.0, -0.0, 1.0, 1e-6, 5e-324, 1.7976931348623157e308]),
)
_text = st.one_of(st.sampled_from(["", "compact", "cap_accept", "static", "verify_all"]), st.text(max_size=12))


def _maybe(default, values):
    """Either leave the field out, pass its default explicitly, or pass a value."""
    return st.one_of(st.just(_OMIT), st.just(default), values)


_OMIT = object()


@st.composite
def req_kwargs(draw):
    gamma = draw(st.integers(0, 8))
    kwargs = {
        "req_pool_index": draw(_ints),
        "prefix_len": draw(_ints),
        "verify_len": draw(_ints),
        "acc_len": draw(_ints),
        "correct_drafts": draw(st.one_of(st.just(0), _ints)),
        "cap_trim": draw(st.one_of(st.just(0), _ints)),
        "bonus_token": draw(_ints),
        "draft_tokens": draw(st.lists(_ints, min_size=gamma, max_size=gamma)),
        "rid": draw(_maybe(None, st.one_of(st.uuids().map(lambda u: u.hex), st.text(max_size=20)))),
        "confidence": draw(_maybe(None, st.lists(_floats, min_size=gamma, max_size=gamma))),
        "survival": draw(_maybe(None, st.lists(_floats, min_size=gamma, max_size=gamma))),
    }
    return {k: v for k, v in kwargs.items() if v is not _OMIT}


@st.composite
def record_kwargs(draw):
    optional_float = _maybe(None, _floats)
    kwargs = {
        "forward_ct": draw(_ints),
        "bs": draw(_maybe(-1, _ints)),
        "mode": draw(_maybe("", _text)),
        "budget": draw(_maybe(None, _ints)),
        "lag_steps": draw(_maybe(None, _ints)),
        "num_running_reqs": draw(_maybe(-1, _ints)),
        "num_verify_tokens": draw(_maybe(-1, _ints)),
        "verify_tokens_local": draw(_maybe(-1, _ints)),
        "verify_tokens_dp_synced": draw(_maybe(-1, _ints)),
        "verify_tokens_graph_key": draw(_maybe(-1, _ints)),
        "predicted_step_ms": draw(optional_float),
        "predicted_theta": draw(optional_float),
        "step_cpu_ms": draw(optional_float),
        "step_gpu_ms": draw(optional_float),
        "draft_gpu_ms": draw(optional_float),
        "target_verify_gpu_ms": draw(optional_float),
        "reqs": draw(_maybe(None, st.lists(req_kwargs(), max_size=4))),
    }
    return {k: v for k, v in kwargs.items() if v is not _OMIT}


def _build(module, kwargs):
    kwargs = dict(kwargs)
    if kwargs.get("reqs") is not None:
        kwargs["reqs"] = [module.ReqDetail(**r) for r in kwargs["reqs"]]
    return module.DecodeStepRecord(**kwargs)


def _as_dumped(record) -> bytes:
    """The bytes a server's ``/server_info`` carries: ``to_builtins`` then JSON."""
    return msgspec.json.encode(msgspec.to_builtins(record))


# ----------------------------------------------------------------- round trips


@RECORD_SETTINGS
@given(kwargs=record_kwargs())
def test_sglang_records_decode_losslessly_with_ours(kwargs):
    theirs = _build(sg_obs, kwargs)
    wire = _as_dumped(theirs)

    decoded = msgspec.json.decode(wire, type=ours.DecodeStepRecord)

    assert msgspec.to_builtins(decoded) == msgspec.to_builtins(theirs)
    assert _as_dumped(decoded) == wire
    assert msgspec.json.encode(ours.encode_record(decoded)) == wire
    assert msgspec.json.encode(decoded) == msgspec.json.encode(theirs)


@RECORD_SETTINGS
@given(kwargs=record_kwargs())
def test_our_records_decode_losslessly_with_sglang(kwargs):
    mine = _build(ours, kwargs)
    wire = msgspec.json.encode(ours.encode_record(mine))

    decoded = msgspec.json.decode(wire, type=sg_obs.DecodeStepRecord)

    assert msgspec.to_builtins(decoded) == msgspec.to_builtins(mine)
    assert _as_dumped(decoded) == wire
    assert _build(ours, kwargs) == msgspec.json.decode(_as_dumped(decoded), type=ours.DecodeStepRecord)


@RECORD_SETTINGS
@given(kwargs=record_kwargs())
def test_defaults_are_omitted_exactly_as_sglang_omits_them(kwargs):
    mine, theirs = _build(ours, kwargs), _build(sg_obs, kwargs)
    assert list(msgspec.to_builtins(mine)) == list(msgspec.to_builtins(theirs))
    assert "forward_ct" in msgspec.to_builtins(mine)


@RECORD_SETTINGS
@given(kwargs=req_kwargs())
def test_req_details_round_trip_both_ways(kwargs):
    mine, theirs = ours.ReqDetail(**kwargs), sg_obs.ReqDetail(**kwargs)
    assert _as_dumped(mine) == _as_dumped(theirs)
    assert msgspec.json.decode(_as_dumped(theirs), type=ours.ReqDetail) == mine
    assert msgspec.json.decode(_as_dumped(mine), type=sg_obs.ReqDetail) == theirs


@settings(RECORD_SETTINGS, max_examples=100)
@given(
    records=st.lists(record_kwargs(), max_size=5),
    gamma=st.integers(1, 8),
    simulate_acc_len=st.one_of(st.none(), st.floats(0.1, 9)),
    components=st.sets(st.sampled_from([c.value for c in sg_obs.InfoComponent])),
)
def test_server_info_payload_decodes_with_ours(records, gamma, simulate_acc_len, components):
    # The dict built by SGLang's dump() + dump_info_records(), as /server_info sends it.
    payload = {
        "mode": "compact",
        "gamma": gamma,
        "verify_num_draft_tokens": gamma + 1,
        "components": sorted(components),
        "records": [msgspec.to_builtins(_build(sg_obs, r)) for r in records],
        "simulate_acc_len": simulate_acc_len,
    }
    wire = msgspec.json.encode(payload)
    decoded = msgspec.json.decode(wire, type=ours.InfoRecordPayload)
    assert [_as_dumped(r) for r in decoded.records] == [msgspec.json.encode(r) for r in payload["records"]]
    assert decoded.simulate_acc_len == simulate_acc_len
    assert decoded.components == payload["components"]
