"""The sink protocol (after quix-streams): ``setup``, ``add``, ``flush``.

The service adds rows as messages arrive and calls ``flush`` when
:meth:`BatchingSink.due` says so; Kafka offsets are committed only after
``flush`` returned. ``flush`` raises :class:`StoreUnavailable` (with
``retry_after``) to push back: the rows stay buffered, the offsets stay
uncommitted, and the service retries later.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
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
    """Column buffers per table, bounded at ``max_backlog_rows`` (oldest rows dropped, counted).

    Subclasses implement :meth:`write` for one table's columns.
    """

    def __init__(self, columns: dict[str, list[str]], flush_rows: int, flush_interval_s: float,
                 max_backlog_rows: int):
        self._columns = columns
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.max_backlog_rows = max_backlog_rows
        self._buffers: dict[str, list[list[Any]]] = {t: [[] for _ in cols] for t, cols in columns.items()}
        self._counts: dict[str, int] = dict.fromkeys(columns, 0)
        self.buffered = 0
        self.dropped_rows = 0
        self.written_rows = 0
        self._last_flush = time.monotonic()

    def add(self, table: str, row: Sequence[Any]) -> None:
        for column, value in zip(self._buffers[table], row, strict=True):
            column.append(value)
        self._counts[table] += 1
        self.buffered += 1
        if self.buffered > self.max_backlog_rows:
            self._drop_oldest(self.buffered - self.max_backlog_rows)

    def _drop_oldest(self, n: int) -> None:
        table = max(self._counts, key=self._counts.__getitem__)
        n = min(n, self._counts[table])
        for column in self._buffers[table]:
            del column[:n]
        self._counts[table] -= n
        self.buffered -= n
        self.dropped_rows += n

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.buffered >= self.flush_rows or (
            self.buffered > 0 and now - self._last_flush >= self.flush_interval_s)

    def flush(self) -> int:
        """Write table by table; a table written is cleared, so a retry never repeats it."""
        written = 0
        for table, count in self._counts.items():
            if not count:
                continue
            self.write(table, self._columns[table], self._buffers[table])
            self._buffers[table] = [[] for _ in self._columns[table]]
            self._counts[table] = 0
            self.buffered -= count
            written += count
        self.written_rows += written
        self._last_flush = time.monotonic()
        return written

    @abstractmethod
    def write(self, table: str, columns: list[str], data: list[list[Any]]) -> None:
        """Insert one table's buffered columns."""
