"""Property-based: whatever bytes arrive, decoding + validation end in a record that passes,
a :class:`SchemaError`, or a reason string, never another exception; and a record that
passes never trips the detection core's own input checks."""

from __future__ import annotations

import copy
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker.deploy.synthetic import SyntheticJob, batches
from perftracker.schemas import Codec, MultiCodec, SchemaError, bundled_schemas
from perftracker.schemas.codec import SINGLE_OBJECT_MAGIC
from perftracker.schemas.validate import validate
from perftracker.sinks import samples
from perftracker.sinks.decode import RecordDecoder
from perftracker.sinks.rows import ROW_BUILDERS
from perftracker.streams.detect import DetectionPolicy, RankSummarizer

WORKER = MultiCodec(["EventBatch", "HardwareBatch"])
FINDINGS = MultiCodec(["RankWindow", "FunctionComparison"])
SINK = RecordDecoder(["FunctionPattern", "RankWindow", "FunctionComparison", "Anomaly"])
SINK_NAMES = ["FunctionPattern", "RankWindow", "FunctionComparison", "Anomaly"]
FINGERPRINTS = sorted(sv.fingerprint for name in bundled_schemas().names()
                      for sv in [bundled_schemas().latest(name)])
GOOD_BATCH = list(batches(SyntheticJob("prop", ranks=4, seconds=2)))[4][1]
GOOD_WIRE = [Codec("EventBatch").encode(GOOD_BATCH)] + [
    MultiCodec(SINK_NAMES).encode(n, r) for n, r in samples.job_records("prop", world=4, windows=1)
    if n in SINK_NAMES][:12]

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# values an attacker or a broken collector would send
HOSTILE_INT32 = st.one_of(st.integers(-3, 12), st.sampled_from([-5, -(2**31), 2**31 - 1, 10**9, 10**6]),
                          st.integers(-(2**31), 2**31 - 1))
HOSTILE_INT64 = st.one_of(st.integers(-3, 10**10), st.sampled_from([-(2**62), -(2**63), 2**63 - 1, 2**62]),
                          st.integers(-(2**63), 2**63 - 1))
HOSTILE_FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, -1.0, 0.0]))
HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["'; DROP TABLE collectives; --", '"quoted" \\ ${x}', "<script>alert(1)</script>",
                     "line\nforged: yes\r\x1b[31m\x00", "*bold* _md_ [x](http://e)", "", "j" * 5000]),
)


def _decode_all(data: bytes) -> None:
    """Every entry point a message meets; each may only raise SchemaError."""
    for codec in (WORKER, FINDINGS, SINK):
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


HEADER = {"rank": HOSTILE_INT32, "local_rank": HOSTILE_INT32, "world_size": HOSTILE_INT32, "gpu": HOSTILE_INT32,
          "pid": HOSTILE_INT32, "seq": HOSTILE_INT64, "dropped_events": HOSTILE_INT64, "wall_ns": HOSTILE_INT64,
          "mono_ns": HOSTILE_INT64, "job": HOSTILE_TEXT, "host": HOSTILE_TEXT, "gpu_uuid": HOSTILE_TEXT}
INDEXES = ("kind", "name", "path", "op", "group")
COLUMNS = [(block, col) for block, cols in GOOD_BATCH.items() if block in ("spans", "comms", "iterations")
           for col in cols]


def _corrupt(draw, rec: dict) -> None:
    """One hostile change: a header field, one column value, a ragged column, the names or groups."""
    what = draw(st.sampled_from(["header", "value", "ragged", "names", "groups"]))
    if what == "header":
        field = draw(st.sampled_from(sorted(HEADER)))
        rec[field] = draw(HEADER[field])
    elif what in ("value", "ragged"):
        block, col = draw(st.sampled_from(COLUMNS))
        values = rec[block][col]
        if what == "ragged":
            rec[block][col] = values[:-1] if draw(st.booleans()) else values + values[-1:]
        elif values:
            values[draw(st.integers(0, len(values) - 1))] = draw(HOSTILE_INT32 if col in INDEXES else HOSTILE_INT64)
    elif what == "names":
        rec["names"] = draw(st.lists(HOSTILE_TEXT, max_size=8))
    else:
        rec["groups"] = [{"group_id": draw(HOSTILE_TEXT),
                          "ranks": draw(st.lists(st.one_of(st.integers(-1, 4), HOSTILE_INT32), max_size=5))}]


@st.composite
def hostile_event_batch(draw) -> dict:
    """A well-typed EventBatch with plausible edge values (-1 paths, in-flight comm markers, zero
    durations) and up to three hostile changes: absurd ranks and durations, indexes past the
    tables, ragged columns, huge strings, quotes and control characters."""
    rec = copy.deepcopy(GOOD_BATCH)
    for block, col in COLUMNS:
        if draw(st.integers(0, 4)) == 2:
            low = -1 if (block, col) in (("spans", "path"), ("comms", "dur_ns")) else 0
            top = 4 if col in INDEXES else 4 * 10**9
            rec[block][col] = [draw(st.integers(low, top)) for _ in rec[block][col]]
    for _ in range(draw(st.integers(0, 3))):
        _corrupt(draw, rec)
    return rec


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


@st.composite
def hostile_sink_record(draw) -> tuple[str, dict]:
    name, rec = draw(st.sampled_from([(n, r) for n, r in samples.job_records("prop", world=4, windows=1)
                                      if n in SINK_NAMES]))
    rec = copy.deepcopy(rec)
    schema = {f["name"]: f["type"] for f in bundled_schemas().latest(name).raw["fields"]}
    for field, avro in schema.items():
        if field == "schema_version" or draw(st.integers(0, 3)) != 0:
            continue
        kind = avro if isinstance(avro, str) else avro.get("type")
        items = avro.get("items") if isinstance(avro, dict) else None
        if kind == "int":
            rec[field] = draw(HOSTILE_INT32)
        elif kind == "long" and not isinstance(avro, dict):
            rec[field] = draw(HOSTILE_INT64)
        elif kind in ("float", "double"):
            rec[field] = draw(HOSTILE_FLOAT)
        elif kind == "string":
            rec[field] = draw(HOSTILE_TEXT)
        elif kind == "array" and items in ("int", "long"):
            rec[field] = draw(st.lists(HOSTILE_INT32 if items == "int" else HOSTILE_INT64, max_size=5))
        elif kind == "array" and items in ("float", "double"):
            rec[field] = draw(st.lists(HOSTILE_FLOAT, max_size=5))
        elif kind == "array" and items == "string":
            rec[field] = draw(st.lists(HOSTILE_TEXT, max_size=5))
    return name, rec


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

