"""Self-observability of a running stack: worker and sink /metrics over HTTP, their log files.

A real `perftracker up` (tansu, a Faust worker, the sink on chDB); a synthetic job
is sent with one batch of rank 2 left out (a gap) and a drop count in its headers,
plus one undecodable message; then each endpoint is scraped as Prometheus would.
"""

from __future__ import annotations

import urllib.request
import uuid

import pytest
from confluent_kafka import Producer
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.vocabulary import EVENT_BATCH
from prometheus_client.parser import text_string_to_metric_families

from ...prometheus_server import query
from ..waiting import wait_for
from .conftest import Stack

pytestmark = pytest.mark.integration

GAP_RANK, GAP_SEQ, DROPPED = 2, 5, 40


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(metrics: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in metrics.items() if n == name and set(labels.items()) <= set(ls))


def send_job(bootstrap: str, job: str) -> int:
    codec, sent = Codec(EVENT_BATCH), 0
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for rank, record in batches(SyntheticJob(job, ranks=4, seconds=20, seed=3)):
        if rank == GAP_RANK and record["seq"] == GAP_SEQ:
            continue  # lost on the way: the worker sees a gap in rank 2's sequence numbers
        if rank == 1 and record["seq"] >= 3:
            record["dropped_events"] = DROPPED  # the collector's running total of dropped events
        producer.produce("pt.events", key=f"{job}|{rank}".encode(), value=codec.encode(record))
        sent += 1
    producer.produce("pt.events", key=b"bad|0", value=b"\x00 not avro")
    assert producer.flush(15) == 0
    return sent


@pytest.fixture(scope="module")
def job(stack: Stack) -> str:
    name = f"obs-{uuid.uuid4().hex[:6]}"
    send_job(stack.state()["bootstrap"], name)
    return name


def test_worker_metrics_endpoint_counts_what_it_processed(stack: Stack, job: str):
    (port,) = stack.state()["worker_metrics_ports"]
    url = f"http://127.0.0.1:{port}/metrics"

    def processed():  # every batch in (windows closed, the bad message and the drops seen), lag sampled
        m = scrape(url)
        done = (value(m, "perftracker_stream_window_close_delay_seconds_count") > 0
                and value(m, "perftracker_stream_decode_errors_total") > 0
                and value(m, "perftracker_stream_events_dropped_total", training_job=job) > 0
                and any(n == "perftracker_stream_consumer_lag" for n, _ in m))
        return m if done else None

    m = wait_for(processed, 60, every_s=1.0, describe=lambda: scrape(url))
    assert value(m, "perftracker_stream_events_in_total") > 0
    assert value(m, "perftracker_stream_records_in_total", record="EventBatch") > 0
    assert value(m, "perftracker_stream_decode_errors_total", source="inputs") >= 1
    assert value(m, "perftracker_stream_batches_lost_total", training_job=job) == 1
    assert value(m, "perftracker_stream_worst_rank_batches_lost", training_job=job, rank=str(GAP_RANK)) == 1
    assert value(m, "perftracker_stream_events_dropped_total", training_job=job) == DROPPED
    lags = [v for (n, _), v in m.items() if n == "perftracker_stream_consumer_lag"]
    assert lags and all(v >= 0 for v in lags)
    assert stack.cli("status", "--json").stdout.count(url) == 1


def test_sink_metrics_on_its_query_api(stack: Stack, job: str):
    url = stack.state()["query_url"] + "/metrics"

    def written():
        m = scrape(url)
        return m if value(m, "perftracker_sink_flush_seconds_count") > 0 else None

    m = wait_for(written, 60, every_s=1.0, describe=lambda: scrape(url))
    assert value(m, "perftracker_sink_consumed_total") > 0
    assert value(m, "perftracker_sink_rows_written_total") > 0
    assert value(m, "perftracker_sink_backlog_rows") >= 0
    assert ("perftracker_alerts_skipped_total", ()) in m  # the alert dispatcher's counters too


def test_sink_and_worker_logs_are_written_with_levels(stack: Stack):
    logs = stack.data_dir / "logs"
    sink = logs / "sink.log"
    assert " INFO perftracker_ml.sinks.service " in sink.read_text()
    assert "sink consuming" in sink.read_text()
    worker_logs = [logs / f"worker-{pid}.log" for pid in stack.state()["worker_pids"]]
    assert worker_logs and all(p.exists() for p in worker_logs), sorted(logs.iterdir())
    worker = worker_logs[0].read_text()
    assert " INFO perftracker_ml.streams " in worker and "metrics at http://127.0.0.1:" in worker
    assert worker.count("metrics at http://") == 1  # one line, not repeated by a second handler


def test_a_real_prometheus_scrapes_the_running_stack(stack: Stack, job: str, prometheus):
    """The stack's own endpoints (its Faust worker's metrics port and the sink's query API),
    scraped by a real Prometheus and asked in PromQL, with the training job as ``training_job``."""
    (worker_port,) = stack.state()["worker_metrics_ports"]
    sink = stack.state()["query_url"].removeprefix("http://")
    base = prometheus(f"""scrape_configs:
  - job_name: perftracker-worker
    static_configs: [{{targets: ["127.0.0.1:{worker_port}"]}}]
  - job_name: perftracker-sink
    static_configs: [{{targets: ["{sink}"]}}]
""")

    def seen() -> list[dict] | None:
        lost = query(base, f'perftracker_stream_batches_lost_total{{training_job="{job}"}}')
        rows = query(base, 'sum by (job) (perftracker_sink_rows_written_total)')
        return [*lost, *rows] if lost and rows else None

    found = wait_for(seen, 60, every_s=1.0, describe=lambda: query(base, "up"))
    lost = next(r for r in found if r["metric"].get("training_job") == job)
    assert lost["metric"]["job"] == "perftracker-worker" and float(lost["value"][1]) == 1
    assert "exported_job" not in lost["metric"]
    written = next(r for r in found if r["metric"].get("job") == "perftracker-sink")
    assert float(written["value"][1]) > 0
