"""The ClickHouse sink: batched, column-oriented inserts, and raw Avro containers (:mod:`.raw`).

A batch the store refuses because of its values (:class:`RowsRejected`, e.g. a
negative number for a UInt32 column) is bisected: halves are inserted
separately until the rejected rows are alone; those go to ``on_rejected`` (the
service dead-letters them with the table and the store's reason) and every
other row is written. ``k`` bad rows among ``n`` cost about ``2k log2(n)``
extra inserts, only when the store refuses something. A connection error
(:class:`StoreUnavailable`) is raised as before, leaving in the batch only the
rows not yet written or rejected, for the retry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..schemas import MultiCodec, SchemaError
from ..schemas.settings import StoreSettings
from ..schemas.validate import validate
from .base import BatchingSink
from .errors import RowsRejected, StoreUnavailable
from .raw import RAW_TABLES, RawMessage, container
from .rows import ROW_BUILDERS
from .schema import TABLES, migrate
from .store import Store

log = logging.getLogger(__name__)

RAW_PREFIX = "raw:"
OnBad = Callable[[RawMessage, str], None]
OnRejected = Callable[[str, dict[str, Any], str], None]  # (table, row by column, reason)


URGENT_TABLES = ("anomalies", "incidents")  # a detection is written as soon as it arrives


class ClickHouseSink(BatchingSink):
    def __init__(self, store: Store, settings: StoreSettings, on_bad: OnBad | None = None,
                 on_rejected: OnRejected | None = None):
        super().__init__({name: t.column_names for name, t in TABLES.items()},
                         settings.flush_rows, settings.flush_interval_s, settings.max_backlog_rows,
                         urgent=URGENT_TABLES)
        self.store = store
        self.settings = settings
        self._raw: dict[str, list[RawMessage]] = {name: [] for name in RAW_TABLES}
        self._on_bad = on_bad or (lambda m, reason: log.warning("bad record dropped: %s", reason))
        self._on_rejected = on_rejected or (
            lambda table, row, reason: log.warning("row of %s rejected: %s", table, reason))
        self._codec = MultiCodec(list(RAW_TABLES))

    def setup(self) -> None:
        migrate(self.store, self.settings.retention_days, self.settings.incident_retention_days,
                cluster=self.settings.cluster)

    def write(self, table: str, columns: list[str], rows: Sequence[Sequence[Any]]) -> None:
        """Insert ``rows``, bisecting around rows the store rejects (see the module docstring)."""
        pending = [rows]  # chunks still to insert, the next one last
        while pending:
            chunk = pending.pop()
            try:
                self.store.insert(table, columns, list(zip(*chunk, strict=True)))  # column-oriented: fastest
            except RowsRejected as exc:
                if len(chunk) > 1:
                    mid = len(chunk) // 2
                    pending += [chunk[mid:], chunk[:mid]]
                    continue
                self.rejected_rows += 1
                self._on_rejected(table, dict(zip(columns, chunk[0], strict=False)), str(exc))
            except StoreUnavailable:
                if isinstance(rows, list):  # what the retry must still write, in order
                    rows[:] = [row for part in [chunk, *reversed(pending)] for row in part]
                raise

    # -- raw containers ----------------------------------------------------
    def add_raw(self, name: str, message: RawMessage) -> None:
        """Buffer an undecoded message of a raw-ingested type (counts as one row)."""
        raw = self._raw[name]
        raw.append(message)
        self.buffered += 1
        if self.buffered > self.max_backlog_rows and raw:
            del raw[0]
            self.buffered -= 1
            self.dropped_rows += 1

    def take(self) -> dict[str, list]:
        batch: dict[str, list] = {RAW_PREFIX + n: msgs for n, msgs in self._raw.items() if msgs}
        self._raw = {name: [] for name in RAW_TABLES}
        batch.update(super().take())
        return batch

    def write_batch(self, batch: dict[str, list]) -> int:
        """Rows (and raw messages) written; rows the store rejected are not counted."""
        written, rejected = 0, self.rejected_rows
        for key in [k for k in batch if k.startswith(RAW_PREFIX)]:
            messages = batch[key]
            self._write_raw(key[len(RAW_PREFIX):], messages)
            del batch[key]
            written += len(messages)
        return written + super().write_batch(batch) - (self.rejected_rows - rejected)

    def flush(self) -> int:
        """Synchronous flush; on failure what was not written goes back into the buffers."""
        batch = self.take()
        try:
            written = self.write_batch(batch)
        except StoreUnavailable:
            self._restore(batch)
            raise
        self.written_rows += written
        return written

    def _restore(self, batch: dict[str, list]) -> None:
        for key, items in batch.items():
            if key.startswith(RAW_PREFIX):
                name = key[len(RAW_PREFIX):]
                self._raw[name] = items + self._raw[name]
            else:
                self._rows[key] = items + self._rows[key]
            self.buffered += len(items)

    def _write_raw(self, name: str, messages: list[RawMessage]) -> None:
        reason: Exception
        try:
            self.store.raw_insert(RAW_TABLES[name], container(name, messages), "Avro")
            return
        except RowsRejected as exc:
            reason = exc
        except StoreUnavailable as exc:
            if not self.store.ping():
                raise
            reason = exc
        log.warning("store refused a %s container (%s); decoding its %d records one by one",
                    name, reason, len(messages))
        self._write_decoded(messages)

    def _write_decoded(self, messages: list[RawMessage]) -> None:
        """The slow path for a refused container: decode and validate in Python, dead-letter what fails."""
        tables: dict[str, list[Sequence[Any]]] = {}
        for m in messages:
            try:
                rec_name, record = self._codec.decode(m.value)
                invalid = validate(rec_name, record)
                batches = [] if invalid else ROW_BUILDERS[rec_name](record)
            except (SchemaError, KeyError, TypeError, ValueError) as exc:
                self._on_bad(m, f"undecodable: {exc}")
                continue
            if invalid:
                self._on_bad(m, f"invalid: {invalid}")
                continue
            for table, rows in batches:
                tables.setdefault(table, []).extend(rows)
        for table, table_rows in tables.items():
            self.write(table, self._columns[table], table_rows)
