"""The sink protocol (after quix-streams): ``setup``, ``add``, ``flush``.

How the sink service drives it: rows are added as messages arrive; when
:meth:`BatchingSink.due` says so (enough rows, the interval passed, or a row of an
``urgent`` table such as an anomaly waits: a detection is written right away), the service hands everything buffered to the
background flusher with :meth:`BatchingSink.take`, which writes it with
:meth:`BatchingSink.write_batch` while decoding goes on. Kafka offsets are committed
only after that batch is written. A write raises :class:`StoreUnavailable` (with
``retry_after``) to push back: the batch is kept, the offsets stay uncommitted, and the
flusher retries it. :meth:`Sink.flush` (write everything buffered, in the caller's thread)
is the protocol's synchronous form, used by tools and tests that own a sink directly.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any


class Sink(ABC):
    def setup(self) -> None:
        """Prepare the destination (e.g. create tables); called once before the first add."""
        return None

    @abstractmethod
    def add(self, table: str, row: Sequence[Any]) -> None:
        """Buffer one row of ``table``."""

    @abstractmethod
    def flush(self) -> int:
        """Write everything buffered; return the rows written. Raises StoreUnavailable."""

    def close(self) -> None:
        """Release resources; buffered rows not flushed are the caller's to flush first."""
        return None


class BatchingSink(Sink):
    """Row buffers per table, bounded at ``max_backlog_rows`` (oldest rows dropped, counted).

    Subclasses implement :meth:`write` for one table's columns.
    """

    def __init__(self, columns: dict[str, list[str]], flush_rows: int, flush_interval_s: float,
                 max_backlog_rows: int, urgent: Iterable[str] = ()):
        self._columns = columns
        self.urgent = frozenset(urgent) & set(columns)  # tables whose rows are written without waiting
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.max_backlog_rows = max_backlog_rows
        self._rows: dict[str, list[Sequence[Any]]] = {t: [] for t in columns}
        self.buffered = 0
        self.dropped_rows = 0
        self.rejected_rows = 0  # refused by the store and handed to the caller (not written)
        self.written_rows = 0
        self._last_flush = time.monotonic()

    def add(self, table: str, row: Sequence[Any]) -> None:
        self._rows[table].append(row)
        self.buffered += 1
        if self.buffered > self.max_backlog_rows:
            self._drop_oldest(self.buffered - self.max_backlog_rows)

    def add_rows(self, table: str, rows: Sequence[Sequence[Any]]) -> None:
        """Buffer several rows of ``table`` at once (the hot path)."""
        self._rows[table].extend(rows)
        self.buffered += len(rows)
        if self.buffered > self.max_backlog_rows:
            self._drop_oldest(self.buffered - self.max_backlog_rows)

    def _drop_oldest(self, n: int) -> None:
        table = max(self._rows, key=lambda t: len(self._rows[t]))
        n = min(n, len(self._rows[table]))
        del self._rows[table][:n]
        self.buffered -= n
        self.dropped_rows += n

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.buffered >= self.flush_rows or (
            self.buffered > 0 and now - self._last_flush >= self.flush_interval_s) or self.urgent_rows()

    def urgent_rows(self) -> bool:
        """A row of an ``urgent`` table is buffered."""
        return any(self._rows[t] for t in self.urgent)

    def flush(self) -> int:
        """Write table by table; a table written is cleared, so a retry never repeats it."""
        written = 0
        for table, rows in self._rows.items():
            if not rows:
                continue
            self.write(table, self._columns[table], rows)
            self._rows[table] = []
            self.buffered -= len(rows)
            written += len(rows)
        self.written_rows += written
        self._last_flush = time.monotonic()
        return written

    def take(self) -> dict[str, list[Sequence[Any]]]:
        """Hand over everything buffered (for a background flush); the buffers start empty."""
        batch = {t: rows for t, rows in self._rows.items() if rows}
        self._rows = {t: [] for t in self._columns}
        self.buffered = 0
        self._last_flush = time.monotonic()
        return batch

    def write_batch(self, batch: dict[str, list[Sequence[Any]]]) -> int:
        """Write a batch from :meth:`take`; each table written leaves ``batch``, so a retry after
        :class:`StoreUnavailable` never writes a table twice. Returns the rows written."""
        written = 0
        for table in list(batch):
            rows = batch[table]
            self.write(table, self._columns[table], rows)
            del batch[table]
            written += len(rows)
        return written

    @abstractmethod
    def write(self, table: str, columns: list[str], rows: Sequence[Sequence[Any]]) -> None:
        """Insert one table's buffered rows (each in ``columns`` order)."""
