"""A worker's Prometheus endpoint and its consumer lag per partition.

The endpoint (``GET /metrics`` on ``streams.metrics_host:metrics_port``, off
when the port is 0) exports the worker's :class:`~.context.StreamCounters`
through :mod:`perftracker_ml.schemas.metrics`. Lag is sampled every
``LAG_INTERVAL_S`` into the ``consumer_lag`` gauge: per assigned partition,
the high watermark the consumer saw in its last fetch minus the next offset to
process, clamped at 0. The broker's end offsets (ListOffsets) are not used:
tansu reports them too low (docs/background.md). A partition never fetched,
or not yet read, has no series; a revoked one loses its series.
"""

from __future__ import annotations

import logging
from typing import Any

from ..schemas.metrics import MetricsServer, registry_of
from ..schemas.settings import StreamSettings
from .context import StreamContext, StreamCounters

log = logging.getLogger("perftracker_ml.streams")

LAG_INTERVAL_S = 2.0


def consumer_lag(consumer: Any) -> dict[tuple[str, ...], int]:
    """(topic, partition) -> lag of a Faust consumer's assigned partitions (see the module docstring)."""
    if consumer is None:
        return {}
    read = getattr(consumer, "_read_offset", {})  # Faust: last offset handed to an agent, per partition
    lags: dict[tuple[str, ...], int] = {}
    for tp in consumer.assignment():
        high, last = consumer.highwater(tp), read.get(tp)
        if high is None or last is None:
            continue
        lags[(tp.topic, str(tp.partition))] = max(0, int(high) - int(last) - 1)
    return lags


def register_metrics(app: Any, ctx: StreamContext, settings: StreamSettings) -> None:
    """Sample the lag on a timer; serve ``/metrics`` once the worker starts (when a port is set)."""

    @app.timer(LAG_INTERVAL_S)
    async def sample_lag() -> None:
        try:
            ctx.counters.replace(StreamCounters.consumer_lag, consumer_lag(app.consumer))
        except Exception as exc:  # a consumer between assignments: next tick
            ctx.failed("lag", exc)

    if settings.metrics_port <= 0:
        return

    @app.task
    async def serve_metrics() -> None:
        try:
            server = MetricsServer(registry_of(ctx.counters), settings.metrics_port, settings.metrics_host)
        except (OSError, ImportError) as exc:  # port taken: detection goes on without metrics
            log.error("metrics endpoint on %s:%d not started: %s", settings.metrics_host,
                      settings.metrics_port, exc)
            return
        log.info("metrics at %s", server.url)
