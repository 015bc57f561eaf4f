"""A columnar Avro encoder for many flat records at once, byte for byte what fastavro writes.

``fastavro.schemaless_writer`` encodes one record at a time, field by field, in Cython. The
stream worker closes FunctionPatterns and RankWindows by the thousand at a window's end, and
their fields are mostly integers: encoding them one record at a time is a large share of the
summarize stage's CPU. :func:`compile_encoder` turns a parsed record schema into a
:class:`FastEncoder` whose :meth:`~FastEncoder.encode_many` encodes a list of records column
by column with numpy:

* every integer of every record (int and long fields, string lengths, array counts, the
  items of integer arrays, the lengths of the strings in string arrays) goes through one
  zig-zag + varint pass, and each varint is written straight to its place in one buffer
  (byte k of every varint at least k + 1 bytes long in one indexed assignment);
* the fixed-width fields (float, double, boolean) are cast column-wise, and they and the
  strings' bytes are scattered into that buffer in one indexed assignment;
* maps (most are empty) are built record by record in Python;
* the buffer is cut per record. More than :data:`MAX_BATCH` records go slice by slice (the
  values stay in the CPU caches); fewer than :data:`MIN_BATCH` go to fastavro one by one.

Only flat records of int, long (timestamp-millis included), float, double, boolean, string,
arrays of those (boolean aside) and maps of int/long/string are compiled; any other schema
gives None and the caller keeps fastavro. A value the fast path does not take exactly as it
is (a float or a str where a long goes, an int beyond int32 in an int field, a missing field
without a default, a tuple of values, a string that cannot be UTF-8) sends *that record* to
``schemaless_writer``, so it encodes or fails exactly as fastavro would; an integer that is
not an int (a bool, a numpy integer) is written as its value, as fastavro writes it. Avro's
rules as fastavro applies them: an empty array or map is the single byte 0; a non-empty one
is one block (count, items) and 0.
"""

from __future__ import annotations

import array
import io
import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import fastavro
import numpy as np

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
VARINT_MAX_BYTES = 10  # a zig-zag long takes at most 10 groups of 7 bits

_SHIFTS = np.arange(VARINT_MAX_BYTES, dtype=np.uint64) * np.uint64(7)
_THRESHOLDS = np.array([1 << (7 * k) for k in range(1, VARINT_MAX_BYTES)], dtype=np.uint64)
_BYTE_INDEX = np.arange(VARINT_MAX_BYTES)

INTEGER_TYPES = frozenset({"int", "long"})
SCALAR_WIDTH = {"float": 4, "double": 8, "boolean": 1}  # fixed-width scalars, bytes
FLOAT_DTYPE: dict[str, np.dtype[Any]] = {"float": np.dtype("<f4"), "double": np.dtype("<f8")}
ITEM_TYPES = frozenset({"int", "long", "float", "double", "string"})
MAP_VALUE_TYPES = frozenset({"int", "long", "string"})
LOGICAL_LONGS = frozenset({"timestamp-millis"})
# fewer records than this go to fastavro one by one: the columnar pass costs a few hundred
# microseconds whatever the batch (measured: about even at 32 FunctionPatterns)
MIN_BATCH = 32
# more records than this are encoded in slices of this many: the values of a slice stay in the
# CPU caches (FunctionPatterns of the throughput workload, 2-core VM: 10.8 us a record in
# slices of 512, 14-15 in slices of 1,024 to 4,096, 24 for 27,000 at once)
MAX_BATCH = 512


class BadRecords(Exception):
    """Some records hold values the fast path does not take as they are (their positions)."""

    def __init__(self, indices: set[int]):
        super().__init__(f"{len(indices)} records for fastavro")
        self.indices = indices


# ---- the schema ---------------------------------------------------------------------------
@dataclass(frozen=True)
class FieldSpec:
    """One field of a flat record: its name, its kind and what fastavro fills in when it is missing.

    ``kind``: ``int``, ``long``, ``float``, ``double``, ``boolean``, ``string``, ``array`` or
    ``map``; ``items`` is the array's item type or the map's value type."""

    name: str
    kind: str
    items: str = ""
    has_default: bool = False
    default: Any = None


