"""Record bundles: several framed records of one key in one message, read back exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perftracker_ml.schemas import Codec, SchemaError, bundle
from perftracker_ml.schemas.vocabulary import CONTROL, SINGLE_OBJECT_HEADER_LEN


def control(i: int) -> bytes:
    return Codec(CONTROL).encode({"job": "j", "request_id": f"r{i}", "command": "PROFILE", "start_step": i,
                                  "duration_s": 0.0, "reason": "", "issued_ms": 0})


def test_a_bundle_holds_its_items_byte_for_byte_in_order():
    items = [control(i) for i in range(5)]
    packed = bundle.pack(items)
    assert bundle.is_bundle(packed) and bundle.unpack(packed) == items
    assert [Codec(CONTROL).decode(i)["start_step"] for i in bundle.records_in(packed)] == [0, 1, 2, 3, 4]


def test_a_plain_message_is_its_own_only_record():
    one = control(1)
    assert not bundle.is_bundle(one) and bundle.records_in(one) == [one]
    assert bundle.records_in(b"garbage") == [b"garbage"]  # the reader's codec says what is wrong with it
    with pytest.raises(SchemaError, match="not a RecordBundle"):
        bundle.unpack(one)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), max_size=40), max_records=st.integers(1, 8),
       max_bytes=st.integers(1, 1000))
def test_bundled_keeps_every_item_in_order_within_the_limits(sizes, max_records, max_bytes):
    items = [bytes([i % 256]) * n for i, n in enumerate(sizes)]
    messages = bundle.bundled(items, max_records, max_bytes)
    assert [i for m in messages for i in bundle.records_in(m)] == items
    for m in messages:
        inside = bundle.records_in(m)
        assert len(inside) <= max_records
        assert len(inside) == 1 or sum(map(len, inside)) <= max_bytes  # only a lone item may exceed
        assert bundle.is_bundle(m) == (len(inside) > 1)


@settings(max_examples=300, deadline=None)
@given(tail=st.binary(max_size=64))
def test_garbage_after_a_bundle_header_is_refused_with_a_schema_error(tail):
    data = bundle.pack([b"x"])[:SINGLE_OBJECT_HEADER_LEN] + tail
    try:
        items = bundle.unpack(data)
    except SchemaError:
        return
    assert isinstance(items, list) and all(isinstance(i, bytes) for i in items)


def test_a_bundle_claiming_too_many_items_is_refused(monkeypatch):
    monkeypatch.setattr(bundle, "READ_MAX_RECORDS", 3)
    with pytest.raises(SchemaError, match="at most 3"):
        bundle.unpack(bundle.pack([b"a"] * 4))
