"""Property-based: whatever bytes arrive, decoding + validation end in a record that passes,
a :class:`SchemaError`, or a reason string, never another exception; and a record that
passes never trips the detection core's own input checks."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas import Codec, MultiCodec, SchemaError, bundled_schemas
from perftracker_ml.schemas.codec import SINGLE_OBJECT_MAGIC
from perftracker_ml.schemas.validate import validate
from perftracker_ml.sinks.decode import RecordDecoder
from perftracker_ml.sinks.rows import ROW_BUILDERS
from perftracker_ml.streams.detect import DetectionPolicy, RankSummarizer

from ...hostile import (
    GOOD_BATCH,
    SINK_NAMES,
    hostile_event_batch,
    hostile_messages,
    hostile_sink_record,
)

WORKER = MultiCodec(["EventBatch", "HardwareBatch"])
FINDINGS = MultiCodec(["RankWindow", "FunctionComparison"])
SINK = RecordDecoder(SINK_NAMES)
CONTROL = MultiCodec(["Control"])
FINGERPRINTS = sorted(sv.fingerprint for name in bundled_schemas().names()
                      for sv in [bundled_schemas().latest(name)])
GOOD_WIRE = [Codec("EventBatch").encode(GOOD_BATCH)] + [
    MultiCodec(SINK_NAMES).encode(n, r) for n, r in samples.job_records("prop", world=4, windows=1)
    if n in SINK_NAMES][:12]

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_all(data: bytes) -> None:
    """Every entry point a message meets; each may only raise SchemaError."""
    for codec in (WORKER, FINDINGS, SINK, CONTROL):
        try:
            name, record = codec.decode(data)
        except SchemaError:
            continue
        reason = validate(name, record)
        assert reason is None or isinstance(reason, str)


@PROPERTY
@given(st.binary(max_size=300))
def test_random_bytes(data):
    _decode_all(data)


@PROPERTY
@given(st.sampled_from(FINGERPRINTS), st.binary(max_size=400))
def test_known_fingerprint_with_a_random_body(fp, body):
    _decode_all(SINGLE_OBJECT_MAGIC + fp + body)


@PROPERTY
@given(st.sampled_from(GOOD_WIRE), st.data())
def test_truncated_flipped_and_refingerprinted_avro(wire, data):
    cut = data.draw(st.integers(0, len(wire)))
    _decode_all(wire[:cut])
    pos = data.draw(st.integers(0, len(wire) - 1))
    flipped = bytearray(wire)
    flipped[pos] ^= data.draw(st.integers(1, 255))
    _decode_all(bytes(flipped))
    _decode_all(wire[:2] + data.draw(st.binary(min_size=8, max_size=8)) + wire[10:])


@PROPERTY
@given(hostile_event_batch())
def test_hostile_event_batches_are_rejected_with_a_reason_or_safe_for_detection(rec):
    try:
        data = Codec("EventBatch").encode(rec)
    except SchemaError:
        return  # not even encodable (e.g. an int32 field out of range): cannot reach the wire
    name, decoded = WORKER.decode(data)
    reason = validate(name, decoded)
    if reason is not None:
        assert reason.startswith(("EventBatch.", "malformed EventBatch")), reason
        return
    assert 0 <= decoded["rank"] < decoded["world_size"]
    s = RankSummarizer(decoded["job"], decoded["rank"], DetectionPolicy())
    s.add_events(decoded)  # never raises on its own; a valid batch must not even need its guards
    tripped = {k for k in s.skipped if k in ("bad_name_index", "ragged_columns", "bad_duration")
               or k.startswith("bad_batch")}
    assert not tripped, (tripped, decoded)


@PROPERTY
@given(hostile_sink_record())
def test_hostile_worker_outputs_are_rejected_or_map_to_rows(item):
    name, rec = item
    try:
        data = MultiCodec(SINK_NAMES).encode(name, rec)
    except SchemaError:
        return
    try:
        name, decoded = SINK.decode(data)
    except SchemaError:
        return  # e.g. a timestamp fastavro cannot represent
    reason = validate(name, decoded)
    if reason is None:
        ROW_BUILDERS[name](decoded)  # a record that passes always maps to rows



def test_every_message_of_the_hostile_flood_is_refused_with_a_reason():
    """The stack test's flood (tests/hostile.py), checked offline: nothing in it passes."""
    kinds: dict[str, int] = {}
    for m in hostile_messages(2000, downstream=100, huge=1):
        codec = WORKER if m.topic in ("events", "hardware") else SINK
        try:
            name, record = codec.decode(m.value)
        except SchemaError:
            kinds[m.kind] = kinds.get(m.kind, 0) + 1
            continue
        reason = validate(name, record)
        assert reason, (m.kind, record)
        kinds[m.kind] = kinds.get(m.kind, 0) + 1
    assert sum(kinds.values()) == 2000 and len(kinds) >= 15, kinds