def field_spec(field: dict) -> FieldSpec | None:
    """The :class:`FieldSpec` of one parsed field; None for a type the fast path does not compile."""
    kind, items = _kind_of(field["type"])
    if not kind:
        return None
    return FieldSpec(field["name"], kind, items, "default" in field, field.get("default"))


def _kind_of(avro_type: Any) -> tuple[str, str]:
    """(kind, item type) of a parsed Avro type; ("", "") when unsupported."""
    if isinstance(avro_type, str):
        supported = avro_type in INTEGER_TYPES or avro_type in SCALAR_WIDTH or avro_type == "string"
        return (avro_type, "") if supported else ("", "")
    if not isinstance(avro_type, dict):
        return "", ""  # a union (list) or anything else
    base = avro_type.get("type")
    if "logicalType" in avro_type:
        ok = base == "long" and avro_type["logicalType"] in LOGICAL_LONGS
        return ("long", "") if ok else ("", "")
    items, values = avro_type.get("items"), avro_type.get("values")
    if base == "array" and isinstance(items, str) and items in ITEM_TYPES:
        return "array", items
    if base == "map" and isinstance(values, str) and values in MAP_VALUE_TYPES:
        return "map", values
    return "", ""  # nested records, enums, fixed, bytes, unions ...


# ---- values -------------------------------------------------------------------------------
def is_long(v: Any) -> bool:
    """A value the fast path writes as an Avro long: a plain int (not a bool) within int64."""
    return type(v) is int and LONG_MIN <= v <= LONG_MAX


def is_int(v: Any) -> bool:
    """A value the fast path writes as an Avro int: a plain int within int32 (fastavro writes a
    wider one as a long; that record goes to fastavro)."""
    return type(v) is int and INT_MIN <= v <= INT_MAX


def is_real(v: Any) -> bool:
    """A float or int value fastavro's ``float()`` turns into a double without error."""
    if type(v) is float:
        return True
    if type(v) is not int:
        return False
    try:
        float(v)
    except OverflowError:
        return False
    return True


def is_utf8(v: Any) -> bool:
    """A str that encodes as UTF-8 (no lone surrogates)."""
    if type(v) is not str:
        return False
    try:
        v.encode()
    except UnicodeEncodeError:
        return False
    return True


ITEM_CHECK: dict[str, Callable[[Any], bool]] = {
    "int": is_int, "long": is_long, "float": is_real, "double": is_real, "string": is_utf8}


def is_list_of(items: str) -> Callable[[Any], bool]:
    """Checker of an array value: a list whose items all pass ``items``' check."""
    check = ITEM_CHECK[items]
    return lambda v: type(v) is list and all(map(check, v))


def is_map_of(values: str) -> Callable[[Any], bool]:
    """Checker of a map value: a dict of UTF-8 str keys and values that pass ``values``' check."""
    check = ITEM_CHECK[values]
    return lambda v: type(v) is dict and all(map(is_utf8, v)) and all(map(check, v.values()))


def value_check(spec: FieldSpec) -> Callable[[Any], bool]:
    """What one value of ``spec``'s field must be for the fast path (else: fastavro)."""
    if spec.kind == "array":
        return is_list_of(spec.items)
    if spec.kind == "map":
        return is_map_of(spec.items)
    if spec.kind == "boolean":
        return lambda v: type(v) is bool
    return ITEM_CHECK[spec.kind]


def bad_positions(column: Sequence[Any], check: Callable[[Any], bool]) -> set[int]:
    """Positions of the values of ``column`` that fail ``check`` (the slow scan, on failure only)."""
    return {i for i, v in enumerate(column) if not check(v)}


def require(column: Sequence[Any], ok: bool, check: Callable[[Any], bool]) -> None:
    """Raise :class:`BadRecords` naming the failing positions when the quick column test ``ok`` failed."""
    if not ok:
        raise BadRecords(bad_positions(column, check) or set(range(len(column))))


