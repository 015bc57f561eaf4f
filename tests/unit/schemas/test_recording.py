"""The recording file: messages kept byte for byte, its header, clear errors on bad files."""

from __future__ import annotations

import io
from pathlib import Path

import fastavro
import pytest
from perftracker_ml.schemas.errors import SchemaError
from perftracker_ml.schemas.recording import (
    SUFFIX,
    RecordedMessage,
    Recording,
    RecordingHeader,
    truth_path,
    write_recording,
)

HEADER = RecordingHeader(job="j1", source="retained", recorded_at_ms=1_700_000_000_000, topic_prefix="pt",
                         perftracker_version="0.0", note="made by a test")


def messages(n: int) -> list[RecordedMessage]:
    return [RecordedMessage("inputs", "pt.events", i % 3, i, 1_700_000_000_000 + 7 * i,
                            None if i == 2 else f"j1|{i % 4}".encode(), bytes([i % 256]) * (i + 1))
            for i in range(n)]


def test_messages_and_header_come_back_exactly(tmp_path: Path):
    path = tmp_path / f"run{SUFFIX}"
    sent = messages(300)
    assert write_recording(path, HEADER, iter(sent)) == 300
    rec = Recording(path)
    assert rec.header == HEADER
    assert list(rec.messages()) == sent
    assert not list(tmp_path.glob("*.part"))  # written under another name, then renamed


def test_replay_order_is_by_time_then_place_whatever_the_read_order():
    a = RecordedMessage("inputs", "pt.events", 1, 5, 100, None, b"a")
    b = RecordedMessage("inputs", "pt.events", 0, 9, 100, None, b"b")
    c = RecordedMessage("inputs", "pt.hardware", 0, 1, 99, None, b"c")
    assert sorted([a, b, c], key=lambda m: m.order) == [c, b, a]


def test_a_file_that_is_not_a_recording_says_so(tmp_path: Path):
    junk = tmp_path / "junk.ptrec"
    junk.write_bytes(b"not avro at all")
    with pytest.raises(SchemaError, match="not a readable recording"):
        Recording(junk)
    other = tmp_path / "other.ptrec"
    buf = io.BytesIO()
    fastavro.writer(buf, {"type": "record", "name": "X", "fields": [{"name": "a", "type": "int"}]}, [{"a": 1}])
    other.write_bytes(buf.getvalue())
    with pytest.raises(SchemaError, match="not a perftracker recording"):
        Recording(other)


def test_a_newer_format_is_refused_by_name(tmp_path: Path):
    path = tmp_path / "new.ptrec"
    future = RecordingHeader(**{**HEADER.__dict__, "format_version": 99})
    write_recording(path, future, messages(1))
    with pytest.raises(SchemaError, match="format version 99"):
        Recording(path)


def test_a_cut_file_says_it_is_cut(tmp_path: Path):
    path = tmp_path / "cut.ptrec"
    write_recording(path, HEADER, messages(2000))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SchemaError, match="cut or corrupt"):
        list(Recording(path).messages())


def test_truth_lies_beside_the_recording():
    assert truth_path(Path("/x/slow-rank.ptrec")) == Path("/x/slow-rank.truth.json")
