"""EventBatch v8's packed columns: each numeric column one little-endian byte string.

From v8 on, the numeric columns of an EventBatch's ``iterations``, ``spans``, ``comms`` and
``stacks`` are Avro ``bytes``: the column's values packed little-endian, int64 where the
older versions had ``long`` (times, steps, sequence numbers, bytes, sample counts) and
int32 where they had ``int`` (kinds, name and group indexes, lines). Avro decodes one such
column as one byte string instead of one Python int per value, and the reader turns it
into one array with one ``numpy.frombuffer`` (:func:`unpack`); a writer packs a list, an
``array.array`` or a numpy array with one ``tobytes`` (:func:`pack`).

The widths are the older versions' Avro types, so every value a v7 batch could carry packs
into v8 and back unchanged (a v7 batch re-encoded as v8 folds to the same records).

Standard library only at import (the collectors pack with :mod:`array`); :func:`unpack`
imports numpy when it first runs and falls back to ``array.array`` without it.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeGuard

from .vocabulary import EVENT_BATCH

PACKED_FROM = 8  # the first EventBatch version with packed columns
I64, I32 = "q", "i"  # array typecodes (8 and 4 bytes on every platform CPython supports)
ITEM_BYTES = {I64: 8, I32: 4}
WIDTH_NAMES = {I64: "int64", I32: "int32"}
_LITTLE = sys.byteorder == "little"

# block -> its packed columns and their typecodes, in schema order
PACKED: Mapping[str, tuple[tuple[str, str], ...]] = {
    "iterations": (("step", I64), ("start_ns", I64), ("dur_ns", I64)),
    "spans": (("kind", I32), ("name", I32), ("path", I32), ("step", I64), ("start_ns", I64), ("dur_ns", I64)),
    "comms": (("op", I32), ("group", I32), ("seq", I64), ("bytes", I64), ("step", I64), ("start_ns", I64),
              ("dur_ns", I64)),
    "stacks": (("frame", I32), ("line", I32), ("kind", I32), ("count", I64), ("code", I32)),
}
TYPECODE = {(block, col): code for block, cols in PACKED.items() for col, code in cols}


def is_packed(name: str, version: int) -> bool:
    """Whether ``name`` records of ``version`` carry packed columns."""
    return name == EVENT_BATCH and version >= PACKED_FROM


def is_raw(value: Any) -> TypeGuard[bytes | bytearray | memoryview]:
    """A column still as packed bytes (not unpacked: its length is not a whole number of items)."""
    return isinstance(value, (bytes, bytearray, memoryview))


def pack_column(values: Any, code: str) -> bytes:
    """One column as little-endian bytes of ``code``'s width: bytes pass through; an
    ``array.array`` or a numpy array is converted once; anything else (a list) goes through
    ``array.array``. Raises OverflowError or TypeError for values the width cannot hold."""
    if is_raw(values):
        return bytes(values)
    if isinstance(values, array):
        if values.typecode != code:
            values = array(code, values)
    elif hasattr(values, "astype") and hasattr(values, "tobytes"):  # a numpy array
        width = ITEM_BYTES[code]
        if values.dtype.kind not in "iub":
            raise TypeError(f"a {values.dtype} column, expected integers")
        if len(values) and values.dtype.itemsize > width:
            lo, hi = -(1 << (8 * width - 1)), (1 << (8 * width - 1)) - 1
            if int(values.min()) < lo or int(values.max()) > hi:
                raise OverflowError(f"a value outside {WIDTH_NAMES[code]}")
        return bytes(values.astype(f"<i{width}", copy=False).tobytes())
    else:
        values = array(code, values)
    if not _LITTLE:
        values = array(code, values)
        values.byteswap()
    return values.tobytes()


def pack(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with every packed column as bytes (the record itself is not changed)."""
    out = dict(record)
    for block, cols in PACKED.items():
        part = record.get(block)
        if part is None:  # a block left out (stacks): empty columns, not the schema's JSON default
            out[block] = {col: b"" for col, _ in cols}
            continue
        out[block] = {**part, **{col: pack_column(part[col], code) for col, code in cols if col in part}}
    return out


def unpack(record: dict[str, Any]) -> dict[str, Any]:
    """Turn ``record``'s packed columns into arrays in place (numpy ``frombuffer``: int64 and
    int32, read-only views of the decoded bytes); a column whose length is not a whole
    number of its items stays bytes, for validation to name (:mod:`.rules`)."""
    frombuffer = _frombuffer()
    for block, cols in PACKED.items():
        part = record.get(block)
        if not isinstance(part, dict):
            continue
        for col, code in cols:
            raw = part.get(col)
            if is_raw(raw) and len(raw) % ITEM_BYTES[code] == 0:
                part[col] = frombuffer(raw, code)
    return record


@cache
def _frombuffer() -> Any:
    try:
        import numpy as np
    except ImportError:  # the slim collector install: stdlib arrays
        def from_array(raw: Any, code: str) -> Any:
            values = array(code)
            values.frombytes(raw)
            if not _LITTLE:
                values.byteswap()
            return values
        return from_array
    dtypes: dict[str, Any] = {I64: np.dtype("<i8"), I32: np.dtype("<i4")}

    def from_numpy(raw: Any, code: str) -> Any:
        return np.frombuffer(raw, dtypes[code])
    return from_numpy


def raw_problem(value: Any, code: str) -> str | None:
    """Why a still-packed column cannot be read, or None."""
    if is_raw(value) and len(value) % ITEM_BYTES[code]:
        return (f"{len(value)} bytes, not a whole number of {WIDTH_NAMES[code]} "
                f"({ITEM_BYTES[code]}-byte little-endian) values")
    return None


def as_lists(record: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``record`` with every packed column as a list of ints (the v1..v7 shape):
    for comparing records and for re-encoding a v8 record with an older schema."""
    out = dict(record)
    for block, cols in PACKED.items():
        part = record.get(block)
        if isinstance(part, Mapping):
            out[block] = {**part, **{col: _listed(part[col]) for col, _ in cols if col in part}}
    return out


def _listed(column: Any) -> Any:
    if is_raw(column):
        return column
    return column.tolist() if hasattr(column, "tolist") else list(column)
