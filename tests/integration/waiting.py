"""Polling for an outcome produced by other processes (brokers, workers, sinks)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], object], timeout_s: float = 30.0, every_s: float = 0.1,
             describe: Callable[[], object] | None = None) -> object:
    """Return ``cond()``'s first truthy value; fail after ``timeout_s`` (with ``describe()``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every_s)
    value = cond()
    if value:
        return value
    state = f": {describe()}" if describe is not None else ""
    raise AssertionError(f"condition not met within {timeout_s}s{state}")
