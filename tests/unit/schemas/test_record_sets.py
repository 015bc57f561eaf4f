"""Record sets (schemas/record_sets.py): the RankWindows of one job and the FunctionPatterns of
one function a worker closed together for a window, as columns. Read back, each record is what
decoding it alone gives, and its verdict the one its rules give it alone; corrupt columns are
refused with a reason naming them; each set schema follows its record's schema."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker_ml.schemas import Codec, SchemaError, bundled_schemas, record_sets
from perftracker_ml.schemas.record_sets import FORMATS, expanded, in_sets
from perftracker_ml.schemas.validate import validate
from perftracker_ml.schemas.vocabulary import (
    FUNCTION_PATTERN,
    FUNCTION_PATTERN_SET,
    RANK_WINDOW,
    RANK_WINDOW_SET,
)

from ..streams.detect.synth import pattern, rank_window

RW, SET = Codec(RANK_WINDOW), Codec(RANK_WINDOW_SET)
RW_FIELDS = bundled_schemas().latest(RANK_WINDOW).raw["fields"]
RWF = FORMATS[RANK_WINDOW]
pack, unpack = RWF.pack, RWF.unpack
MEMBERS = (RANK_WINDOW, FUNCTION_PATTERN)


def _fields(member: str) -> list[dict[str, Any]]:
    return bundled_schemas().latest(member).raw["fields"]


def _value(t: Any) -> st.SearchStrategy[Any]:
    """Any value of an Avro type of the RankWindow schema."""
    if isinstance(t, dict) and t.get("logicalType") == "timestamp-millis":
        return st.integers(0, 4_102_444_800_000)
    if isinstance(t, dict) and t["type"] == "array":
        return st.lists(_value(t["items"]), max_size=4)
    if isinstance(t, dict) and t["type"] == "map":
        return st.dictionaries(st.text(max_size=4), _value(t["values"]), max_size=3)
    return {"int": st.integers(-(2**31), 2**31 - 1), "long": st.integers(-(2**63), 2**63 - 1),
            "float": st.floats(width=32, allow_nan=False), "boolean": st.booleans(),
            "string": st.text(max_size=6)}[t]


def _member(name: str, shared: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    own = {f["name"]: _value(f["type"]) for f in _fields(name) if f["name"] not in shared}
    if name == RANK_WINDOW:  # ranks of one signature send one functions list: draw from a few
        own["functions"] = st.sampled_from([[], ["comm:all_reduce:g", "Model.forward"], ["Model.forward"]]) | own["functions"]
    return st.fixed_dictionaries({**{k: st.just(v) for k, v in shared.items()}, **own})


SHARED = {"schema_version": bundled_schemas().latest(RANK_WINDOW).version, "job": "job-1", "window_id": 340000000,
          "window_start_ms": 1_700_000_000_000, "window_s": 5.0}
SHARED_OF = {RANK_WINDOW: SHARED, FUNCTION_PATTERN: {**SHARED, "function": "Model.forward",
                                                      "schema_version": bundled_schemas().latest(FUNCTION_PATTERN).version}}


@pytest.mark.parametrize("name", MEMBERS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_record_of_a_set_reads_back_as_decoding_it_alone_gives_it(name, data):
    records = data.draw(st.lists(_member(name, SHARED_OF[name]), min_size=1, max_size=12))
    fmt, one, many = FORMATS[name], Codec(name), Codec(FORMATS[name].name)
    alone = [one.decode(one.encode(r)) for r in records]
    from_set = fmt.unpack(many.decode(many.encode(fmt.pack(records))))
    assert from_set == alone
    assert [list(r) for r in from_set] == [list(r) for r in alone]  # the keys in the same order too


def test_the_ranks_share_their_function_names():
    functions = [f"megatron.core.transformer.layer_{i}.forward" for i in range(30)]
    rws = [{**rank_window(r, world=8), "schema_version": 6, "functions": [*functions, f"comm:all_reduce:dp{r % 2}"]}
           for r in range(8)]
    record = pack(rws)
    assert len(record["function_names"]) == 32 and record_sets.size(record) == 8
    assert len(SET.encode(record)) < sum(len(RW.encode(rw)) for rw in rws) / 2
    assert [rw["functions"] for rw in unpack(record)] == [rw["functions"] for rw in rws]


@pytest.mark.parametrize("name", MEMBERS)
def test_the_set_schema_holds_every_field_of_its_record_as_a_column(name):
    fmt = FORMATS[name]
    fields = {f["name"]: f for f in bundled_schemas().latest(fmt.name).raw["fields"]}
    for f in _fields(name):
        column, t = f["name"], f["type"]
        if column in ("schema_version", *fmt.shared):
            assert fields[column]["type"] == t  # the set's own, one for all its records
        elif column == fmt.names:
            assert fields["function_names"]["type"] == t
            assert fields[column]["type"] == fields[f"{column}_lengths"]["type"] == "bytes"
        elif isinstance(t, dict) and t["type"] == "array" and t["items"] in ("int", "long", "float"):
            assert fields[column]["type"] == fields[f"{column}_lengths"]["type"] == "bytes"
        elif t in ("int", "long", "float", "boolean") or (isinstance(t, dict) and "logicalType" in t):
            assert fields[column]["type"] == "bytes", column
        else:
            assert fields[column]["type"] == {"type": "array", "items": t}, column
    assert set(fields) - {f["name"] for f in _fields(name)} == {
        "ranks", *(["function_names", f"{fmt.names}_lengths"] if fmt.names else []),
        *(f"{c}_lengths" for c, k, _ in fmt.columns if k == "ragged")}
    packed = [f for f in fields.values() if f["type"] == "bytes"]
    assert all(any(w in f.get("doc", "") for w in ("int32", "int64", "float32", "uint8")) for f in packed)


def _good() -> dict[str, Any]:
    return SET.decode(SET.encode(pack([{**rank_window(r, world=4), "schema_version": 6} for r in range(4)])))


@pytest.mark.parametrize(("change", "named"), [
    ({"rank": b"\x00" * 12}, "rank is 12 bytes, not 4 int32 values"),
    ({"host": ["h"] * 3}, "host has 3 values for 4 records"),
    ({"functions": b"\x07\x00\x00\x00", "functions_lengths": b"\x01\x00\x00\x00" + b"\x00" * 12},
     "functions holds 7..7, outside function_names"),
    ({"step_time_ns_lengths": b"\xff\xff\xff\xff" * 4}, "step_time_ns is"),
    ({"ranks": -1}, "is"),
])
def test_corrupt_columns_are_refused_with_a_reason_naming_them(change, named):
    with pytest.raises(SchemaError, match=named):
        unpack({**_good(), **change})


def test_a_rank_window_of_a_set_breaking_its_rules_is_named_by_the_rank_window_rules():
    bad = unpack(_good())[2] | {"restarts": -1}
    assert validate(RANK_WINDOW, bad) == "RankWindow.restarts = -1: outside [0, 9223372036854775807]"


def test_in_sets_groups_each_key_and_window_in_place_of_its_first_record(monkeypatch):
    def rw(job: str, window: int, rank: int) -> dict[str, Any]:
        return {**rank_window(rank, world=16, window_id=window), "job": job}

    fp = [pattern(r, "Model.forward", 10.0) for r in range(3)]
    records = [(FUNCTION_PATTERN, fp[0]), (RANK_WINDOW, rw("a", 1, 0)), (RANK_WINDOW, rw("b", 1, 0)),
               (RANK_WINDOW, rw("a", 1, 1)), (FUNCTION_PATTERN, fp[1]), (RANK_WINDOW, rw("a", 2, 0)),
               (RANK_WINDOW, rw("a", 1, 2)), (FUNCTION_PATTERN, {**fp[2], "function": "other"})]
    out = in_sets(records, 2)
    assert [n for n, _ in out] == [FUNCTION_PATTERN_SET, RANK_WINDOW_SET, RANK_WINDOW, RANK_WINDOW, FUNCTION_PATTERN]
    assert [r["rank"] for r in unpack(out[1][1])] == [0, 1, 2]
    assert [r["rank"] for r in FORMATS[FUNCTION_PATTERN].unpack(out[0][1])] == [0, 1]
    assert out[2][1]["job"] == "b" and out[3][1]["window_id"] == 2  # alone: as they were
    assert in_sets(records, 0) == records  # off
    monkeypatch.setattr(record_sets, "MAX_RECORDS", 2)
    assert [record_sets.size(r) for n, r in in_sets(records, 2) if n == RANK_WINDOW_SET] == [2, 1]
    assert [n for n, _ in expanded(*out[1])] == [RANK_WINDOW] * 3 and expanded(*out[2]) == [out[2]]


def _bounded(name: str, shared: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Records near the rules' edges: mostly valid, sometimes not (a value past a bound, a non-finite
    float, a long or non-ASCII name, a rank past its world, an unset time, a total past its count,
    a range of members beside a list, columns of unequal length)."""
    edgy_int = st.sampled_from([-2, -1, 0, 1, 3, 7, 2**31 - 1, 2**40, 2**63 - 1])
    own = {f["name"]: _value(f["type"]) for f in _fields(name) if f["name"] not in shared}
    for f in _fields(name):
        t = f["type"]
        if f["name"] in shared:
            continue
        if t in ("int", "long"):
            own[f["name"]] = edgy_int | st.integers(0, 100)
        elif t == "float":
            own[f["name"]] = st.sampled_from([-1.0, 0.0, 2.5, float("inf"), float("nan"), 1e39]) | st.floats(0, 100, width=32)
        elif t == "string":
            own[f["name"]] = st.sampled_from(["", "h", "é" * 70, "x" * 300, "名" * 1100, "y" * 4100])
        elif isinstance(t, dict) and t.get("logicalType"):
            own[f["name"]] = st.sampled_from([0, 5, 1_700_000_000_000, 5_000_000_000_000])
        elif isinstance(t, dict) and t["type"] == "array" and t["items"] in ("int", "long"):
            own[f["name"]] = st.lists(st.sampled_from([0, 5, -1, 2**62]), max_size=3)
    own["rank"], own["world_size"] = st.integers(0, 9), st.sampled_from([0, 4, 8])
    if name == RANK_WINDOW:
        own["functions"] = st.lists(st.sampled_from(["f", "comm:x:g", "z" * 5000, "é" * 1500]), max_size=3)
    return st.fixed_dictionaries({**{k: st.just(v) for k, v in shared.items()}, **own})


