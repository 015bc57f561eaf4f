"""A real Prometheus scrapes perftracker: the running sink's /metrics (on its query API,
behind the bearer token, as the shipped manifests have it) and the worker's counters through
the worker's metrics endpoint code; PromQL over the HTTP API sees perftracker's series with
the scrape target's ``job`` and the training job's ``training_job``, never ``exported_job``.

Prometheus is Debian's binary (/usr/bin/prometheus; ``python -m tests`` installs it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from perftracker_ml.deploy.tansu import free_port
from perftracker_ml.schemas.metrics import MetricsServer, registry_of
from perftracker_ml.schemas.settings import Secret, Settings
from perftracker_ml.streams.context import StreamCounters
from perftracker_ml.streams.gaps import GapMetrics

from ...prometheus_server import query
from ..waiting import wait_for
from .conftest import RunningSink

pytestmark = pytest.mark.integration

TOKEN = "scrape-t0ken"


def test_prometheus_scrapes_the_sink_and_the_worker_counters(
        sink_settings: Settings, start_sink: Callable[..., RunningSink], prometheus, tmp_path: Path):
    sink_port = free_port()
    start_sink(dataclasses.replace(sink_settings, http_token=Secret(TOKEN),
                                   store=dataclasses.replace(sink_settings.store, query_port=sink_port)))
    counters = StreamCounters()  # what a worker exports, served as streams/metrics.py serves it
    GapMetrics(counters).batch_in("train-7", 3, 2, 5, {"spans": [], "iterations": []})
    worker = MetricsServer(registry_of(counters), 0)
    try:
        base = prometheus(f"""scrape_configs:
  - job_name: perftracker-sink
    authorization: {{type: Bearer, credentials: {TOKEN}}}
    static_configs: [{{targets: ["127.0.0.1:{sink_port}"]}}]
  - job_name: perftracker-worker
    static_configs: [{{targets: ["127.0.0.1:{worker.port}"]}}]
""")
        up = wait_for(lambda: len(query(base, 'up{job=~"perftracker-.*"} == 1')) == 2 or None, 120, 0.5,
                      describe=lambda: query(base, "up"))
        assert up
        consumed = wait_for(lambda: query(base, 'perftracker_sink_consumed_total{job="perftracker-sink"}'), 60, 0.5)
        assert consumed[0]["metric"]["instance"] == f"127.0.0.1:{sink_port}"
        (lost,) = wait_for(lambda: query(base, "perftracker_stream_batches_lost_total"), 60, 0.5)
        assert lost["metric"]["job"] == "perftracker-worker"
        assert lost["metric"]["training_job"] == "train-7" and lost["value"][1] == "2"
        assert query(base, 'perftracker_stream_worst_rank_batches_lost{training_job="train-7", rank="3"}')
        flush = query(base, 'perftracker_sink_flush_seconds_count{job="perftracker-sink"}')
        assert flush and "le" not in flush[0]["metric"]
        assert query(base, '{__name__=~"perftracker_.+", exported_job!=""}') == []
    finally:
        worker.close()
