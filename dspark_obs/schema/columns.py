"""A documented column, and the Arrow types the schemas use (shared by store and result tables)."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["field", "I16", "I32", "I64", "F32", "F64", "STR", "TS"]

I16, I32, I64 = pa.int16(), pa.int32(), pa.int64()
F32, F64, STR = pa.float32(), pa.float64(), pa.string()
TS = pa.timestamp("us", tz="UTC")


def field(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    """A column with its documentation attached (the README's data model is built from it)."""
    return pa.field(name, type_, nullable=nullable, metadata={b"doc": doc.encode()})

