"""Avro codec for every perftracker topic.

Framing (standard Avro, nothing home-made):

* **single-object encoding** (default): ``C3 01`` + the 8-byte little-endian
  CRC-64-AVRO fingerprint of the writer schema's canonical form + the body;
* **Confluent wire format** when a schema registry is configured: ``00`` +
  4-byte big-endian schema id + the body (see :mod:`.registry`).

Evolution rules (checked by tests): fields are only ever *appended*, each new
field with a default. A reader resolves a known writer fingerprint with Avro
schema resolution (new reader, old data: defaults fill in). A reader that
meets an unknown fingerprint whose ``schema_version`` (always the first field)
is newer than its own decodes the body with its own latest schema, which reads
exactly the prefix the old schema describes and ignores the appended fields
(old reader, new data).

One step breaks the append-only rule on purpose: EventBatch v8 retypes the numeric columns
to packed bytes (:mod:`.columns`, :data:`LAYOUT_BREAKS`). A writer older than such a step
is resolved against the last version before it (a v1..v7 EventBatch reads as a v7 one, its
columns lists); a v8 body's columns are unpacked into arrays after Avro decoding, and a
record encoded as v8 has its columns packed first (lists, ``array.array`` or numpy arrays).
A reader older than the step cannot read a newer writer's columns: readers are upgraded
before writers (docs/schemas.md).
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from . import columns
from .errors import SchemaError
from .records import GROUP_RANGE_FROM, MEMBERS_RANGE_FROM, listed_groups, pattern_as_v2
from .vocabulary import (
    CONFLUENT_MAGIC,
    EVENT_BATCH,
    FUNCTION_PATTERN,
    SINGLE_OBJECT_HEADER_LEN,
    SINGLE_OBJECT_MAGIC,
)

if TYPE_CHECKING:  # imported where used: it needs numpy, which the slim collector install has not
    from .fast_encode import FastEncoder

# record name -> the versions that retyped fields (not appended): a writer older than one
# is read with the last version before it, never resolved across it
LAYOUT_BREAKS: dict[str, tuple[int, ...]] = {columns.EVENT_BATCH: (columns.PACKED_FROM,)}


@dataclass(frozen=True)
class SchemaVersion:
    """One parsed version of one record schema."""

    name: str  # short record name, e.g. "EventBatch"
    version: int
    parsed: Any
    raw: dict
    fingerprint: bytes  # 8 bytes, little-endian CRC-64-AVRO

    @property
    def canonical(self) -> str:
        return to_parsing_canonical_form(self.raw)


def _fingerprint_of(raw: dict) -> bytes:
    hex_fp = fingerprint(to_parsing_canonical_form(raw), "CRC-64-AVRO")
    return int(hex_fp, 16).to_bytes(8, "little")


def schema_version_from(name: str, version: int, raw: dict) -> SchemaVersion:
    try:
        parsed = parse_schema(raw)  # with fastavro's parsed hint: readers and writers skip re-parsing
    except Exception as exc:  # fastavro raises several types
        raise SchemaError(f"schema {name} v{version} does not parse: {exc}") from exc
    return SchemaVersion(name, version, parsed, raw, _fingerprint_of(raw))


class SchemaSet:
    """Every known version of every record schema, by name and by fingerprint."""

    def __init__(self, versions: list[SchemaVersion]):
        self._by_name: dict[str, dict[int, SchemaVersion]] = {}
        self._by_fp: dict[bytes, SchemaVersion] = {}
        for sv in versions:
            self._by_name.setdefault(sv.name, {})[sv.version] = sv
            self._by_fp[sv.fingerprint] = sv

    def latest(self, name: str) -> SchemaVersion:
        try:
            versions = self._by_name[name]
        except KeyError:
            raise SchemaError(f"unknown record schema {name!r}; known: {sorted(self._by_name)}") from None
        return versions[max(versions)]

    def version(self, name: str, version: int) -> SchemaVersion:
        try:
            return self._by_name[name][version]
        except KeyError:
            raise SchemaError(f"no version {version} of schema {name!r}") from None

    def by_fingerprint(self, fp: bytes) -> SchemaVersion | None:
        return self._by_fp.get(fp)

    def reader_for(self, writer: SchemaVersion) -> SchemaVersion:
        """The version a ``writer`` body is resolved against: the latest of its name that no
        retyping step (:data:`LAYOUT_BREAKS`) separates from it."""
        versions = self._by_name[writer.name]
        later = [b for b in LAYOUT_BREAKS.get(writer.name, ()) if b > writer.version]
        top = min(later) - 1 if later else max(versions)
        return versions[max(v for v in versions if v <= top)]

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def restricted(self, name: str, max_version: int) -> SchemaSet:
        """A view that knows ``name`` only up to ``max_version`` (an 'old reader')."""
        kept = [sv for byname in self._by_name.values() for sv in byname.values()
                if sv.name != name or sv.version <= max_version]
        return SchemaSet(kept)


@lru_cache(maxsize=1)
def bundled_schemas() -> SchemaSet:
    """The ``*.vN.avsc`` files shipped in this package."""
    versions = []
    for entry in resources.files(__package__).iterdir():
        fname = entry.name
        if not fname.endswith(".avsc"):
            continue
        stem, _, _ = fname.rpartition(".")
        _, _, vpart = stem.rpartition(".")
        raw = json.loads(entry.read_text())
        versions.append(schema_version_from(raw["name"], int(vpart.lstrip("v")), raw))
    return SchemaSet(versions)


class Codec:
    """Encode and decode one record type (e.g. ``EventBatch``) with single-object framing."""

    def __init__(self, name: str, schemas: SchemaSet | None = None):
        self.schemas = schemas or bundled_schemas()
        self.name = name
        self.writer = self.schemas.latest(name)
        self._header = SINGLE_OBJECT_MAGIC + self.writer.fingerprint
        self._packed = columns.is_packed(name, self.writer.version)
        # a writer before EventBatch v9 / FunctionPattern v3 has no ranges of members (nor, for a
        # pattern, a trimmed histogram): what is given so is listed, or it would be lost
        self._lowered = (listed_groups if name == EVENT_BATCH and self.writer.version < MEMBERS_RANGE_FROM else
                         pattern_as_v2 if name == FUNCTION_PATTERN and self.writer.version < GROUP_RANGE_FROM
                         else None)

    @property
    def version(self) -> int:
        return self.writer.version

    def encode(self, record: dict) -> bytes:
        """Encode ``record``; ``schema_version`` is filled in when missing. A packed writer
        (EventBatch v8) packs the columns first (:func:`.columns.pack`)."""
        if "schema_version" not in record:
            record = {**record, "schema_version": self.writer.version}
        if self._lowered is not None:
            record = self._lowered(record)
        buf = io.BytesIO()
        buf.write(self._header)
        try:
            if self._packed:
                record = columns.pack(record)
            fastavro.schemaless_writer(buf, self.writer.parsed, record)
        except Exception as exc:
            raise SchemaError(f"{self.name} record does not match its schema: {exc}") from exc
        return buf.getvalue()

    @cached_property
    def fast(self) -> FastEncoder | None:
        """The columnar encoder of the writer schema (:mod:`.fast_encode`); None for a packed
        writer, a schema it does not compile, or no numpy (the slim collector install): those
        records go through :meth:`encode`."""
        if self._packed:
            return None
        try:
            from .fast_encode import compile_encoder
        except ImportError:
            return None
        return compile_encoder(self.writer.parsed)

    def encode_many(self, records: Sequence[dict]) -> list[bytes]:
        """``[self.encode(r) for r in records]``, byte for byte, encoded column-wise at once
        (:mod:`.fast_encode`); ``schema_version`` filled in when missing, as :meth:`encode`
        does. A record the schema refuses raises :class:`SchemaError` (the whole call)."""
        fast = self.fast
        if fast is None:
            return [self.encode(r) for r in records]
        version = self.writer.version
        records = [r if "schema_version" in r else {**r, "schema_version": version} for r in records]
        if self._lowered is not None:
            records = [self._lowered(r) for r in records]
        try:
            return fast.encode_many(records, self._header)
        except Exception as exc:
            raise SchemaError(f"{self.name} record does not match its schema: {exc}") from exc

    def decode(self, data: bytes) -> dict:
        """Decode framed bytes into a dict shaped like this codec's latest schema.

        Raises :class:`SchemaError` naming the problem for anything else.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SchemaError(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        fp = writer_fingerprint(data)
        if fp is None:
            raise SchemaError(
                f"not an Avro single-object message (first bytes {data[:4].hex() or 'empty'}; "
                f"expected c301 + fingerprint)")
        writer = self.schemas.by_fingerprint(fp)
        body = io.BytesIO(data[SINGLE_OBJECT_HEADER_LEN:])
        if writer is None:
            return self._decode_unknown_writer(fp, body)
        if writer.name != self.name:
            raise SchemaError(f"message holds a {writer.name} record, expected {self.name}")
        try:
            return self.read(body, writer)
        except Exception as exc:
            raise SchemaError(f"corrupt {self.name} body: {exc}") from exc

    def read(self, body: io.BytesIO, writer: SchemaVersion) -> dict:
        """A body written with ``writer`` (a known version of this record), resolved against
        :meth:`SchemaSet.reader_for`, packed columns unpacked into arrays."""
        reader = self.schemas.reader_for(writer)
        record = _as_record(fastavro.schemaless_reader(
            body, writer.parsed, None if reader.fingerprint == writer.fingerprint else reader.parsed))
        return self.unpacked(record, reader.version)

    def unpacked(self, record: dict, reader_version: int) -> dict:
        """``record`` with its packed columns as arrays when ``reader_version`` packs them."""
        return columns.unpack(record) if columns.is_packed(self.name, reader_version) else record

    def _decode_unknown_writer(self, fp: bytes, body: io.BytesIO) -> dict:
        raw = body.getvalue()
        version = _peek_leading_int(raw)
        if version is None or version <= self.writer.version:
            raise SchemaError(
                f"unknown schema fingerprint {fp[::-1].hex()} for {self.name} "
                f"(writer version {version}); not a schema this reader knows")
        try:
            record = _as_record(fastavro.schemaless_reader(body, self.writer.parsed, None))
        except Exception as exc:
            raise SchemaError(
                f"{self.name} v{version} body could not be read with v{self.writer.version}: {exc}"
            ) from exc
        return self.unpacked(record, self.writer.version)


def writer_fingerprint(data: bytes) -> bytes | None:
    """The writer schema's fingerprint in a single-object message; None when ``data`` is not one."""
    if len(data) < SINGLE_OBJECT_HEADER_LEN or not data.startswith(SINGLE_OBJECT_MAGIC):
        return None
    return data[len(SINGLE_OBJECT_MAGIC):SINGLE_OBJECT_HEADER_LEN]


def _as_record(value: Any) -> dict:
    if not isinstance(value, dict):
        raise SchemaError(f"decoded a {type(value).__name__}, expected a record")
    return value


def _peek_leading_int(raw: bytes) -> int | None:
    """Decode the zig-zag varint at the start of ``raw`` (the schema_version field)."""
    shift = 0
    acc = 0
    for i, byte in enumerate(raw[:5]):
        acc |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (acc >> 1) ^ -(acc & 1)
        shift += 7
        if i == 4:
            break
    return None


_UNPACK_ID = struct.Struct(">I")


def confluent_frame(schema_id: int, body: bytes) -> bytes:
    return CONFLUENT_MAGIC + _UNPACK_ID.pack(schema_id) + body


class MultiCodec:
    """Decode a topic that carries several record types (e.g. pt.findings), dispatching on the fingerprint."""

    def __init__(self, names: list[str], schemas: SchemaSet | None = None):
        self.codecs = {n: Codec(n, schemas) for n in names}

    def encode(self, name: str, record: dict) -> bytes:
        return self.codecs[name].encode(record)

    def decode(self, data: bytes) -> tuple[str, dict]:
        """Return ``(record name, record)``; raises :class:`SchemaError` for anything unknown."""
        data = bytes(data) if isinstance(data, (bytearray, memoryview)) else data
        fp = writer_fingerprint(data) if isinstance(data, bytes) else None
        if fp is None:
            raise SchemaError("not an Avro single-object message")
        any_codec = next(iter(self.codecs.values()))
        writer = any_codec.schemas.by_fingerprint(fp)
        if writer is None:
            raise SchemaError(f"unknown schema fingerprint {fp[::-1].hex()} "
                              f"(expected one of {sorted(self.codecs)})")
        if writer.name not in self.codecs:
            raise SchemaError(f"message holds a {writer.name} record, expected one of {sorted(self.codecs)}")
        return writer.name, self.codecs[writer.name].decode(data)