# ---- varints ------------------------------------------------------------------------------
def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zig-zag varints of int64 ``values``: (M, 10) uint8 groups, continuation bits set, and
    (M,) their lengths in bytes (1..10)."""
    v = values.astype(np.int64, copy=False)
    zigzag = ((v << np.int64(1)) ^ (v >> np.int64(63))).view(np.uint64)
    lengths = 1 + (zigzag[:, None] >= _THRESHOLDS).sum(axis=1)
    groups = ((zigzag[:, None] >> _SHIFTS) & np.uint64(0x7F)).astype(np.uint8)
    groups[_BYTE_INDEX < (lengths - 1)[:, None]] |= 0x80
    return groups, lengths


def varint_bytes(n: int) -> bytes:
    """One zig-zag varint (a length or count in a Python-built piece)."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def int_array(column: Sequence[Any], check: Callable[[Any], bool], bounds: tuple[int, int]) -> np.ndarray:
    """``column`` as int64 values within ``bounds``; else :class:`BadRecords`. ``array('q')``
    takes only integers (an int, a bool, a numpy integer: each written as its integer value,
    as fastavro writes it) within int64; anything else goes through ``check`` value by value."""
    try:
        arr = np.frombuffer(array.array("q", column), dtype=np.int64)
    except (TypeError, OverflowError):
        raise BadRecords(bad_positions(column, check)) from None
    if len(arr) and (arr.min() < bounds[0] or arr.max() > bounds[1]):
        raise BadRecords(bad_positions(column, check))
    return arr


def real_array(column: Sequence[Any], check: Callable[[Any], bool], dtype: np.dtype) -> np.ndarray:
    """``column`` of floats (ints converted with ``float()``, as fastavro does) cast to ``dtype``."""
    types = set(map(type, column))
    require(column, types <= {float, int}, check)
    if int in types:
        try:
            column = [float(v) for v in column]
        except OverflowError:
            raise BadRecords(bad_positions(column, check)) from None
    with np.errstate(over="ignore"):  # fastavro's C cast: a double beyond float32 is inf
        return np.array(column, dtype=np.float64).astype(dtype)


def utf8_column(column: Sequence[Any], check: Callable[[Any], bool]) -> tuple[bytes, np.ndarray]:
    """The UTF-8 bytes of a column of str, concatenated, and each one's length in bytes."""
    require(column, set(map(type, column)) <= {str}, check)
    joined = "".join(column)
    if joined.isascii():
        return joined.encode("ascii"), np.fromiter(map(len, column), dtype=np.int64, count=len(column))
    try:
        encoded = [s.encode() for s in column]
    except UnicodeEncodeError:
        raise BadRecords(bad_positions(column, check)) from None
    return b"".join(encoded), np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))


def block_bytes(count: int, body: bytes) -> bytes:
    """An array or map as fastavro writes it: 0 when empty, else count, the items and 0."""
    return varint_bytes(count) + body + b"\x00" if count else b"\x00"


def string_item(s: str) -> bytes:
    raw = s.encode()
    return varint_bytes(len(raw)) + raw


def value_bytes(kind: str) -> Callable[[Any], bytes]:
    """A Python encoder of one value of ``kind`` (the items of string arrays and map values)."""
    if kind == "string":
        return string_item
    return varint_bytes


def python_column(spec: FieldSpec, column: Sequence[Any]) -> list[bytes]:
    """Maps, encoded record by record (they are short, and most are empty)."""
    check = value_check(spec)
    if set(map(type, column)) == {dict} and not any(column):
        return [b"\x00"] * len(column)  # all empty: the usual case
    require(column, all(map(check, column)), check)
    encode = value_bytes(spec.items)
    return [block_bytes(len(m), b"".join(string_item(k) + encode(v) for k, v in m.items())) for m in column]


# ---- layout -------------------------------------------------------------------------------
VARINT_HOWS = frozenset({"value", "length", "count", "end"})
ITEM_HOWS = frozenset({"varints", "strings"})  # array items that start with a varint
ARRAY_HOW = {"int": "varints", "long": "varints", "float": "reals", "double": "reals", "string": "strings"}


@dataclass(frozen=True)
class Element:
    """One piece of a record, in the order it is written.

    ``how``: a varint -- ``value`` (an int or long field), ``length`` (a string's byte length),
    ``count`` (an array's item count, absent when 0), ``end`` (the 0 closing an array);
    ``fixed`` (a float, double or boolean field); ``utf8`` (a string's bytes); ``varints``,
    ``reals`` or ``strings`` (an array's items); ``python`` (a whole map, built in Python)."""

    field: int  # position of the field it belongs to
    how: str


