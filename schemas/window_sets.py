"""RankWindowSet: the RankWindows of one job and window a worker closed together, as columns.

One job's RankWindows all go to one core, its diagnoser (keyed by job), while the summarizers
that close them are spread over every worker (keyed job|rank). Sent one record per rank, the
diagnoser's core reads each (Avro decode and validation, ~35 us): at 100,000 ranks, 20,000 a
second, most of one core before any rule runs, and sharding the rules cannot spread it. So the
summarize stage sends the RankWindows that one poll closed for one job and window as one
``RankWindowSet`` (:func:`in_sets`; ``rank_window_set.v1.avsc``; at most :data:`MAX_RANKS` ranks
a set): every RankWindow field is a column of one value per rank -- numbers packed little-endian
in one Avro ``bytes`` (one ``numpy.frombuffer`` each), arrays of numbers as every rank's values
one after another with their lengths beside, strings and maps as Avro arrays -- and the ranks of
``functions`` lists are positions in the set's ``function_names`` (the ranks share most names).
The reading moves to the summarizers' side (packing a rank costs less than encoding its
RankWindow did) and what is left on the diagnoser's core is ~3x cheaper (docs/scaling.md).

:func:`unpack` gives back the RankWindows equal to what decoding each one alone gives
(datetimes for timestamps, float32 values as floats, lists; ``schema_version`` that of the
latest RankWindow schema), so the diagnosis reads the same records whichever way they came.
Pure (numpy, no Kafka or I/O); the columns follow the latest RankWindow schema, read once at
import (tests/unit/schemas/test_window_sets.py holds the bundled set schema to it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from itertools import accumulate, repeat
from typing import Any

import numpy as np

from .codec import bundled_schemas
from .errors import SchemaError
from .vocabulary import RANK_WINDOW, RANK_WINDOW_SET, RANK_WINDOW_SET_VERSION

MAX_RANKS = 1000  # ranks one set carries (~350 bytes each: a message well under Kafka's 1 MiB)
SHARED = ("job", "window_id", "window_start_ms", "window_s")  # the set's own fields, one value for all
FUNCTIONS = "functions"
_DTYPES: dict[str, np.dtype[Any]] = {"int": np.dtype("<i4"), "long": np.dtype("<i8"), "float": np.dtype("<f4"), "boolean": np.dtype("u1")}
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _defaults() -> dict[str, Any]:
    """The RankWindow fields' schema defaults (what the codec writes for a field left out)."""
    return {f["name"]: f["default"] for f in bundled_schemas().latest(RANK_WINDOW).raw["fields"] if "default" in f}


def _column_kinds() -> tuple[tuple[str, str, np.dtype[Any]], ...]:
    """(field, kind, numpy dtype or None) of each RankWindow field carried as a column, in schema
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
    for name, kind, dtype in COLUMNS:
        default = _DEFAULTS.get(name, _MISSING)
        values = [rw[name] if default is _MISSING else rw.get(name, default) for rw in rank_windows]
        if kind == "avro":
            record[name] = values
        elif kind == "time":
            record[name] = np.asarray([_ms(v) for v in values], dtype).tobytes()
        elif kind == "ragged":
            record[name] = np.asarray([x for v in values for x in v], dtype).tobytes()
            record[f"{name}_lengths"] = np.asarray([len(v) for v in values], _DTYPES["int"]).tobytes()
        else:
            record[name] = np.asarray(values, dtype).tobytes()
    return record


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
            out += [(RANK_WINDOW_SET, pack(group[i:i + MAX_RANKS])) for i in range(0, len(group), MAX_RANKS)]
    return out


def expanded(name: str, record: Any) -> list[tuple[str, Any]]:
    """A RankWindowSet as its RankWindows (each named), any other record as itself: for readers
    of the findings topic that take RankWindows one at a time."""
    return [(RANK_WINDOW, rw) for rw in unpack(record)] if name == RANK_WINDOW_SET else [(name, record)]


def unpack(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The RankWindows of a set, in order (see the module docstring). :class:`SchemaError`
    naming the problem when a column does not hold one value per rank or a function's position
    is outside ``function_names``; the RankWindows' content is for the caller to check (RankWindow rules)."""
    n = int(record["ranks"])
    names = record["function_names"]
    flat, lengths = _ragged(record, FUNCTIONS, _DTYPES["int"], n)
    if flat and not 0 <= min(flat) <= max(flat) < len(names):
        raise SchemaError(f"{RANK_WINDOW_SET}.functions holds {min(flat)}..{max(flat)}, outside function_names "
                          f"({len(names)} names)")
    columns: dict[str, Any] = {FUNCTIONS: _split([names[i] for i in flat], lengths)}
    for name, kind, dtype in COLUMNS:
        if kind == "avro":
            values = record[name]
            if len(values) != n:
                raise SchemaError(f"{RANK_WINDOW_SET}.{name} has {len(values)} values for {n} ranks")
            columns[name] = values
        elif kind == "ragged":
            columns[name] = _split(*_ragged(record, name, dtype, n))
        else:
            values = _numbers(record, name, dtype, n)
            columns[name] = ([_EPOCH + timedelta(milliseconds=ms) for ms in values] if kind == "time" else
                             [bool(v) for v in values] if dtype.kind == "u" else values)
    shared = {"schema_version": bundled_schemas().latest(RANK_WINDOW).version, **{f: record[f] for f in SHARED}}
    sources = [repeat(shared[f]) if f in shared else columns[f] for f in _RANK_WINDOW_FIELDS]
    # the shared fields repeat without end; every column was checked to hold n values
    return [dict(zip(_RANK_WINDOW_FIELDS, row, strict=True)) for row in zip(*sources, strict=False)]


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
