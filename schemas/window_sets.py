"""RankWindowSet: the RankWindows of one job and window a worker closed together, as columns.

One job's RankWindows all go to one core, its diagnoser (keyed by job), while the summarizers
that close them are spread over every worker (keyed job|rank). Sent one record per rank, the
diagnoser's core reads each (Avro decode and validation, ~35 us): at 100,000 ranks, 20,000 a
second, most of one core before any rule runs, and sharding the rules cannot spread it. So the
summarize stage sends the RankWindows that one poll closed for one job and window as one
``RankWindowSet`` (:func:`in_sets`; ``rank_window_set.v1.avsc``; at most :data:`MAX_RANKS` ranks
a set): every RankWindow field is a column of one value per rank -- numbers packed little-endian
in one Avro ``bytes`` (one ``numpy.frombuffer`` each), arrays of numbers as every rank's values
one after another with their lengths beside, strings and maps as Avro arrays -- and each rank's
``functions`` as positions in the set's ``function_names`` (the ranks share most names).
The reading moves to the summarizers' side (packing a rank costs less than encoding its
RankWindow did) and what is left on the diagnoser's core is ~3x cheaper (docs/scaling.md).

:func:`unpack` gives back the RankWindows equal to what decoding each one alone gives
(datetimes for timestamps, float32 values as floats, lists; ``schema_version`` that of the
latest RankWindow schema), so the diagnosis reads the same records whichever way they came.
Pure (numpy, no Kafka or I/O); the columns follow the latest RankWindow schema, read once at
import (tests/unit/schemas/test_window_sets.py holds the bundled set schema to it).
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
    Floats,
    IntArrays,
    Ints,
    Limits,
    RankInWorld,
    Rule,
    StrArrays,
    Strs,
    Times,
    depends_on_record,
)
from .validate import RULES, validate
from .vocabulary import RANK_WINDOW, RANK_WINDOW_SET, RANK_WINDOW_SET_VERSION

MAX_RANKS = 1000  # ranks one set carries (~500 bytes each: a message well under Kafka's 1 MiB)
SHARED = ("job", "window_id", "window_start_ms", "window_s")  # the set's own fields, one value for all
FUNCTIONS = "functions"
_DTYPES: dict[str, np.dtype[Any]] = {"int": np.dtype("<i4"), "long": np.dtype("<i8"), "float": np.dtype("<f4"), "boolean": np.dtype("u1")}
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _defaults() -> dict[str, Any]:
    """The RankWindow fields' schema defaults (what the codec writes for a field left out)."""
    return {f["name"]: f["default"] for f in bundled_schemas().latest(RANK_WINDOW).raw["fields"] if "default" in f}


def _column_kinds() -> tuple[tuple[str, str, np.dtype[Any]], ...]:
    """(field, kind, numpy dtype) of each RankWindow field carried as a column, in schema
    order: kind ``num`` (packed), ``time`` (epoch ms packed as int64), ``ragged`` (an array of
    numbers: packed, lengths beside) or ``avro`` (an Avro array of the field's values)."""
    out = []
    for f in bundled_schemas().latest(RANK_WINDOW).raw["fields"]:
        name, t = f["name"], f["type"]
        if name in (*SHARED, "schema_version", FUNCTIONS):
            continue
        if isinstance(t, dict) and t.get("logicalType") == "timestamp-millis":
            out.append((name, "time", _DTYPES["long"]))
        elif isinstance(t, str) and t in _DTYPES:
            out.append((name, "num", _DTYPES[t]))
        elif isinstance(t, dict) and t.get("type") == "array" and t.get("items") in _DTYPES:
            out.append((name, "ragged", _DTYPES[t["items"]]))
        else:
            out.append((name, "avro", np.dtype(object)))  # not packed
    return tuple(out)


COLUMNS = _column_kinds()
_DEFAULTS = _defaults()
_MISSING = object()
_COLUMN_GETTER = itemgetter(*(name for name, _, _ in COLUMNS))
_RANK_WINDOW_FIELDS = tuple(f["name"] for f in bundled_schemas().latest(RANK_WINDOW).raw["fields"])


def _ms(value: Any) -> int:
    """Epoch ms of a timestamp as a decoded record holds it (a datetime) or as built (an int)."""
    if isinstance(value, datetime):
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return int(value)


