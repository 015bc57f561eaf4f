"""The body of POST /store: records of an import, length-prefixed Avro single-object messages."""

from __future__ import annotations

import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas import SchemaError
from perftracker_ml.sinks.keep import decode_records, encode_records


def test_records_round_trip_as_the_sink_decodes_them():
    records = list(samples.job_records("keep-job", world=2, windows=1))
    decoded = decode_records(encode_records(records))
    assert [name for name, _ in decoded] == [name for name, _ in records]
    assert [r["job"] for _, r in decoded] == ["keep-job"] * len(records)
    assert decode_records(b"") == []


def test_a_truncated_or_foreign_body_is_refused_naming_the_problem():
    body = encode_records(list(samples.job_records("j", world=2, windows=1))[:2])
    with pytest.raises(SchemaError, match="truncated body: record 1 announces"):
        decode_records(body[:-3])
    with pytest.raises(SchemaError, match="truncated body: 2 byte"):
        decode_records(body + b"\x00\x00")
    with pytest.raises(SchemaError, match="not an Avro single-object message"):
        decode_records(b"\x00\x00\x00\x03abc")
