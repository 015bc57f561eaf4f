"""Recordings: a job's input messages kept exactly as they arrived, to be replayed later.

A recording is one Avro object container file (fastavro, ``deflate``-compressed blocks)
whose records are :class:`RecordedMessage`: the Kafka topic *role* the message was read
from (``inputs``: the events and hardware topics), the topic, partition and offset, the
message timestamp in ms, the key and the value bytes untouched (single-object framed
EventBatch / HardwareBatch, or a RecordBundle of them). The file's header metadata holds
what the replay needs to know about the run (:class:`RecordingHeader`): the job, where it
was read from, when, and by which version.

Nothing here decodes a value: a recording is evidence, kept byte for byte; decoding and
validation happen at replay, as the worker does them (:mod:`perftracker_ml.streams.replay`).
A truth file (``<name>.truth.json`` beside the recording) says what a correct diagnosis of
the run names; it is written by whoever staged the fault, never derived from a diagnosis.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import fastavro

from .errors import SchemaError

FORMAT = "perftracker.recording"
FORMAT_VERSION = 1
SUFFIX = ".ptrec"
META_KEY = "perftracker.recording"  # header metadata entry holding the RecordingHeader as JSON

SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "RecordedMessage", "namespace": "perftracker.recording",
    "fields": [
        {"name": "role", "type": "string"},
        {"name": "topic", "type": "string"},
        {"name": "partition", "type": "int"},
        {"name": "offset", "type": "long"},
        {"name": "timestamp_ms", "type": "long"},
        {"name": "key", "type": ["null", "bytes"], "default": None},
        {"name": "value", "type": "bytes"},
    ],
})


@dataclass(frozen=True)
class RecordedMessage:
    """One Kafka message as the worker would have read it."""

    role: str  # topic role: "inputs" (events, hardware)
    topic: str
    partition: int
    offset: int
    timestamp_ms: int  # the message's Kafka timestamp (the producer's create time)
    key: bytes | None
    value: bytes

    @property
    def order(self) -> tuple[int, str, int, int]:
        """Replay order: by time, ties by where it was read (stable whatever the read order)."""
        return (self.timestamp_ms, self.topic, self.partition, self.offset)


@dataclass(frozen=True)
class RecordingHeader:
    """What a recording says about itself (the container's header metadata)."""

    job: str
    source: str  # "live" (read while the job ran), "retained" (what the topics still held) or "spool" (files)
    recorded_at_ms: int
    topic_prefix: str
    perftracker_version: str = ""
    note: str = ""  # free text: how the run was made (command, machine)
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> RecordingHeader:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise SchemaError(f"{where}: the recording header is not JSON ({exc})") from exc
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise SchemaError(f"{where}: not a perftracker recording (header format {raw.get('format')!r})"
                              if isinstance(raw, dict) else f"{where}: the recording header is not an object")
        version = raw.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise SchemaError(f"{where}: recording format version {version!r}; this perftracker reads "
                              f"up to {FORMAT_VERSION}")
        known = {k: raw[k] for k in ("job", "source", "recorded_at_ms", "topic_prefix", "perftracker_version",
                                     "note", "extra", "format_version") if k in raw}
        try:
            return cls(**known)
        except TypeError as exc:
            raise SchemaError(f"{where}: the recording header lacks a field ({exc})") from exc


def write_recording(path: Path, header: RecordingHeader, messages: Iterable[RecordedMessage]) -> int:
    """Write ``messages`` to ``path`` (atomically: a partial file is never left under the name);
    returns how many were written."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    count = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal count
        for m in messages:
            count += 1
            yield asdict(m)

    with open(tmp, "wb") as out:
        fastavro.writer(out, SCHEMA, rows(), codec="deflate", metadata={META_KEY: header.to_json()},
                        sync_interval=256 * 1024)
    tmp.replace(path)
    return count


class Recording:
    """A recording opened for reading: ``header``, and the messages (read in file order)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            reader = self._reader(f)
            meta = reader.metadata.get(META_KEY)
            if meta is None:
                raise SchemaError(f"{self.path}: an Avro file, but not a perftracker recording "
                                  f"(no {META_KEY!r} header)")
            self.header = RecordingHeader.from_json(meta, str(self.path))

    def _reader(self, f: BinaryIO) -> Any:
        try:
            return fastavro.reader(f)
        except (ValueError, OSError, EOFError, StopIteration) as exc:
            raise SchemaError(f"{self.path}: not a readable recording ({exc})") from exc

    def messages(self) -> Iterator[RecordedMessage]:
        with open(self.path, "rb") as f:
            try:
                for row in self._reader(f):
                    yield RecordedMessage(**row)
            except (ValueError, OSError, EOFError, TypeError) as exc:
                raise SchemaError(f"{self.path}: the recording is cut or corrupt ({exc})") from exc


def truth_path(recording: Path) -> Path:
    """``x.ptrec`` -> ``x.truth.json``."""
    recording = Path(recording)
    return recording.with_name(recording.name.removesuffix(SUFFIX) + ".truth.json")
