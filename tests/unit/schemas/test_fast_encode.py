"""The columnar encoder (schemas/fast_encode.py) writes what fastavro writes, byte for byte."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker_ml.deploy.workloads.batches import Workload
from perftracker_ml.schemas import Codec, MultiCodec, SchemaError, bundled_schemas
from perftracker_ml.schemas.fast_encode import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    MAX_BATCH,
    compile_encoder,
    fastavro_body,
    varint_bytes,
)
from perftracker_ml.schemas.record_sets import expanded
from perftracker_ml.schemas.topics import TopicNames
from perftracker_ml.schemas.vocabulary import ANOMALY, EVENT_BATCH, FUNCTION_PATTERN, RANK_WINDOW
from perftracker_ml.streams.agents.stage import encode_all
from perftracker_ml.streams.context import StreamContext
from perftracker_ml.streams.detect import DetectionPolicy

from benchmarks.throughput import closed_records, decode_all, encode_job

CODECS = {name: Codec(name) for name in (FUNCTION_PATTERN, RANK_WINDOW)}
FIELDS = {name: codec.writer.parsed["fields"] for name, codec in CODECS.items()}
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(name: str, records: list[dict]) -> list[bytes]:
    """fastavro's bodies, one record at a time."""
    return [fastavro_body(CODECS[name].writer.parsed, r) for r in records]


def fast(name: str, records: list[dict]) -> list[bytes]:
    """The columnar path, however few the records."""
    encoder = compile_encoder(CODECS[name].writer.parsed, min_batch=1)
    assert encoder is not None
    return encoder.encode_many(records)


def eager_codec(name: str) -> Codec:
    """A codec whose ``encode_many`` takes the columnar path for any number of records."""
    codec = Codec(name)
    assert codec.fast is not None
    codec.fast.min_batch = 1
    return codec


