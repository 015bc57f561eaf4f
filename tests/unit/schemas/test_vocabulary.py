"""The wire vocabulary agrees with the bundled .avsc files, and every cause has its words."""

from __future__ import annotations

import re

import pytest
from perftracker_ml.schemas import Codec, bundled_schemas
from perftracker_ml.schemas import vocabulary as v
from perftracker_ml.schemas.causes import CAUSES, Cause
from perftracker_ml.schemas.vocabulary import Kind, OpKind, SpanKind, Status


def field(record: str, name: str, raw: dict | None = None) -> dict:
    fields = (raw or bundled_schemas().latest(record).raw)["fields"]
    return next(f for f in fields if f["name"] == name)


def items_field(record: str, array: str, name: str) -> dict:
    """A field of the record type inside an array field (e.g. EventBatch.kernels.kind)."""
    return field(record, name, field(record, array)["type"]["items"])


def test_every_record_name_has_a_bundled_schema():
    assert sorted(v.RECORD_NAMES) == bundled_schemas().names()


@pytest.mark.parametrize("name, version", [
    (v.EVENT_BATCH, v.EVENT_BATCH_VERSION), (v.FUNCTION_PATTERN, v.FUNCTION_PATTERN_VERSION),
    (v.RANK_WINDOW, v.RANK_WINDOW_VERSION), (v.FUNCTION_COMPARISON, v.FUNCTION_COMPARISON_VERSION),
    (v.ANOMALY, v.ANOMALY_VERSION), (v.CONTROL, v.CONTROL_VERSION), (v.RECORD_BUNDLE, v.RECORD_BUNDLE_VERSION),
])
def test_written_schema_versions_are_the_latest_bundled(name: str, version: int):
    assert bundled_schemas().latest(name).version == version


def test_single_object_header_is_magic_plus_fingerprint():
    framed = Codec(v.CONTROL).encode({"job": "j", "request_id": "r", "command": "PROFILE", "start_step": 0,
                                      "duration_s": 0.0, "reason": "", "issued_ms": 0})
    assert v.SINGLE_OBJECT_HEADER_LEN == 10
    assert framed[:v.SINGLE_OBJECT_HEADER_LEN] == (
        v.SINGLE_OBJECT_MAGIC + bundled_schemas().latest(v.CONTROL).fingerprint)


def test_span_kinds_match_the_event_batch_doc():
    doc = field(v.EVENT_BATCH, "spans")["type"]["doc"]
    documented = {int(n): word.upper() for n, word in re.findall(r"(\d+) (\w+)", doc)}
    assert documented == {k.value: k.name for k in SpanKind if k < 100}
    pattern_doc = field(v.FUNCTION_PATTERN, "kind")["doc"]
    assert f"{SpanKind.COLLECTIVE.value} collective" in pattern_doc
    assert f"{SpanKind.OP_SUMMARY.value} op summary" in pattern_doc


def test_op_kinds_match_the_event_batch_doc():
    doc = items_field(v.EVENT_BATCH, "kernels", "kind")["doc"]
    assert {int(n) for n in re.findall(r"(\d+) ", doc)} == {k.value for k in OpKind}


def test_anomaly_kind_cause_and_status_match_the_schema():
    assert field(v.ANOMALY, "kind")["doc"].split(" | ") == [k.value for k in Kind]
    assert field(v.ANOMALY, "cause")["doc"].split(" | ") == [c.value for c in Cause]
    assert field(v.ANOMALY, "status")["type"]["symbols"] == [s.value for s in Status]


@pytest.mark.parametrize("cause", list(Cause))
def test_every_cause_has_its_words(cause: Cause):
    words = CAUSES[cause]
    assert words.title and words.reason and words.explanation and words.advice
    assert words.explanation.format(who="rank 3")  # the only placeholder is {who}


def test_control_commands_match_the_schema():
    assert field(v.CONTROL, "command")["type"]["symbols"] == [c.value for c in v.ControlCommand]