def layout_of(specs: Sequence[FieldSpec]) -> list[Element]:
    """The elements of a record of fields ``specs``, in the order Avro writes them."""
    out: list[Element] = []
    for i, spec in enumerate(specs):
        if spec.kind in INTEGER_TYPES:
            out.append(Element(i, "value"))
        elif spec.kind in SCALAR_WIDTH:
            out.append(Element(i, "fixed"))
        elif spec.kind == "string":
            out += [Element(i, "length"), Element(i, "utf8")]
        elif spec.kind == "array":
            out += [Element(i, "count"), Element(i, ARRAY_HOW[spec.items]), Element(i, "end")]
        else:
            out.append(Element(i, "python"))
    return out


# ---- varint stream ------------------------------------------------------------------------
def zigzag(values: np.ndarray) -> np.ndarray:
    """Avro's zig-zag mapping of int64 values to uint64 (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...)."""
    v = values.astype(np.int64, copy=False)
    return ((v << np.int64(1)) ^ (v >> np.int64(63))).view(np.uint64)


def varint_lengths(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bytes of each zig-zagged value's varint (1 below 2^7, 2 below 2^14, ..., 10) and the
    positions of those longer than one byte. Only the values still long enough are looked at
    again: most take one byte."""
    lengths = np.ones(len(z), dtype=np.int64)
    multi = idx = np.flatnonzero(z >= np.uint64(1 << 7))
    k = 1
    while idx.size:
        lengths[idx] += 1
        k += 1
        if k == VARINT_MAX_BYTES:
            break
        idx = idx[z[idx] >= np.uint64(1 << (7 * k))]
    return lengths, multi


def write_varints(out: np.ndarray, z: np.ndarray, lengths: np.ndarray, multi: np.ndarray,
                  starts: np.ndarray) -> None:
    """Write the varint of each ``z``, ``lengths`` bytes long, at ``starts`` in ``out``;
    ``multi``: the positions of those longer than one byte. The first byte of every varint is
    written at once (its low 7 bits, bit 7 set where more follow), then byte k of those still
    that long."""
    first = z.astype(np.uint8)
    first[multi] |= 0x80
    out[starts] = first
    idx = multi
    k = 1
    while idx.size:
        more = lengths[idx] > k + 1
        group = ((z[idx] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        out[starts[idx] + k] = group | (more.astype(np.uint8) << 7)
        idx = idx[more]
        k += 1


def byte_destinations(dest: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Where each byte of segments laid end to end (``lengths`` bytes each) goes when segment k
    starts at ``dest[k]``: one cumulative sum of steps, 1 inside a segment and the jump to the
    next segment's start at its first byte."""
    keep = lengths > 0
    dest, lengths = dest[keep], lengths[keep]
    steps = np.ones(int(lengths.sum()), dtype=np.int64)
    previous_last = np.concatenate([[0], (dest + lengths - 1)[:-1]])  # the sum before a segment
    steps[np.cumsum(lengths) - lengths] = dest - previous_last
    return np.cumsum(steps)


# ---- the encoder --------------------------------------------------------------------------
@dataclass
class Columns:
    """One batch's values, column by column, ready for the assembly (N records)."""

    slot_ints: list[np.ndarray] = field(default_factory=list)  # each varint element's (N,) values
    item_ints: dict[int, np.ndarray] = field(default_factory=dict)  # int array field -> all items
    counts: dict[int, np.ndarray] = field(default_factory=dict)  # array field -> items per record
    fixed: dict[int, np.ndarray] = field(default_factory=dict)  # float/double/boolean field or
    # array of reals -> its bytes, record after record
    texts: dict[int, tuple[bytes, np.ndarray]] = field(default_factory=dict)  # string field -> bytes, lengths
    item_texts: dict[int, tuple[bytes, np.ndarray]] = field(default_factory=dict)  # string array -> the same
    pythons: dict[int, list[bytes]] = field(default_factory=dict)


@dataclass
class Items:
    """One array whose items start with a varint (integers; strings: the byte length, then the
    bytes): its column, the items per record, each item's offset in its record's array, and for
    strings the items' varint lengths and (bytes, byte length of each)."""

    column: int
    counts: np.ndarray
    offsets: np.ndarray
    varint_lengths: np.ndarray
    text: tuple[np.ndarray, np.ndarray] | None


@dataclass
class Layout:
    """Where every element of every record goes: ``lengths`` (N, 1 + elements), the prefix then
    each element's bytes per record, and the varints (zig-zagged values, their lengths, the
    column of the element each belongs to and, for array items, their byte offset in it)."""

    lengths: np.ndarray
    z: np.ndarray
    z_lengths: np.ndarray
    multi: np.ndarray  # positions in z of the varints longer than one byte
    pieces: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (column, bytes) scattered
    items: list[Items] = field(default_factory=list)  # the arrays whose items start with a varint

    def write(self, slot_columns: np.ndarray) -> tuple[bytes, list[int], list[int]]:
        """Every record's bytes in one buffer, and where each record starts and ends in it.
        ``slot_columns``: the columns of the varint elements, whose values come first in ``z``,
        record by record; the :attr:`items`' varints follow, array by array. A varint of length
        0 (an empty block's count) takes the spare byte past the end, which nothing keeps."""
        flat = self.lengths.ravel()
        dest = (np.cumsum(flat) - flat).reshape(self.lengths.shape)
        total = int(flat.sum())
        n_slots = len(self.lengths) * len(slot_columns)
        starts = [np.where(self.z_lengths[:n_slots] > 0, dest[:, slot_columns].ravel(), total)]
        segments = [(dest[:, c], self.lengths[:, c], data) for c, data in self.pieces]
        for items in self.items:
            item_dest = np.repeat(dest[:, items.column], items.counts) + items.offsets
            starts.append(item_dest)
            if items.text is not None:
                segments.append((item_dest + items.varint_lengths, items.text[1], items.text[0]))
        out = np.empty(total + 1, dtype=np.uint8)
        write_varints(out, self.z, self.z_lengths, self.multi, np.concatenate(starts))
        if segments:
            seg_dest = np.concatenate([d for d, _, _ in segments])
            seg_len = np.concatenate([n for _, n, _ in segments])
            source = np.concatenate([data for _, _, data in segments])
            out[byte_destinations(seg_dest, seg_len)] = source
        first = dest[:, 0]
        return out[:total].tobytes(), first.tolist(), (first + self.lengths.sum(axis=1)).tolist()


class FastEncoder:
    """Encodes records of one flat schema many at a time (see the module doc)."""

    def __init__(self, parsed: dict, specs: list[FieldSpec], min_batch: int = MIN_BATCH):
        self.parsed = parsed
        self.specs = specs
        self.min_batch = min_batch
        self.layout = layout_of(specs)
        self.varint_columns = np.array([1 + e for e, el in enumerate(self.layout) if el.how in VARINT_HOWS])
        self.is_count = np.array([el.how == "count" for el in self.layout if el.how in VARINT_HOWS])
        self.checks = [value_check(s) for s in specs]
        self.defaults = {s.name: s.default for s in specs if s.has_default}
        self.names = frozenset(s.name for s in specs)
        self._getters = [operator.itemgetter(s.name) for s in specs]

    def encode_many(self, records: Sequence[dict], prefix: bytes = b"") -> list[bytes]:
        """Each record's Avro body (after ``prefix``) exactly as ``fastavro.schemaless_writer``
        writes it; a record it would refuse raises its error (unchanged, from fastavro). Fewer
        than :attr:`min_batch` records go to fastavro one by one."""
        if len(records) < self.min_batch:
            return [prefix + fastavro_body(self.parsed, r) for r in records]
        if len(records) > MAX_BATCH:
            return [data for at in range(0, len(records), MAX_BATCH)
                    for data in self.encode_many(records[at:at + MAX_BATCH], prefix)]
        complete: Sequence[dict] = records
        slow = set() if set(map(type, records)) == {dict} else {i for i, r in enumerate(records) if type(r) is not dict}
        while True:
            fast = [i for i in range(len(records)) if i not in slow]
            try:
                encoded = self._encode_records([complete[i] for i in fast], prefix) if fast else []
                break
            except KeyError:  # a field left out: fastavro's defaults filled in, then again
                if complete is not records:
                    raise
                complete, slow = self._complete(records)
            except BadRecords as bad:
                slow |= {fast[i] for i in bad.indices} or set(fast)
        out: list[bytes] = [b""] * len(records)
        for i, data in zip(fast, encoded, strict=True):
            out[i] = data
        for i in sorted(slow):
            out[i] = prefix + fastavro_body(self.parsed, records[i])
        return out

    def _complete(self, records: Sequence[dict]) -> tuple[Sequence[dict], set[int]]:
        """``records`` with every field, fastavro's defaults filling in missing ones, and the
        positions of those that are not plain dicts (a Mapping with ``__missing__`` would not
        read as fastavro reads it) or miss a field without a default."""
        names = self.names
        complete: list[dict] = []
        slow: set[int] = set()
        for i, record in enumerate(records):
            filled = {**self.defaults, **record} if type(record) is dict else {}
            complete.append(filled)
            if not names <= filled.keys():
                slow.add(i)
        return complete, slow

    def _encode_records(self, records: list[dict], prefix: bytes) -> list[bytes]:
        n = len(records)
        columns = self._columns([list(map(get, records)) for get in self._getters], n)
        buf, starts, ends = self._write(columns, n, prefix)
        return [buf[s:e] for s, e in zip(starts, ends, strict=True)]

    # -- columns
    def _columns(self, by_field: list[list[Any]], n: int) -> Columns:
        """Every field's values checked and converted; :class:`BadRecords` names the records that
        must go to fastavro."""
        cols = Columns()
        bad: set[int] = set()
        for i, spec in enumerate(self.specs):
            try:
                self._column(cols, i, spec, by_field[i])
            except BadRecords as exc:
                bad |= exc.indices
        if bad:
            raise BadRecords(bad)
        for el in self.layout:
            if el.how in VARINT_HOWS:
                cols.slot_ints.append(self._slot_values(cols, el, n))
        return cols

    def _column(self, cols: Columns, i: int, spec: FieldSpec, column: list[Any]) -> None:
        check = self.checks[i]
        if spec.kind in INTEGER_TYPES:
            bounds = (INT_MIN, INT_MAX) if spec.kind == "int" else (LONG_MIN, LONG_MAX)
            cols.item_ints[i] = int_array(column, check, bounds)
        elif spec.kind in FLOAT_DTYPE:
            cols.fixed[i] = real_array(column, check, FLOAT_DTYPE[spec.kind]).view(np.uint8)
        elif spec.kind == "boolean":
            require(column, set(map(type, column)) <= {bool}, check)
            cols.fixed[i] = np.array(column, dtype=np.uint8)
        elif spec.kind == "string":
            cols.texts[i] = utf8_column(column, check)
        elif spec.kind == "array":
            self._array_column(cols, i, spec, column)
        else:
            cols.pythons[i] = python_column(spec, column)

    def _array_column(self, cols: Columns, i: int, spec: FieldSpec, column: list[Any]) -> None:
        check = self.checks[i]
        require(column, set(map(type, column)) <= {list}, check)
        items = list(itertools.chain.from_iterable(column))
        item_check = ITEM_CHECK[spec.items]
        try:
            if spec.items in INTEGER_TYPES:
                bounds = (INT_MIN, INT_MAX) if spec.items == "int" else (LONG_MIN, LONG_MAX)
                cols.item_ints[i] = int_array(items, item_check, bounds)
            elif spec.items == "string":
                cols.item_texts[i] = utf8_column(items, item_check)
            else:
                cols.fixed[i] = real_array(items, item_check, FLOAT_DTYPE[spec.items]).view(np.uint8)
        except BadRecords:
            raise BadRecords(bad_positions(column, check)) from None
        cols.counts[i] = np.fromiter(map(len, column), dtype=np.int64, count=len(column))

    @staticmethod
    def _slot_values(cols: Columns, el: Element, n: int) -> np.ndarray:
        """The (N,) values of one varint element."""
        if el.how == "end":
            return np.zeros(n, dtype=np.int64)
        if el.how == "length":
            return cols.texts[el.field][1]
        if el.how == "count":
            return cols.counts[el.field]
        return cols.item_ints[el.field]

    # -- bytes
    def _write(self, cols: Columns, n: int, prefix: bytes) -> tuple[bytes, list[int], list[int]]:
        """Lay every element of every record out, then write them: the varints (the varint
        elements record by record, then the integer arrays' items array by array) straight to
        their place, the other elements scattered from their columns."""
        slot_ints = np.stack(cols.slot_ints, axis=1) if cols.slot_ints else np.zeros((n, 0), np.int64)
        arrays = [(e, el.field) for e, el in enumerate(self.layout) if el.how in ITEM_HOWS]
        item_values = [cols.item_ints[f] if f in cols.item_ints else cols.item_texts[f][1] for _, f in arrays]
        z = zigzag(np.concatenate([slot_ints.ravel(), *item_values]))
        z_lengths, multi = varint_lengths(z)
        kv = slot_ints.shape[1]
        slot_lengths = z_lengths[:n * kv].reshape(n, kv)  # a view: zeroing a count zeroes it in z_lengths
        slot_lengths[:, self.is_count] *= slot_ints[:, self.is_count] != 0  # an empty block has no count
        lay = Layout(np.zeros((n, 1 + len(self.layout)), dtype=np.int64), z, z_lengths, multi)
        lay.lengths[:, self.varint_columns] = slot_lengths
        if prefix:
            lay.lengths[:, 0] = len(prefix)
            lay.pieces.append((0, np.frombuffer(prefix * n, dtype=np.uint8)))
        at = n * kv
        for e, f in arrays:
            counts = cols.counts[f]
            item_varints = z_lengths[at:at + int(counts.sum())]
            text = cols.item_texts.get(f)
            item_lengths = item_varints + text[1] if text is not None else item_varints
            ends = np.cumsum(item_lengths)
            byte_ends = np.concatenate([[0], ends])[np.cumsum(counts)]
            record_starts = np.concatenate([[0], byte_ends[:-1]])
            lay.lengths[:, 1 + e] = byte_ends - record_starts
            offsets = ends - item_lengths - np.repeat(record_starts, counts)
            lay.items.append(Items(1 + e, counts, offsets, item_varints,
                                   None if text is None else (np.frombuffer(text[0], np.uint8), text[1])))
            at += len(item_varints)
        for e, el in enumerate(self.layout):
            if el.how not in VARINT_HOWS and el.how not in ITEM_HOWS:
                lengths, data = self._piece(cols, el, n)
                lay.lengths[:, 1 + e] = lengths
                lay.pieces.append((1 + e, data))
        return lay.write(self.varint_columns)

    def _piece(self, cols: Columns, el: Element, n: int) -> tuple[np.ndarray | int, np.ndarray]:
        """(bytes per record, bytes) of one element that is not a varint."""
        if el.how == "utf8":
            data, lengths = cols.texts[el.field]
            return lengths, np.frombuffer(data, dtype=np.uint8)
        if el.how == "python":
            encoded = cols.pythons[el.field]
            return np.fromiter(map(len, encoded), dtype=np.int64, count=n), np.frombuffer(b"".join(encoded), np.uint8)
        spec = self.specs[el.field]
        if el.how == "reals":
            return cols.counts[el.field] * FLOAT_DTYPE[spec.items].itemsize, cols.fixed[el.field]
        return SCALAR_WIDTH[spec.kind], cols.fixed[el.field]  # fixed


def fastavro_body(parsed: Any, record: Any) -> bytes:
    """One record's body by ``fastavro.schemaless_writer`` (the reference, and the slow path)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    return buf.getvalue()


def compile_encoder(parsed: Any, min_batch: int = MIN_BATCH) -> FastEncoder | None:
    """A :class:`FastEncoder` for a parsed record schema; None when a field's type is not one
    the fast path supports (the caller keeps fastavro). Fewer than ``min_batch`` records at
    once are encoded by fastavro one by one."""
    if not isinstance(parsed, dict) or parsed.get("type") != "record" or not parsed.get("fields"):
        return None
    specs = [field_spec(f) for f in parsed["fields"]]
    if any(s is None for s in specs):
        return None
    return FastEncoder(parsed, [s for s in specs if s is not None], min_batch)
