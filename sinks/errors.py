"""Errors of the sink package (store, sink service, query API, alerts)."""

from __future__ import annotations

from ..schemas.errors import ConfigError, PerftrackerError


class SinkError(PerftrackerError):
    """Base of every error raised on purpose by :mod:`perftracker_ml.sinks`."""


class StoreUrlError(SinkError, ConfigError):
    """``store.url`` cannot be used as written (a setting to fix: the CLI exits 2)."""


class StoreUnavailable(SinkError):
    """The store did not accept a write or a query; try again after ``retry_after`` seconds.

    This is backpressure, as in quix-streams' ``SinkBackpressureError``: the
    caller keeps its batch and its offsets and retries later.
    """

    def __init__(self, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.retry_after = retry_after


class RowsRejected(SinkError):
    """The store answered and refused the rows themselves (a value its column type or a
    constraint rejects). Retrying the same rows cannot succeed: the sink isolates the
    rejected ones and dead-letters them instead (see :mod:`.clickhouse`)."""


class UnknownQuery(SinkError):
    """A named query that does not exist, or parameters that do not fit it."""


class NoStore(SinkError):
    """Neither a running sink nor the store could answer."""
