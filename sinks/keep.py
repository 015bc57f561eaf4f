"""Keep records produced outside the stream workers (an imported trace) in the store.

`perftracker import-traces` runs the detection in process; its FunctionPattern,
RankWindow, FunctionComparison and Anomaly records are the same a stream worker
sends the sink, so they become the same rows (:data:`.rows.ROW_BUILDERS`), and
`diagnose` and `report` read them like any job.

Two ways in, one writer (:func:`write_records`):

* **A running sink owns the store** (chDB allows one process): the records go to
  its query API, ``POST /store``, as a body of length-prefixed Avro
  single-object messages (:func:`encode_records`); the sink decodes, validates
  and writes them itself. Not through Kafka: the stream workers consume
  ``pt.patterns`` and ``pt.findings`` too and would compare the imported windows
  again under the stream policy. Alerts are not dispatched for them (an import
  is not a live job).
* **No sink**: the CLI opens the store itself (the embedded chDB of the data
  dir, or the ClickHouse server ``store.url`` names), creates or migrates the
  tables and writes.

Each record is validated with the content rules the sink applies to Kafka
records; an invalid one is left out and reported, never written.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..schemas import MultiCodec, SchemaError
from ..schemas.settings import StoreSettings
from ..schemas.validate import validate
from .clickhouse import ClickHouseSink
from .rows import ROW_BUILDERS
from .schema import migrate
from .store import Store

KEPT_RECORDS = tuple(ROW_BUILDERS)  # FunctionPattern, RankWindow, FunctionComparison, Anomaly
_LEN = struct.Struct(">I")


@dataclass
class Kept:
    """What one keep wrote: rows written, rows the store refused, records left out and why."""

    records: int = 0
    rows_written: int = 0
    rows_rejected: int = 0
    invalid: list[str] = field(default_factory=list)
    where: str = ""  # the store, or the sink's API, for the CLI's line

    def as_dict(self) -> dict[str, Any]:
        return {"records": self.records, "rows_written": self.rows_written,
                "rows_rejected": self.rows_rejected, "invalid": self.invalid[:20]}


def _codec() -> MultiCodec:
    return MultiCodec(list(KEPT_RECORDS))


def encode_records(records: Iterable[tuple[str, dict]]) -> bytes:
    """``(name, record)`` pairs -> one body: per record a 4-byte big-endian length and its
    Avro single-object encoding (the writer schema's fingerprint names the record)."""
    codec = _codec()
    parts = []
    for name, record in records:
        data = codec.encode(name, record)
        parts += [_LEN.pack(len(data)), data]
    return b"".join(parts)


def decode_records(body: bytes) -> list[tuple[str, dict]]:
    """The inverse of :func:`encode_records`; :class:`SchemaError` names the first bad part."""
    codec = _codec()
    out: list[tuple[str, dict]] = []
    pos = 0
    while pos < len(body):
        if pos + _LEN.size > len(body):
            raise SchemaError(f"truncated body: {len(body) - pos} byte(s) after record {len(out)}")
        (n,) = _LEN.unpack_from(body, pos)
        pos += _LEN.size
        if pos + n > len(body):
            raise SchemaError(f"truncated body: record {len(out)} announces {n} bytes, {len(body) - pos} left")
        out.append(codec.decode(body[pos:pos + n]))
        pos += n
    return out


def write_records(store: Store, settings: StoreSettings, records: Iterable[tuple[str, dict]],
                  setup: bool = False) -> Kept:
    """Validate ``records`` and write their rows (``setup``: create/migrate the tables first).

    Raises :class:`~.errors.StoreUnavailable` when the store cannot be written; rows the store
    refuses for their values are counted (``rows_rejected``), the others written."""
    kept = Kept(where=store.target.describe())
    sink = ClickHouseSink(store, settings, on_rejected=lambda table, row, reason: kept.invalid.append(
        f"row of {table} refused by the store: {reason}"))
    sink.max_backlog_rows = max(sink.max_backlog_rows, 1 << 62)  # one bounded import: never drop
    if setup:
        migrate(store, settings.retention_days, settings.incident_retention_days, cluster=settings.cluster)
    for name, record in records:
        kept.records += 1
        problem = validate(name, record) if name in ROW_BUILDERS else f"{name} records are not stored"
        if problem:
            kept.invalid.append(problem)
            continue
        for table, rows in ROW_BUILDERS[name](record):
            sink.add_rows(table, rows)
    kept.rows_written = sink.flush()
    kept.rows_rejected = sink.rejected_rows
    return kept
