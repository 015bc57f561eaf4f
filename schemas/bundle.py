"""Record bundles: several framed records of one topic and key in one Kafka message (or, from a
host's relay, :mod:`..collectors.relay_server`, of one job's ranks on one host).

A stream worker closes, for every rank and window, one FunctionPattern per function and
one RankWindow. Sent one message each, a 512-rank backlog made ~4.7 messages for every
input message, each paying Faust's and aiokafka's per-message cost twice (produced, then
consumed by the compare or diagnose agent): that fan-out was the largest share of the
worker's time (docs/benchmarks.md). So the worker sends what it has for one key at once
as one ``RecordBundle`` (``record_bundle.v1.avsc``): an Avro array whose items are the
framed records, byte for byte what each would have been as a message of its own
(single-object or Confluent framing). A reader takes the items in order, as if each had
been a message: decoding, validation, dead-lettering and the sink's raw path work on
items unchanged.

The bundle itself is always in single-object encoding (its fingerprint marks it), with or
without a schema registry: it is an envelope, not a record of a topic's subject; the
items carry the registry framing when one is configured. A bundle never holds a bundle
(an item that is one is refused by the reader's codec as a record it does not expect).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import fastavro

from .codec import bundled_schemas, writer_fingerprint
from .errors import SchemaError
from .vocabulary import (
    RECORD_BUNDLE,
    RECORD_BUNDLE_VERSION,
    SINGLE_OBJECT_HEADER_LEN,
    SINGLE_OBJECT_MAGIC,
)

MAX_RECORDS = 1000  # items a worker puts in one bundle
MAX_BYTES = 512 * 1024  # bytes of items in one bundle (Kafka's default message limit is 1 MiB)
READ_MAX_RECORDS = 100_000  # a bundle claiming more items than this is refused as corrupt


@lru_cache(maxsize=1)
def _writer() -> tuple[bytes, Any]:
    sv = bundled_schemas().latest(RECORD_BUNDLE)
    return SINGLE_OBJECT_MAGIC + sv.fingerprint, sv.parsed


def is_bundle(data: Any) -> bool:
    return type(data) is bytes and writer_fingerprint(data) == _writer()[0][len(SINGLE_OBJECT_MAGIC):]


def pack(items: Sequence[bytes]) -> bytes:
    """One bundle holding ``items`` (framed records), in order."""
    header, parsed = _writer()
    buf = io.BytesIO()
    buf.write(header)
    fastavro.schemaless_writer(buf, parsed, {"schema_version": RECORD_BUNDLE_VERSION, "records": list(items)})
    return buf.getvalue()


def unpack(data: bytes) -> list[bytes]:
    """The items of a bundle; :class:`SchemaError` naming the problem when it is corrupt."""
    parsed = _writer()[1]
    if not is_bundle(data):
        raise SchemaError("not a RecordBundle message")
    try:
        record = fastavro.schemaless_reader(io.BytesIO(data[SINGLE_OBJECT_HEADER_LEN:]), parsed, None)
    except Exception as exc:  # fastavro raises several types on corrupt bodies
        raise SchemaError(f"corrupt RecordBundle body: {exc}") from exc
    items = record["records"] if isinstance(record, dict) else None
    if not isinstance(items, list) or len(items) > READ_MAX_RECORDS:
        raise SchemaError(f"RecordBundle with an unusable item list ({type(items).__name__}, "
                          f"{len(items) if isinstance(items, list) else 0} items; at most {READ_MAX_RECORDS})")
    return items


def records_in(data: Any) -> list[Any]:
    """The framed records a message carries: a bundle's items, else the message itself."""
    return unpack(data) if is_bundle(data) else [data]


def bundled(items: Iterable[bytes], max_records: int | None = None, max_bytes: int | None = None) -> list[bytes]:
    """The messages that carry ``items`` (framed records of one key) in order: bundles of at most
    ``max_records`` items and ``max_bytes`` bytes (default :data:`MAX_RECORDS`, :data:`MAX_BYTES`;
    an item larger than that alone), and a group of one item as the item itself (a plain
    message, as before bundles)."""
    return [message for message, _ in bundled_counted(items, max_records, max_bytes)]


def bundled_counted(items: Iterable[bytes], max_records: int | None = None,
                    max_bytes: int | None = None) -> list[tuple[bytes, int]]:
    """:func:`bundled`, each message with the number of items it carries."""
    max_records = MAX_RECORDS if max_records is None else max_records
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    messages: list[tuple[bytes, int]] = []
    group: list[bytes] = []
    size = 0

    def close() -> None:
        if group:
            messages.append((group[0] if len(group) == 1 else pack(group), len(group)))

    for item in items:
        if group and (len(group) >= max_records or size + len(item) > max_bytes):
            close()
            group, size = [], 0
        group.append(item)
        size += len(item)
    close()
    return messages