# ---- random records -----------------------------------------------------------------------
def edgy_ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers in [lo, hi], the bounds, 0, -1 and varint length edges often."""
    edges = [lo, hi, 0, -1, 1, 63, -64, 64, -65, (1 << 31) - 1, -(1 << 31), 1 << 62, -(1 << 62)]
    return st.one_of(st.sampled_from([e for e in edges if lo <= e <= hi]), st.integers(lo, hi))


TEXT = st.one_of(st.just(""), st.text(max_size=40), st.sampled_from(["comm:all_reduce:pg0", "ünïcødé ✓", "日本"]))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-1.0, 0.0, 5.0, 1e40, -1e-45]),
                   st.integers(-(1 << 60), 1 << 60))


def value_strategy(avro_type: Any) -> st.SearchStrategy[Any]:
    """Values fastavro takes for one field type of the two schemas."""
    if isinstance(avro_type, dict):
        if avro_type["type"] == "array":
            return st.one_of(st.just([]), st.lists(value_strategy(avro_type["items"]), max_size=300))
        if avro_type["type"] == "map":
            return st.dictionaries(TEXT, value_strategy(avro_type["values"]), max_size=5)
        return value_strategy(avro_type["type"])  # timestamp-millis
    return {"int": edgy_ints(INT_MIN, INT_MAX), "long": edgy_ints(LONG_MIN, LONG_MAX), "float": FLOATS,
            "double": FLOATS, "boolean": st.booleans(), "string": TEXT}[avro_type]


@st.composite
def records(draw: st.DrawFn, name: str) -> dict:
    """A record of ``name`` with random values; some fields with a default left out."""
    out = {}
    for field in FIELDS[name]:
        if "default" in field and draw(st.integers(0, 9)) == 0:
            continue
        out[field["name"]] = draw(value_strategy(field["type"]))
    return out


@SETTINGS
@given(st.lists(records(FUNCTION_PATTERN), min_size=1, max_size=12))
def test_function_patterns_are_encoded_as_fastavro_encodes_them(batch: list[dict]) -> None:
    assert fast(FUNCTION_PATTERN, batch) == reference(FUNCTION_PATTERN, batch)


@SETTINGS
@given(st.lists(records(RANK_WINDOW), min_size=1, max_size=8))
def test_rank_windows_are_encoded_as_fastavro_encodes_them(batch: list[dict]) -> None:
    assert fast(RANK_WINDOW, batch) == reference(RANK_WINDOW, batch)


@SETTINGS
@given(st.lists(records(FUNCTION_PATTERN), min_size=1, max_size=6))
def test_codec_encode_many_is_encode_record_by_record(batch: list[dict]) -> None:
    for record in batch:
        record.pop("schema_version", None) if len(record) % 2 else None  # filled in, as encode does
    codec = eager_codec(FUNCTION_PATTERN)
    assert codec.encode_many(batch) == [codec.encode(r) for r in batch]


@pytest.mark.parametrize("value", [0, -1, 1, 63, 64, -64, -65, 127, 128, LONG_MIN, LONG_MAX, 1 << 35, -(1 << 49)])
def test_a_varint_is_avros_zigzag_varint(value: int) -> None:
    body = fast(FUNCTION_PATTERN, [dict(real_records()[FUNCTION_PATTERN][0], window_id=value)])[0]
    assert varint_bytes(value) in body
    assert body == reference(FUNCTION_PATTERN, [dict(real_records()[FUNCTION_PATTERN][0], window_id=value)])[0]


def test_empty_and_full_blocks_match_fastavro() -> None:
    base = real_records()[FUNCTION_PATTERN][0]
    batch = [dict(base, hist=[], seqs=[], seq_dur_ns=[], group_ranks=[], mesh_coords={}),
             dict(base, hist=list(range(500)), seqs=[LONG_MAX, LONG_MIN], mesh_coords={"dp": 3, "tp": -1})]
    assert fast(FUNCTION_PATTERN, batch) == reference(FUNCTION_PATTERN, batch)
    assert fast(FUNCTION_PATTERN, batch)[0].count(b"\x00") >= 5  # an empty array or map is one 0


# ---- real records -------------------------------------------------------------------------
_REAL: dict[str, list[dict]] = {}


def real_records() -> dict[str, list[dict]]:
    """The records the summarizers close over a small throughput workload (16 ranks, 4 s)."""
    if not _REAL:
        w = Workload(ranks=16, seconds=4, tp=4, pp=2)
        window_ns = DetectionPolicy().window_ms * 1_000_000
        start_ns = time.time_ns() - int(w.seconds * 1e9)
        for name0, record0 in closed_records(decode_all(encode_job(w, start_ns - start_ns % window_ns))):
            for name, record in expanded(name0, record0):  # the records a set carries
                _REAL.setdefault(name, []).append(record)
    return _REAL


@pytest.mark.parametrize("name", [FUNCTION_PATTERN, RANK_WINDOW])
def test_real_closed_records_are_encoded_as_fastavro_encodes_them(name: str) -> None:
    batch = real_records()[name]
    assert len(batch) > 20
    assert fast(name, batch) == reference(name, batch)
    codec = eager_codec(name)
    assert codec.encode_many(batch) == [codec.encode(r) for r in batch]
    assert codec.decode(codec.encode_many(batch)[0]) == codec.decode(codec.encode(batch[0]))


def eager_context() -> StreamContext:
    """A context whose codecs take the columnar path for any number of records."""
    ctx = StreamContext(names=TopicNames.for_prefix("t"), policy=DetectionPolicy())
    for codec in ctx.codecs.values():
        for member in codec.codecs.values() if isinstance(codec, MultiCodec) else [codec]:
            if member.fast is not None:
                member.fast.min_batch = 1
    return ctx


def test_stream_context_encode_many_is_encode_record_by_record() -> None:
    ctx = eager_context()
    for name, batch in real_records().items():
        assert ctx.encode_many(name, batch) == [ctx.encode(name, r) for r in batch]
        assert ctx.encode_many(name, batch[:3]) == [ctx.encode(name, r) for r in batch[:3]]


def test_encode_all_keeps_order_and_loses_only_a_bad_record() -> None:
    ctx = eager_context()
    fps, rws = real_records()[FUNCTION_PATTERN][:60], real_records()[RANK_WINDOW][:3]
    mixed = [(FUNCTION_PATTERN, r) for r in fps[:30]] + [(RANK_WINDOW, rws[0])]
    mixed += [(FUNCTION_PATTERN, dict(fps[30], count="many")), (RANK_WINDOW, rws[1])]
    mixed += [(FUNCTION_PATTERN, r) for r in fps[31:]]
    out = encode_all(ctx, mixed)
    assert isinstance(out[31], SchemaError)
    assert [v for i, v in enumerate(out) if i != 31] == [ctx.encode(n, r) for i, (n, r) in enumerate(mixed) if i != 31]


# ---- what fastavro refuses, and what it takes --------------------------------------------
@pytest.mark.parametrize("change", [
    {"count": "12"}, {"total_ns": None}, {"total_ns": 1 << 63}, {"hist": [1, "2"]}, {"hist": None},
    {"job": 5}, {"host": b"node"}, {"function": "\ud800"}, {"mesh_coords": {1: 2}}, {"window_s": None},
    {"window_s": 1 << 1100},
])
def test_a_bad_record_raises_schema_error_as_encode_does(change: dict) -> None:
    codec = eager_codec(FUNCTION_PATTERN)
    good = real_records()[FUNCTION_PATTERN][:3]
    bad = dict(good[1], **change)
    with pytest.raises(SchemaError):
        codec.encode(bad)
    with pytest.raises(SchemaError):
        codec.encode_many([good[0], bad, good[2]])


def test_a_missing_field_without_default_raises_and_with_one_is_filled_in() -> None:
    codec = eager_codec(FUNCTION_PATTERN)
    record = real_records()[FUNCTION_PATTERN][0]
    no_count = {k: v for k, v in record.items() if k != "count"}
    with pytest.raises(SchemaError):
        codec.encode_many([record, no_count])
    no_seqs = {k: v for k, v in record.items() if k not in ("seqs", "mesh_coords", "bytes")}
    assert codec.encode_many([no_seqs, record]) == [codec.encode(no_seqs), codec.encode(record)]


@pytest.mark.parametrize("change", [
    {"rank": INT_MAX + 1}, {"gpu": INT_MIN - 1}, {"group_ranks": [1 << 40]},  # fastavro writes them as longs
    {"count": True}, {"total_ns": np.int64(7)}, {"window_start_ms": 2.0}, {"hist": (1, 2)},
    {"hist": np.array([3, 4])}, {"window_s": "1.5"}, {"window_s": True}, {"rank": 1.9},
])
def test_values_fastavro_takes_are_written_as_it_writes_them(change: dict) -> None:
    """An int beyond int32 in an int field is not refused by fastavro (it writes a longer
    varint): the fast path hands such a record to fastavro, so the bytes stay the same."""
    codec = eager_codec(FUNCTION_PATTERN)
    good = real_records()[FUNCTION_PATTERN][:2]
    batch = [good[0], dict(good[1], **change)]
    assert codec.encode_many(batch) == [codec.encode(r) for r in batch]


def test_unsupported_schemas_keep_fastavro() -> None:
    assert Codec(EVENT_BATCH).fast is None  # packed columns
    union = {"type": "record", "name": "U", "fields": [{"name": "x", "type": ["null", "long"]}]}
    assert compile_encoder(union) is None
    anomaly = Codec(ANOMALY)
    sample = bundled_schemas().latest(ANOMALY)
    assert anomaly.writer is sample
    if anomaly.fast is None:  # nested records: encode_many is encode one by one
        assert anomaly.encode_many([]) == []


def test_every_bundled_schema_compiles_or_is_reported_unsupported() -> None:
    schemas = bundled_schemas()
    compiled = {name: compile_encoder(schemas.latest(name).parsed) is not None for name in schemas.names()}
    assert compiled[FUNCTION_PATTERN] and compiled[RANK_WINDOW]
    assert not compiled[EVENT_BATCH] or Codec(EVENT_BATCH).fast is None


def test_more_records_than_a_slice_are_encoded_slice_by_slice_in_order() -> None:
    base = real_records()[FUNCTION_PATTERN]
    batch = [dict(base[i % len(base)], window_id=i) for i in range(MAX_BATCH * 2 + 7)]
    assert fast(FUNCTION_PATTERN, batch) == reference(FUNCTION_PATTERN, batch)
