"""collectors.contract: the collector's decoding structs are SGLang's records narrowed to the store's columns."""

from __future__ import annotations

from typing import Optional, Union, get_args, get_origin

import msgspec
import pyarrow as pa
import pytest

from collectors.contract import column_struct, derived_struct, fitting
from collectors.importers import estimator
from collectors.sglang import decode
from dspark_obs import records, schema


def _bounds(tp) -> tuple[int, int]:
    meta = tp.__metadata__[0]
    return meta.ge, meta.le


def test_fitting_narrows_ints_to_the_column_range_through_lists_optionals_and_struct_tuples():
    assert _bounds(fitting(int, pa.int16())) == (-(2**15), 2**15 - 1)
    assert _bounds(fitting(int, pa.uint8())) == (0, 255)
    assert fitting(int, pa.float64()) is int and fitting(str, pa.int32()) is str
    (inner, none) = fitting(Optional[int], pa.int32()).__args__
    assert _bounds(inner) == (-(2**31), 2**31 - 1) and none is type(None)
    assert _bounds(fitting(list[int], pa.list_(pa.int64())).__args__[0]) == (-(2**63), 2**63 - 1)
    row = fitting(tuple[int, float], pa.struct([("a", pa.int16()), ("b", pa.float64())])).__args__
    assert _bounds(row[0]) == (-(2**15), 2**15 - 1) and row[1] is float


def test_a_value_outside_its_column_is_refused_by_the_derived_struct():
    class Ref(msgspec.Struct):
        a: int
        b: list[int] = []

    Narrow = column_struct(Ref, "Narrow", pa.schema([("a", pa.int8()), ("b", pa.list_(pa.int16()))]), module=__name__)
    assert msgspec.json.decode(b'{"a": 127}', type=Narrow).b == []
    with pytest.raises(msgspec.ValidationError, match=r"<= 127 - at `\$.a`"):
        msgspec.json.decode(b'{"a": 128}', type=Narrow)
    with pytest.raises(msgspec.ValidationError, match=r"\$.b\[0\]"):
        msgspec.json.decode(b'{"a": 1, "b": [40000]}', type=Narrow)
    Raw = derived_struct(Narrow, "Raw", {"b": msgspec.Raw}, module=__name__, defaults={"a": 0})
    assert msgspec.json.decode(b"{}", type=Raw).a == 0


@pytest.mark.parametrize("derived, reference", [
    (decode._Req, records.EmulatorReqDetail), (decode.SglangRecord, records.DecodeStepRecord),
    (decode._FastReq, records.EmulatorReqDetail), (estimator.StepRow, records.BlockAcceptRow),
    (estimator.EosRow, records.BlockAcceptEosRow)])
def test_the_collectors_structs_have_the_records_fields_and_defaults(derived, reference):
    def shape(cls):
        return [(f.name, f.required, f.default if f.default is not msgspec.NODEFAULT else f.default_factory)
                for f in msgspec.structs.fields(cls)]

    want = shape(reference)
    if derived is decode._FastReq:  # the three lists stay raw JSON: absent ones are raw null
        want = [(n, r, msgspec.Raw if n in ("confidence", "survival") else d) for n, r, d in want]
        got = [(n, r, msgspec.Raw if isinstance(d, msgspec.Raw) else d) for n, r, d in shape(derived)]
        assert got == want
    else:
        assert shape(derived) == want


def test_every_integer_of_a_step_record_is_bounded_by_its_steps_column():
    checked = []
    for f in msgspec.structs.fields(decode.SglangRecord):
        column = schema.STEPS.field(f.name).type if f.name in schema.STEPS.names else None
        if column is not None and pa.types.is_integer(column):
            tp = next(a for a in get_args(f.type) if a is not type(None)) if get_origin(f.type) is Union else f.type
            assert _bounds(tp)[1] == 2 ** (column.bit_width - 1) - 1, f.name
            checked.append(f.name)
    assert {"forward_ct", "bs", "budget", "verify_tokens_graph_key"} <= set(checked)
