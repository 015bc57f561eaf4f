"""Record sets: the records of one key and window a worker closed together, as one record of columns.

A summarize poll closes, for every rank it holds, one FunctionPattern per function and one
RankWindow per window. The patterns of one function go to one core (its comparator, keyed
job|function) and the RankWindows of one job to one core (its diagnoser, keyed by job), which
read each record alone: an Avro decode and a validation, ~25 us a FunctionPattern and ~37 us a
RankWindow, most of what those stages cost (docs/benchmarks.md). So the summarize stage sends the
records one poll closed for one key and window as one set (:func:`in_sets`):
``RankWindowSet`` (``rank_window_set.v1.avsc``) and ``FunctionPatternSet``
(``function_pattern_set.v1.avsc``), at most :data:`MAX_RECORDS` records a set. Every field of the
member record is a column of one value per record -- numbers packed little-endian in one Avro
``bytes`` (one ``numpy.frombuffer`` each), arrays of numbers as every record's values one after
another with their lengths beside, strings and maps as Avro arrays --, the fields every member
shares (job, window, a pattern's function) are the set's own, and a RankWindow's ``functions``
are positions in the set's ``function_names`` (the ranks share most names).

:func:`unpack` gives back the member records equal to what decoding each one alone gives
(datetimes for timestamps, float32 values as floats, lists, the keys in the schema's order;
``schema_version`` that of the latest member schema), so every stage reads the same records
whichever way they came; :func:`read` also gives each one's verdict by the member's content
rules, checked as columns where the rules allow. Pure (numpy, no Kafka or I/O); the columns
follow the latest member schemas, read once at import (tests/unit/schemas/test_record_sets.py
holds the bundled set schemas to them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from itertools import accumulate, repeat
from operator import itemgetter
from typing import Any

import numpy as np

from .codec import bundled_schemas
from .errors import SchemaError
from .rules import (
    DEFAULT_LIMITS,
    Check,
    Floats,
    IntArrays,
    Ints,
    Limits,
    Rule,
    StrArrays,
    Strs,
    Times,
    bind_all,
    depends_on_record,
    run,
)
from .validate import RULES, validate
from .vocabulary import (
    FUNCTION_PATTERN,
    FUNCTION_PATTERN_SET,
    RANK_WINDOW,
    RANK_WINDOW_SET,
)

MAX_RECORDS = 1000  # records one set carries (a RankWindow ~500 bytes in one: well under Kafka's 1 MiB)
_DTYPES: dict[str, np.dtype[Any]] = {"int": np.dtype("<i4"), "long": np.dtype("<i8"), "float": np.dtype("<f4"),
                                     "boolean": np.dtype("u1")}
_INT32 = _DTYPES["int"]
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MISSING = object()
Verdicts = list[tuple[dict[str, Any], "str | None"]]


def _ms(value: Any) -> int:
    """Epoch ms of a timestamp as a decoded record holds it (a datetime) or as built (an int)."""
    if isinstance(value, datetime):
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return int(value)


class SetFormat:
    """How the sets of one member record are made and read: its columns, from the latest member
    schema (``shared``: the fields every member of a set holds alike, the set's own; ``names``: a
    string-array field sent as positions in the set's ``function_names``)."""

    def __init__(self, member: str, name: str, shared: tuple[str, ...], names: str | None = None):
        self.member, self.name, self.shared, self.names = member, name, shared, names
        self.version = bundled_schemas().latest(name).version
        self.member_version = bundled_schemas().latest(member).version  # what the members read back carry
        fields = bundled_schemas().latest(member).raw["fields"]
        self.fields = tuple(f["name"] for f in fields)
        self.defaults = {f["name"]: f["default"] for f in fields if "default" in f}
        self.columns = tuple((f["name"], *_kind(f["type"])) for f in fields
                             if f["name"] not in (*shared, "schema_version", names))
        self._getter = itemgetter(*(c for c, _, _ in self.columns))
        string = {f["name"] for f in fields if f["type"] == "string"}
        self._reduced = {*shared, *([names] if names else []),
                         *(c for c, kind, _ in self.columns if kind != "avro" or c in string)}
        rules = RULES[member]
        self._by_extremes = tuple(r for r in rules if self._decided(r))  # checked on the columns' extremes
        self._per_record = tuple(r for r in rules if not self._decided(r))  # the others, on each record
        self._bound: dict[Limits, tuple[tuple[Check, ...], tuple[Check, ...]]] = {}

    # ---- writing -------------------------------------------------------------------------------
    def pack(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """One set of ``records`` (members of one key and window, in order). SchemaError naming the
        column when a value does not fit it (what the member schema would refuse too)."""
        if not records:
            raise ValueError(f"a {self.name} holds at least one record")
        first = records[0]
        out: dict[str, Any] = {"schema_version": self.version, **{f: first[f] for f in self.shared},
                               "ranks": len(records)}
        if self.names:
            table: dict[str, int] = {}
            lists = [r.get(self.names) or () for r in records]
            positions = [table.setdefault(s, len(table)) for one in lists for s in one]
            out["function_names"] = list(table)
            out[self.names] = _packed_ints(positions)
            out[f"{self.names}_lengths"] = _packed_ints([len(one) for one in lists])
        for (name, kind, dtype), values in zip(self.columns, self._column_values(records), strict=True):
            try:
                if kind == "avro":
                    out[name] = list(values)
                elif kind == "time":
                    out[name] = np.asarray([_ms(v) for v in values], dtype).tobytes()
                elif kind == "ragged":
                    out[name] = np.asarray([x for v in values for x in v], dtype).tobytes()
                    out[f"{name}_lengths"] = _packed_ints([len(v) for v in values])
                else:
                    with np.errstate(over="ignore"):  # a float past float32 becomes inf, as Avro's float writes it
                        out[name] = np.asarray(values, dtype).tobytes()
            except (OverflowError, TypeError, ValueError) as exc:
                raise SchemaError(f"{self.name}.{name}: a value a {dtype.name} column cannot hold ({exc})") from exc
        return out

    def _column_values(self, records: Sequence[Mapping[str, Any]]) -> list[Sequence[Any]]:
        """Each column's values: all at once from records that hold every field (as the summarizers
        build them), else one by one with the schema's defaults."""
        try:
            return list(zip(*map(self._getter, records), strict=True))
        except KeyError:
            return [[r[c] if (d := self.defaults.get(c, _MISSING)) is _MISSING else r.get(c, d) for r in records]
                    for c, _, _ in self.columns]

    # ---- reading -------------------------------------------------------------------------------
    def unpack(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The members of a set, in order. SchemaError naming the problem, and nothing else, when the
        set cannot be read: a column that does not hold one value per member, a name's position
        outside ``function_names``, a field missing or of the wrong type; the members' content is for
        the caller to check (:meth:`read` checks it)."""
        return self._members(record)[1]

    def read(self, record: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS) -> Verdicts:
        """The members of a set, each with its first problem by the member's content rules
        (:func:`..validate.validate`; None: valid). The rules that bound a field by an interval or a
        length are checked on the columns' extremes -- each column's lowest and highest value, its
        shortest and longest string in bytes, its longest list: a set whose extremes pass them holds
        no member that fails them --, the others (rank < world size, a total within its count, a
        range of members, columns of one length) on each member; only a set that does not pass is
        checked a member at a time by every rule, to name which member and why."""
        columns, rows = self._members(record)
        if rows and self._all_pass(columns, rows, limits):
            return [(r, None) for r in rows]
        return [(r, validate(self.member, r, limits)) for r in rows]

    def _members(self, record: Mapping[str, Any]) -> tuple[_Columns, list[dict[str, Any]]]:
        """The set's columns and its members (see :meth:`unpack`)."""
        try:
            columns = self._columns(record)
            return columns, self._rows(record, columns)
        except (KeyError, TypeError, ValueError) as exc:  # a field missing, or not what its schema says
            raise SchemaError(f"{self.name}: {type(exc).__name__}: {exc}") from exc

    def _columns(self, record: Mapping[str, Any]) -> _Columns:
        n = int(record["ranks"])
        out = _Columns()
        if self.names:
            names = record["function_names"]
            flat, lengths = self._ragged(record, self.names, _INT32, n)
            if flat and not 0 <= min(flat) <= max(flat) < len(names):
                raise SchemaError(f"{self.name}.{self.names} holds {min(flat)}..{max(flat)}, outside "
                                  f"function_names ({len(names)} names)")
            out.flat[self.names], out.lengths[self.names] = names, lengths  # every name a member may hold
            out.values[self.names] = _split([names[i] for i in flat], lengths)
        for name, kind, dtype in self.columns:
            if kind == "avro":
                values = record[name]
                if len(values) != n:
                    raise SchemaError(f"{self.name}.{name} has {len(values)} values for {n} records")
                out.values[name] = values
            elif kind == "ragged":
                out.flat[name], out.lengths[name] = self._ragged(record, name, dtype, n)
                out.values[name] = _split(out.flat[name], out.lengths[name])
            elif kind == "time":
                out.ms[name] = self._numbers(record, name, dtype, n)
                try:  # as the Avro reader turns a timestamp-millis into a datetime
                    out.values[name] = [_EPOCH + timedelta(milliseconds=ms) for ms in out.ms[name]]
                except OverflowError as exc:
                    raise SchemaError(f"{self.name}.{name} holds {max(out.ms[name], key=abs)} ms: not a time "
                                      f"a timestamp can hold ({exc})") from exc
            else:
                values = self._numbers(record, name, dtype, n)
                out.values[name] = [bool(v) for v in values] if dtype.kind == "u" else values
        return out

    def _rows(self, record: Mapping[str, Any], columns: _Columns) -> list[dict[str, Any]]:
        """The member dicts of a set's columns, each key in a decoded member's order."""
        shared = {"schema_version": self.member_version, **{f: record[f] for f in self.shared}}
        sources = [repeat(shared[f]) if f in shared else columns.values[f] for f in self.fields]
        # the shared fields repeat without end; every column was checked to hold n values
        return [dict(zip(self.fields, row, strict=True)) for row in zip(*sources, strict=False)]

    def _all_pass(self, columns: _Columns, rows: list[dict[str, Any]], limits: Limits) -> bool:
        """Whether every member passes every rule (see :meth:`read`); False also when the columns
        cannot tell (then each member is checked by every rule)."""
        bound = self._bound.get(limits)
        if bound is None:
            bound = self._bound[limits] = (bind_all(self._by_extremes, limits), bind_all(self._per_record, limits))
        by_extremes, per_record = bound
        try:
            extremes = self._extremes(columns, rows[0], limits)
            return (extremes is not None and all(run(by_extremes, r, r) is None for r in extremes)
                    and all(run(per_record, r, r) is None for r in rows))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError):
            return False

    def _extremes(self, columns: _Columns, template: dict[str, Any], limits: Limits) -> list[dict[str, Any]] | None:
        """Records holding the columns' extremes (see :meth:`read`), or None when a column rules out
        judging by them (a list longer than any record may hold, a float that is not finite)."""
        lo, hi = dict(template), dict(template)
        zero: dict[str, Any] | None = None
        for name, values in columns.values.items():
            if name in columns.ms:
                ms = columns.ms[name]
                set_ms = [v for v in ms if v]
                lo[name], hi[name] = (min(set_ms) if set_ms else 0), max(ms)
                if set_ms and len(set_ms) < len(ms):  # some unset: a third record holds the 0
                    zero = zero if zero is not None else dict(template)
                    zero[name] = 0
            elif name in columns.lengths:
                if max(columns.lengths[name], default=0) > limits.max_items:
                    return None
                flat = columns.flat[name]
                if flat and isinstance(flat[0], str):
                    lo[name] = hi[name] = [_longest(flat)]
                elif flat:
                    if isinstance(flat[0], float) and not math.isfinite(sum(flat)):
                        return None
                    lo[name], hi[name] = [min(flat)], [max(flat)]
            elif values and isinstance(values[0], str):
                lo[name], hi[name] = min(values, key=len), _longest(values)
            elif values and type(values[0]) in (int, float):
                if isinstance(values[0], float) and not math.isfinite(sum(values)):
                    return None
                lo[name], hi[name] = min(values), max(values)
        return [lo, hi] if zero is None else [lo, hi, zero]

    def _decided(self, rule: Rule) -> bool:
        """Whether the columns' extremes decide ``rule`` (:meth:`_all_pass`): a bound of one field by
        an interval or a length with bounds of its own, on a field whose extremes are taken."""
        if not isinstance(rule, (Ints, Floats, Strs, Times, IntArrays, StrArrays)):
            return False
        if isinstance(rule, (Ints, IntArrays)) and (depends_on_record(rule.lo) or depends_on_record(rule.hi)):
            return False
        return set(rule.fields) <= self._reduced

    def _ragged(self, record: Mapping[str, Any], name: str, dtype: np.dtype[Any], n: int) -> tuple[list[Any], list[int]]:
        """A packed array column of ``n`` members: every member's values one after another, and their counts."""
        lengths = self._numbers(record, f"{name}_lengths", _INT32, n)
        return self._numbers(record, name, dtype, sum(lengths) if min(lengths, default=0) >= 0 else -1), lengths

    def _numbers(self, record: Mapping[str, Any], name: str, dtype: np.dtype[Any], count: int) -> list[Any]:
        """A packed column as ``count`` Python numbers (SchemaError when it holds another count)."""
        raw = record[name]
        if count < 0 or len(raw) != count * dtype.itemsize:
            raise SchemaError(f"{self.name}.{name} is {len(raw)} bytes, not {max(count, 0)} {dtype.name} values")
        values: list[Any] = np.frombuffer(raw, dtype).tolist()
        return values


class _Columns:
    """A set's columns read: one list per member field (``values``), the packed arrays' values before
    they are cut per member (``flat``) and their lengths, and the timestamps as epoch ms."""

    def __init__(self) -> None:
        self.values: dict[str, Sequence[Any]] = {}
        self.flat: dict[str, list[Any]] = {}
        self.lengths: dict[str, list[int]] = {}
        self.ms: dict[str, list[int]] = {}


def _kind(t: Any) -> tuple[str, np.dtype[Any]]:
    """How a member field of Avro type ``t`` is carried: ``num`` (packed), ``time`` (epoch ms packed
    as int64), ``ragged`` (an array of numbers: packed, lengths beside) or ``avro`` (an Avro array)."""
    if isinstance(t, dict) and t.get("logicalType") == "timestamp-millis":
        return "time", _DTYPES["long"]
    if isinstance(t, str) and t in _DTYPES:
        return "num", _DTYPES[t]
    if isinstance(t, dict) and t.get("type") == "array" and t.get("items") in _DTYPES:
        return "ragged", _DTYPES[t["items"]]
    return "avro", np.dtype(object)


def _packed_ints(values: list[int]) -> bytes:
    return np.asarray(values, _INT32).tobytes()


def _longest(strings: Sequence[str]) -> str:
    """The longest of ``strings`` in UTF-8 bytes (in characters when all are ASCII: the same, faster)."""
    if all(map(str.isascii, strings)):
        return max(strings, key=len)
    return max(strings, key=lambda s: len(s.encode("utf-8", "surrogatepass")))


def _split(flat: list[Any], lengths: list[int]) -> list[list[Any]]:
    """``flat`` cut into consecutive lists of ``lengths`` (their sum is ``len(flat)``)."""
    return [flat[e - k:e] for e, k in zip(accumulate(lengths), lengths, strict=True)]


_WINDOW_FIELDS = ("job", "window_id", "window_start_ms", "window_s")
FORMATS: dict[str, SetFormat] = {  # by member record
    RANK_WINDOW: SetFormat(RANK_WINDOW, RANK_WINDOW_SET, _WINDOW_FIELDS, names="functions"),
    FUNCTION_PATTERN: SetFormat(FUNCTION_PATTERN, FUNCTION_PATTERN_SET, (*_WINDOW_FIELDS, "function")),
}
BY_SET: dict[str, SetFormat] = {f.name: f for f in FORMATS.values()}
SET_NAMES = frozenset(BY_SET)


def size(record: Mapping[str, Any]) -> int:
    """How many records a set carries."""
    return int(record["ranks"])


def member(set_name: str) -> str:
    """The record a set named ``set_name`` carries."""
    return BY_SET[set_name].member


def read(set_name: str, record: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS) -> Verdicts:
    """:meth:`SetFormat.read` of the set named ``set_name``."""
    return BY_SET[set_name].read(record, limits)


def problem(set_name: str, member: Mapping[str, Any], reason: str) -> str:
    """The dead-letter reason of a set's member that fails its rules (its rank named)."""
    return f"invalid: {set_name} rank {member.get('rank')}: {reason}"


def unpack(set_name: str, record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """:meth:`SetFormat.unpack` of the set named ``set_name``."""
    return BY_SET[set_name].unpack(record)


def in_sets(records: Sequence[tuple[str, Any]], min_records: int) -> list[tuple[str, Any]]:
    """``records`` (record name, record) with the RankWindows and FunctionPatterns of each key and
    window (the fields a set shares), where there are at least ``min_records`` (0: never), as sets
    of at most :data:`MAX_RECORDS`, at the place of the group's first record; every other record as
    it is, in order. A part with a value its columns cannot hold goes as its records, alone."""
    if min_records <= 0:
        return list(records)
    groups: dict[tuple[Any, ...], list[Any]] = {}
    keys: list[tuple[Any, ...] | None] = []
    for name, record in records:
        fmt = FORMATS.get(name)
        key = (name, *(record[f] for f in fmt.shared)) if fmt is not None else None
        keys.append(key)
        if key is not None:
            groups.setdefault(key, []).append(record)
    if not any(len(g) >= min_records for g in groups.values()):
        return list(records)
    out: list[tuple[str, Any]] = []
    for (name, record), key in zip(records, keys, strict=True):
        group = groups.get(key) if key is not None else None
        if group is None or len(group) < min_records:
            out.append((name, record))
        elif group[0] is record:
            out += _packed(FORMATS[name], group)
    return out


def _packed(fmt: SetFormat, group: list[Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for i in range(0, len(group), MAX_RECORDS):
        part = group[i:i + MAX_RECORDS]
        try:
            out.append((fmt.name, fmt.pack(part)))
        except SchemaError:
            out += [(fmt.member, r) for r in part]
    return out


def expanded(name: str, record: Any) -> list[tuple[str, Any]]:
    """A set as its members (each named), any other record as itself: for readers that take the
    records one at a time."""
    fmt = BY_SET.get(name)
    return [(fmt.member, r) for r in fmt.unpack(record)] if fmt is not None else [(name, record)]
