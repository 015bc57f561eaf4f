"""Background flush: the store writes one batch while the consumer decodes the next.

At most one batch is in flight. A batch that fails with
:class:`StoreUnavailable` is retried in the flush thread with exponential
backoff (0.5 s doubling to 30 s) until it is written or the service stops;
meanwhile the consumer keeps buffering, bounded by ``max_backlog_rows``. The
offsets consumed before a batch was taken travel with it and are committed by
the service once it is written. Overlap is real: chDB and the HTTP driver
release the GIL while ClickHouse works.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from .base import BatchingSink
from .errors import StoreUnavailable

log = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], int]


@dataclass(frozen=True)
class Flushed:
    rows: int
    offsets: Offsets
    duration_ms: int = -1  # from submit to written, retries included (-1: not measured)


class BackgroundFlusher:
    def __init__(self, sink: BatchingSink, stop: threading.Event, max_backoff_s: float = 30.0):
        self.sink = sink
        self.failures = 0
        self._stop = stop
        self._max_backoff_s = max_backoff_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pt-sink-flush")
        self._inflight: tuple[Future[int], Offsets] | None = None
        self._submitted = 0.0
        self.inflight_rows = 0  # rows of the batch being written

    @property
    def busy(self) -> bool:
        return self._inflight is not None

    def submit(self, batch: dict[str, list[Sequence[Any]]], offsets: Offsets) -> None:
        assert self._inflight is None, "one batch at a time"
        self._submitted = time.monotonic()
        self.inflight_rows = sum(len(rows) for rows in batch.values())
        self._inflight = (self._pool.submit(self._write, batch), offsets)

    def _write(self, batch: dict[str, list[Sequence[Any]]]) -> int:
        delay = min(0.5, self._max_backoff_s)
        total = sum(len(rows) for rows in batch.values())  # tables written before a failure count
        rejected = self.sink.rejected_rows
        while True:
            try:
                self.sink.write_batch(batch)
                return total - (self.sink.rejected_rows - rejected)
            except StoreUnavailable as exc:
                self.failures += 1
                pending = sum(len(rows) for rows in batch.values())
                log.warning("flush failed (%s); %d rows kept, retry in %.1fs", exc, pending, delay)
                if self._stop.wait(delay):
                    raise
                delay = min(delay * 2, self._max_backoff_s)

    def reap(self, wait_s: float = 0.0) -> Flushed | None:
        """The finished batch, if any (waiting up to ``wait_s``); None while it is still running.

        A batch abandoned at stop (store still down) is dropped here: its
        offsets were never committed, so those messages are read again on restart.
        """
        if self._inflight is None:
            return None
        future, offsets = self._inflight
        try:
            rows = future.result(timeout=wait_s) if wait_s else (
                future.result() if future.done() else None)
        except FutureTimeout:  # distinct from the builtin before Python 3.11
            return None
        except StoreUnavailable:
            self._inflight, self.inflight_rows = None, 0
            return None
        if rows is None:
            return None
        self._inflight, self.inflight_rows = None, 0
        return Flushed(rows, offsets, round((time.monotonic() - self._submitted) * 1000))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
