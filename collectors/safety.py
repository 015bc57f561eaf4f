"""Errors inside instrumentation are caught, counted, and logged at most once a minute."""

from __future__ import annotations

import logging
import threading
import time

from ..schemas.redact import redact_configured
from .counters import CollectorCounters

log = logging.getLogger("perftracker_ml.collectors")


class ErrorBudget:
    """Counts exceptions caught in instrumentation; logs one line per ``log_every_s``."""

    def __init__(self, log_every_s: float = 60.0, counters: CollectorCounters | None = None):
        counters = counters if counters is not None else CollectorCounters()
        self._caught = counters.cell(CollectorCounters.errors_caught)  # changed under self._lock
        self._log_every_s = log_every_s
        self._last_log = -1e18
        self._lock = threading.Lock()

    def caught(self, where: str, exc: BaseException) -> None:
        """Record one swallowed exception. Never raises."""
        try:
            with self._lock:
                self._caught.value += 1
                now = time.monotonic()
                if now - self._last_log < self._log_every_s:
                    return
                self._last_log = now
                total = self._caught.value
            log.warning("perftracker: instrumentation error in %s (%s: %s); %d caught so far, "
                        "training continues", where, type(exc).__name__, redact_configured(str(exc)), total)
        except Exception:  # noqa: BLE001 - logging must never reach training
            pass

    @property
    def count(self) -> int:
        """Exceptions caught so far."""
        return self._caught.value
