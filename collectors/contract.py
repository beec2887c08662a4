"""Decoding contracts derived from SGLang's formats and the store's columns, never written out again.

SGLang's structs (:mod:`dspark_obs.records`) say which fields a record has,
their types and defaults; the store's Arrow schemas (:mod:`dspark_obs.schema`)
say which integer range each value must fit.  A collector decodes with the
first narrowed by the second (:func:`column_struct`), so a value outside its
column's range is a contract violation reported per record, never an overflow
that fails a whole batch at write time, and a field added on either side
reaches the decoder by itself.

>>> import pyarrow as pa
>>> fitting(list[int], pa.list_(pa.int16()))
list[typing.Annotated[int, msgspec.Meta(ge=-32768, le=32767)]]
"""

from __future__ import annotations

from typing import Annotated, Any, Mapping, Union, get_args, get_origin

import msgspec
import numpy as np
import pyarrow as pa

__all__ = ["fitting", "derived_struct", "column_struct"]

_RAW_NULL = msgspec.Raw(b"null")


def fitting(tp: Any, column: pa.DataType) -> Any:
    """``tp`` with every ``int`` in it limited to the range of the Arrow type its values land in.

    Lists follow the column's value type, tuples the fields of a struct column
    (position by position), ``Optional`` keeps its ``None``; other types are kept.
    """
    if tp is int:
        if not pa.types.is_integer(column):
            return tp
        info = np.iinfo(column.to_pandas_dtype())
        return Annotated[int, msgspec.Meta(ge=int(info.min), le=int(info.max))]
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union:
        return Union[tuple(a if a is type(None) else fitting(a, column) for a in args)]
    if origin is list and pa.types.is_list(column):
        return list[fitting(args[0], column.value_type)]
    if origin is tuple and pa.types.is_struct(column) and len(args) == column.num_fields:
        return tuple[tuple(fitting(a, column.field(i).type) for i, a in enumerate(args))]
    return tp


def derived_struct(reference: type, name: str, types: Mapping[str, Any], *, module: str,
                   defaults: Mapping[str, Any] | None = None, **options) -> type:
    """``reference``'s fields, names, checks and defaults, with the types of ``types`` and the defaults of
    ``defaults`` swapped in (a ``msgspec.Raw`` field defaulting to None defaults to raw ``null``).

    Derived rather than written out, so a derived contract cannot drift from its
    reference when a field is added.  ``options`` go to ``msgspec.defstruct``.
    """
    fields = []
    for f in msgspec.structs.fields(reference):
        kind = types.get(f.name, f.type)
        if defaults and f.name in defaults:
            default = defaults[f.name]  # an empty list or dict is copied per instance by msgspec
        elif f.required:
            fields.append((f.name, kind))
            continue
        else:
            default = (f.default if f.default is not msgspec.NODEFAULT
                       else msgspec.field(default_factory=f.default_factory))
        if kind is msgspec.Raw and default is None:
            default = _RAW_NULL
        fields.append((f.name, kind, default))
    return msgspec.defstruct(name, fields, module=module, **options)


def column_struct(reference: type, name: str, columns: pa.Schema, *, module: str,
                  column_of: Mapping[str, str] | None = None, types: Mapping[str, Any] | None = None,
                  **options) -> type:
    """:func:`derived_struct` of ``reference`` with each field's type narrowed by :func:`fitting` to the
    column of the same name in ``columns`` (or the one ``column_of`` names; ``types`` override both)."""
    column_of = column_of or {}
    narrowed = {}
    for f in msgspec.structs.fields(reference):
        col = column_of.get(f.name, f.name)
        if col in columns.names:
            narrowed[f.name] = fitting(f.type, columns.field(col).type)
    return derived_struct(reference, name, {**narrowed, **(types or {})}, module=module, **options)