@pytest.mark.parametrize("name", MEMBERS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_set_read_names_exactly_the_records_their_rules_refuse(name, data):
    """The check of a set (SetFormat.read: extremes of the columns, the rest per record) never lets
    a record its rules refuse through: each record's verdict is the one validating it alone gives."""
    records = data.draw(st.lists(_bounded(name, SHARED_OF[name]), min_size=1, max_size=6))
    fmt, one, many = FORMATS[name], Codec(name), Codec(FORMATS[name].name)
    try:
        record = many.decode(many.encode(fmt.pack(records)))
    except SchemaError:
        return  # not encodable (an int32 field out of range): cannot reach the wire
    got = fmt.read(record)
    assert [reason for _, reason in got] == [validate(name, one.decode(one.encode(r))) for r in records]


def test_a_valid_set_is_passed_on_its_columns_alone(monkeypatch):
    rws = [{**rank_window(r, world=8), "schema_version": 6, "functions": ["Model.forward"]} for r in range(8)]
    record = SET.decode(SET.encode(pack(rws)))
    calls = []
    monkeypatch.setattr(record_sets, "validate", lambda *a, **k: calls.append(a) or validate(*a, **k))
    assert [reason for _, reason in RWF.read(record)] == [None] * 8
    assert not calls  # the extremes and rank < world size per rank: no RankWindow validated whole
    rws[5]["world_size"] = 5  # rank 5 past its world: every RankWindow checked, that one named
    calls.clear()
    reasons = [reason for _, reason in RWF.read(SET.decode(SET.encode(pack(rws))))]
    assert reasons[5] == "RankWindow.rank = 5: not below world_size = 5" and reasons.count(None) == 7
    assert len(calls) == 8


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_corrupt_set_is_refused_with_an_error_its_readers_catch(data):
    """Cut, flipped or re-sized bytes of a good set: the decoder refuses them (SchemaError), the
    set's rules name them, or reading its RankWindows raises a SchemaError, the one error the
    workers' agent and the sink catch and dead-letter (streams/context.py ``set_members``,
    sinks/service.py ``_handle_set``)."""
    wire = SET.encode(pack([{**rank_window(r, world=4), "schema_version": 6, "functions": ["f", f"g{r}"]}
                            for r in range(4)]))
    pos = data.draw(st.integers(10, len(wire) - 1))
    flipped = bytearray(wire)
    flipped[pos] ^= data.draw(st.integers(1, 255))
    for bad in (wire[:data.draw(st.integers(0, len(wire)))], bytes(flipped)):
        try:
            record = SET.decode(bad)
        except SchemaError:
            continue
        if validate(RANK_WINDOW_SET, record) is not None:
            continue
        try:
            RWF.read(record)
        except SchemaError:  # the one error it raises for a set it cannot read
            pass


def test_the_setting_turns_sets_off_for_a_rolling_upgrade():
    from perftracker_ml.schemas.settings import StreamSettings
    from perftracker_ml.streams.detect import DetectionPolicy

    assert DetectionPolicy.from_settings(streams=StreamSettings()).record_set_min == 2
    off = DetectionPolicy.from_settings(streams=StreamSettings(record_sets=False))
    records = [(RANK_WINDOW, rank_window(r, world=4)) for r in range(4)]
    assert off.record_set_min == 0 and in_sets(records, off.record_set_min) == records