def pack(rank_windows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One RankWindowSet of ``rank_windows`` (one job's and one window's, in order)."""
    if not rank_windows:
        raise ValueError("a RankWindowSet holds at least one RankWindow")
    first = rank_windows[0]
    names: dict[str, int] = {}
    lists = [rw.get(FUNCTIONS) or () for rw in rank_windows]
    positions = [names.setdefault(f, len(names)) for functions in lists for f in functions]
    record: dict[str, Any] = {
        "schema_version": RANK_WINDOW_SET_VERSION, **{f: first[f] for f in SHARED}, "ranks": len(rank_windows),
        "function_names": list(names), "functions": np.asarray(positions, _DTYPES["int"]).tobytes(),
        "functions_lengths": np.asarray([len(f) for f in lists], _DTYPES["int"]).tobytes()}
    for (name, kind, dtype), values in zip(COLUMNS, _column_values(rank_windows), strict=True):
        try:
            if kind == "avro":
                record[name] = list(values)
            elif kind == "time":
                record[name] = np.asarray([_ms(v) for v in values], dtype).tobytes()
            elif kind == "ragged":
                record[name] = np.asarray([x for v in values for x in v], dtype).tobytes()
                record[f"{name}_lengths"] = np.asarray([len(v) for v in values], _DTYPES["int"]).tobytes()
            else:
                with np.errstate(over="ignore"):  # a float past float32 becomes inf, as Avro's float writes it
                    record[name] = np.asarray(values, dtype).tobytes()
        except (OverflowError, TypeError, ValueError) as exc:  # what the RankWindow schema would refuse too
            raise SchemaError(f"{RANK_WINDOW_SET}.{name}: a value a {dtype.name} column cannot hold ({exc})") from exc
    return record


def _column_values(rank_windows: Sequence[Mapping[str, Any]]) -> list[Sequence[Any]]:
    """Each column's values (:data:`COLUMNS` order): taken all at once from RankWindows that hold
    every field (as the summarizers build them), else one by one with the schema's defaults."""
    try:
        return list(zip(*map(_COLUMN_GETTER, rank_windows), strict=True))
    except KeyError:
        return [[rw[name] if (default := _DEFAULTS.get(name, _MISSING)) is _MISSING else rw.get(name, default)
                 for rw in rank_windows] for name, _, _ in COLUMNS]


def size(record: Mapping[str, Any]) -> int:
    """How many RankWindows a set carries."""
    return int(record["ranks"])


def in_sets(records: Sequence[tuple[str, Any]], min_ranks: int) -> list[tuple[str, Any]]:
    """``records`` (record name, record) with the RankWindows of each job and window, where there
    are at least ``min_ranks`` (0: never), as RankWindowSets of at most :data:`MAX_RANKS` ranks, at
    the place of the group's first RankWindow; every other record as it is, in order."""
    if min_ranks <= 0:
        return list(records)
    groups: dict[tuple[str, int], list[Any]] = {}
    for name, record in records:
        if name == RANK_WINDOW:
            groups.setdefault((record["job"], int(record["window_id"])), []).append(record)
    if not any(len(g) >= min_ranks for g in groups.values()):
        return list(records)
    out: list[tuple[str, Any]] = []
    for name, record in records:
        group = groups.get((record["job"], int(record["window_id"]))) if name == RANK_WINDOW else None
        if group is None or len(group) < min_ranks:
            out.append((name, record))
        elif group[0] is record:
            out += _packed(group)
    return out


def _packed(group: list[Any]) -> list[tuple[str, Any]]:
    """A group's RankWindowSets of at most :data:`MAX_RANKS` ranks; a part with a value its columns
    cannot hold goes as its RankWindows, alone (the RankWindow codec then refuses what it refuses)."""
    out: list[tuple[str, Any]] = []
    for i in range(0, len(group), MAX_RANKS):
        part = group[i:i + MAX_RANKS]
        try:
            out.append((RANK_WINDOW_SET, pack(part)))
        except SchemaError:
            out += [(RANK_WINDOW, rw) for rw in part]
    return out


def expanded(name: str, record: Any) -> list[tuple[str, Any]]:
    """A RankWindowSet as its RankWindows (each named), any other record as itself: for readers
    of the findings topic that take RankWindows one at a time."""
    return [(RANK_WINDOW, rw) for rw in unpack(record)] if name == RANK_WINDOW_SET else [(name, record)]


def unpack(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The RankWindows of a set, in order (see the module docstring). :class:`SchemaError`
    naming the problem when a column does not hold one value per rank or a function's position
    is outside ``function_names``; the RankWindows' content is for the caller to check
    (:func:`read` checks it)."""
    return _rows(record, _Columns.of(record))


def read(record: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS) -> list[tuple[dict[str, Any], str | None]]:
    """The RankWindows of a set (:func:`unpack`), each with its first problem by the RankWindow
    rules (:func:`..validate.validate`; None: valid). Checked as columns first: the rules bound
    each field by an interval or a length, so a set whose extremes (each column's lowest and
    highest value, its shortest and longest string in bytes, the longest list) pass them all,
    and whose every rank is below its world size, holds no RankWindow that fails; only a set
    that does not pass is checked a RankWindow at a time, to name which."""
    columns = _Columns.of(record)
    rows = _rows(record, columns)
    if rows and _COLUMNS_CHECKABLE and columns.pass_as_extremes(rows[0], limits):
        return [(rw, None) for rw in rows]
    return [(rw, validate(RANK_WINDOW, rw, limits)) for rw in rows]


class _Columns:
    """A set's columns read: one list per RankWindow field (``values``), the packed arrays' values
    before they are cut per rank (``flat``) and their lengths, and the timestamps as epoch ms."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.values: dict[str, list[Any]] = {}
        self.flat: dict[str, list[Any]] = {}
        self.lengths: dict[str, list[int]] = {}
        self.ms: dict[str, list[int]] = {}

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> _Columns:
        out = cls(n := int(record["ranks"]))
        names = record["function_names"]
        flat, lengths = _ragged(record, FUNCTIONS, _DTYPES["int"], n)
        if flat and not 0 <= min(flat) <= max(flat) < len(names):
            raise SchemaError(f"{RANK_WINDOW_SET}.functions holds {min(flat)}..{max(flat)}, outside function_names "
                              f"({len(names)} names)")
        out.flat[FUNCTIONS], out.lengths[FUNCTIONS] = names, lengths  # every name a rank may hold
        out.values[FUNCTIONS] = _split([names[i] for i in flat], lengths)
        for name, kind, dtype in COLUMNS:
            if kind == "avro":
                values = record[name]
                if len(values) != n:
                    raise SchemaError(f"{RANK_WINDOW_SET}.{name} has {len(values)} values for {n} ranks")
                out.values[name] = values
            elif kind == "ragged":
                out.flat[name], out.lengths[name] = _ragged(record, name, dtype, n)
                out.values[name] = _split(out.flat[name], out.lengths[name])
            elif kind == "time":
                out.ms[name] = _numbers(record, name, dtype, n)
                try:  # as the Avro reader turns a timestamp-millis into a datetime
                    out.values[name] = [_EPOCH + timedelta(milliseconds=ms) for ms in out.ms[name]]
                except OverflowError as exc:
                    raise SchemaError(f"{RANK_WINDOW_SET}.{name} holds {max(out.ms[name], key=abs)} ms: "
                                      f"not a time a timestamp can hold ({exc})") from exc
            else:
                values = _numbers(record, name, dtype, n)
                out.values[name] = [bool(v) for v in values] if dtype.kind == "u" else values
        return out

    def pass_as_extremes(self, template: dict[str, Any], limits: Limits) -> bool:
        """Whether every RankWindow of the set passes the RankWindow rules, judged on the columns'
        extremes (see :func:`read`); False also when they cannot tell (then check each)."""
        lo, hi = dict(template), dict(template)
        zero: dict[str, Any] | None = None
        for name, values in self.values.items():
            if name in self.ms:
                ms = self.ms[name]
                set_ms = [v for v in ms if v]
                lo[name], hi[name] = (min(set_ms) if set_ms else 0), max(ms)
                if set_ms and len(set_ms) < len(ms):  # some unset: a third record holds the 0
                    zero = zero if zero is not None else dict(template)
                    zero[name] = 0
            elif name in self.lengths:
                if max(self.lengths[name], default=0) > limits.max_items:
                    return False
                flat = self.flat[name]
                if flat and isinstance(flat[0], str):
                    lo[name] = hi[name] = [_longest(flat)]
                elif flat:
                    if isinstance(flat[0], float) and not math.isfinite(sum(flat)):
                        return False
                    lo[name], hi[name] = [min(flat)], [max(flat)]
            elif values and isinstance(values[0], str):
                lo[name], hi[name] = min(values, key=len), _longest(values)
            elif values and type(values[0]) in (int, float):
                if isinstance(values[0], float) and not math.isfinite(sum(values)):
                    return False
                lo[name], hi[name] = min(values), max(values)
        ranks, worlds = self.values["rank"], self.values["world_size"]
        if any(r >= w and w != 0 for r, w in zip(ranks, worlds, strict=True)):  # rule RankInWorld, per rank
            return False
        return all(validate(RANK_WINDOW, r, limits) is None for r in (lo, hi, zero) if r is not None)


def _longest(strings: list[str]) -> str:
    """The longest of ``strings`` in UTF-8 bytes (in characters when all are ASCII: the same, faster)."""
    if all(map(str.isascii, strings)):
        return max(strings, key=len)
    return max(strings, key=lambda s: len(s.encode("utf-8", "surrogatepass")))


def _rows(record: Mapping[str, Any], columns: _Columns) -> list[dict[str, Any]]:
    """The RankWindow dicts of a set's columns, each key in a decoded RankWindow's order."""
    shared = {"schema_version": bundled_schemas().latest(RANK_WINDOW).version, **{f: record[f] for f in SHARED}}
    sources = [repeat(shared[f]) if f in shared else columns.values[f] for f in _RANK_WINDOW_FIELDS]
    # the shared fields repeat without end; every column was checked to hold n values
    return [dict(zip(_RANK_WINDOW_FIELDS, row, strict=True)) for row in zip(*sources, strict=False)]


def _checkable(rules: tuple[Rule, ...]) -> bool:
    """Whether the extremes of the columns decide every rule (:meth:`_Columns.pass_as_extremes`): rules
    that bound a field by an interval or a length with bounds of their own, and rank < world size,
    which is checked per rank; any other rule and every set is checked a RankWindow at a time."""
    string = {f["name"] for f in bundled_schemas().latest(RANK_WINDOW).raw["fields"] if f["type"] == "string"}
    reduced = {*SHARED, FUNCTIONS, *(name for name, kind, _ in COLUMNS if kind != "avro" or name in string)}
    for rule in rules:
        if not set(getattr(rule, "fields", ())) <= reduced:  # a field whose extremes are not taken
            return False
        if isinstance(rule, (Ints, IntArrays)) and (depends_on_record(rule.lo) or depends_on_record(rule.hi)):
            return False
        if not isinstance(rule, (Ints, Floats, Strs, Times, IntArrays, StrArrays, RankInWorld)):
            return False
        if isinstance(rule, RankInWorld) and (rule.rank, rule.world) != ("rank", "world_size"):
            return False
    return True


_COLUMNS_CHECKABLE = _checkable(RULES[RANK_WINDOW])


def _ragged(record: Mapping[str, Any], name: str, dtype: np.dtype[Any], n: int) -> tuple[list[Any], list[int]]:
    """A packed array column of ``n`` ranks: every rank's values one after another, and their counts."""
    lengths = _numbers(record, f"{name}_lengths", _DTYPES["int"], n)
    return _numbers(record, name, dtype, sum(lengths) if min(lengths, default=0) >= 0 else -1), lengths


def _split(flat: list[Any], lengths: list[int]) -> list[list[Any]]:
    """``flat`` cut into consecutive lists of ``lengths`` (their sum is ``len(flat)``)."""
    return [flat[e - k:e] for e, k in zip(accumulate(lengths), lengths, strict=True)]


def _numbers(record: Mapping[str, Any], name: str, dtype: np.dtype, count: int) -> list[Any]:
    """A packed column as a list of ``count`` Python numbers (SchemaError when it holds another count)."""
    raw = record[name]
    if len(raw) != count * dtype.itemsize or count < 0:
        raise SchemaError(f"{RANK_WINDOW_SET}.{name} is {len(raw)} bytes, not {max(count, 0)} {dtype.name} values")
    values: list[Any] = np.frombuffer(raw, dtype).tolist()
    return values
