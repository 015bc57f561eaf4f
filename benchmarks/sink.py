"""Sink benchmark: ``python -m benchmarks.sink --json``.

* ``rows_per_s_chdb``: rows written into chDB per second by the sink service,
  end to end from a real (tansu) broker: consume, decode, map to rows, batched
  inserts, offset commits. Timed from the first message consumed to the last
  row written (the consumer-group join is not counted). The records are a
  realistic job (``perftracker_ml.deploy.workloads.store_records.job_records``), and the rows are
  counted in the store afterwards (``rows`` must equal ``rows_expected``,
  what the Python mapping of :mod:`perftracker_ml.sinks.rows` gives): per rank and
  5 s window, 5 function patterns and one RankWindow carrying 50 iterations;
  per window, two FunctionComparisons (the all-reduce, the data loader).
  ``sink_cpu_s`` is the CPU time this process (the sink's threads, librdkafka,
  chDB) spent meanwhile, and ``load_avg_1m`` the machine's load: on a shared
  machine the wall-clock rate depends on both.
* ``alert_latency_ms_p50``: from an Anomaly produced on pt.anomalies to the
  signed webhook received by a local HTTP server, through the same sink.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from perftracker_ml.deploy.tansu import start_broker
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas import MultiCodec
from perftracker_ml.schemas.gc_policy import SERVICE_YOUNG, tune_gc
from perftracker_ml.schemas.settings import (
    AlertSettings,
    KafkaSettings,
    Secret,
    Settings,
    StoreSettings,
    StreamSettings,
)
from perftracker_ml.schemas.topics import TopicNames, all_topics
from perftracker_ml.schemas.vocabulary import (
    ANOMALY,
    FUNCTION_COMPARISON,
    FUNCTION_PATTERN,
    RANK_WINDOW,
)
from perftracker_ml.sinks.rows import flat_rows
from perftracker_ml.sinks.schema import TABLES
from perftracker_ml.sinks.service import SinkService

NAMES = [FUNCTION_PATTERN, RANK_WINDOW, FUNCTION_COMPARISON, ANOMALY]


class _Receiver:
    """Records the arrival time of each webhook by incident id."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.arrived: dict[str, float] = {}
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.arrived[body["incident"]["incident_id"]] = time.perf_counter()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"


def _produce_job(conf: dict, topics: TopicNames, ranks: int, windows: int) -> tuple[int, int]:
    codec = MultiCodec(NAMES)
    where = {FUNCTION_PATTERN: topics.patterns, RANK_WINDOW: topics.findings,
             FUNCTION_COMPARISON: topics.findings, ANOMALY: topics.anomalies}
    p = Producer({**conf, "linger.ms": 20, "batch.size": 1 << 20, "compression.type": "lz4"})
    rows = msgs = 0
    for name, rec in samples.job_records("bench-job", world=ranks, windows=windows, slow_rank=5):
        if name not in where:
            continue
        rows += sum(1 for _ in flat_rows(name, rec))
        msgs += 1
        while True:
            try:
                p.produce(where[name], value=codec.encode(name, rec), key=rec["job"].encode())
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)
    return rows, msgs


def _rows_in_store(service: SinkService, job: str) -> int:
    assert service.store is not None
    return sum(service.store.query(f"SELECT count() FROM {t} WHERE job = {{j:String}}", {"j": job}).rows[0][0]
               for t in TABLES)


def _wait(cond, timeout_s: float, every_s: float = 0.005) -> float:
    deadline = time.perf_counter() + timeout_s
    while not cond():
        if time.perf_counter() > deadline:
            raise TimeoutError("benchmark condition not met")
        time.sleep(every_s)
    return time.perf_counter()


def _alert_latency(conf: dict, topics: TopicNames, rx: _Receiver, samples_n: int) -> list[float]:
    codec = MultiCodec(NAMES)
    p = Producer({**conf, "linger.ms": 0})
    out = []
    for i in range(samples_n):
        rec = samples.anomaly("bench-alerts", incident_id=f"lat-{i}")
        t0 = time.perf_counter()
        p.produce(topics.anomalies, value=codec.encode(ANOMALY, rec), key=b"bench-alerts")
        p.flush(5)
        t1 = _wait(lambda i=i: f"lat-{i}" in rx.arrived, 30)
        out.append((rx.arrived[f"lat-{i}"] - t0) * 1000 if t1 else float("nan"))
        time.sleep(0.05)
    return out


def run(ranks: int, windows: int, alerts: int, raw_ingest: bool = True) -> dict:
    broker = start_broker()
    rx = _Receiver()
    tmp = Path(tempfile.mkdtemp(prefix="pt-bench-"))
    settings = Settings(
        data_dir=tmp, kafka=KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix="bench", partitions=8),
        streams=StreamSettings(app_id="bench"),
        store=StoreSettings(raw_ingest=raw_ingest),  # defaults: flush at 50k rows or 1 s
        alerts=AlertSettings(webhook_url=rx.url, webhook_secret=Secret("bench")))
    topics = TopicNames.for_prefix("bench")
    conf = {"bootstrap.servers": broker.bootstrap}
    tune_gc(SERVICE_YOUNG)  # as run_sink does in the sink process
    service = SinkService(settings)
    try:
        from perftracker_ml.schemas.kafka_admin import ensure_topics

        ensure_topics(conf, all_topics("bench", 8))
        expected, n_msgs = _produce_job(conf, topics, ranks, windows)
        thread = threading.Thread(target=service.run, daemon=True)
        thread.start()
        t0 = _wait(lambda: service.stats.consumed > 0, 60, 0.001)
        c0 = time.process_time()
        t1 = _wait(lambda: service.stats.consumed >= n_msgs and service.idle(), 300)
        cpu_s = time.process_time() - c0
        consumed = service.stats.consumed
        stored = _rows_in_store(service, "bench-job")
        latencies = _alert_latency(conf, topics, rx, alerts)
    finally:
        service.stop()
        thread.join(30) if "thread" in locals() else None
        broker.stop()
        rx.httpd.shutdown()
    secs = t1 - t0
    return {
        "rows_per_s_chdb": round(stored / secs),
        "alert_latency_ms_p50": round(statistics.median(latencies), 1),
        "alert_latency_ms_p90": round(sorted(latencies)[int(0.9 * (len(latencies) - 1))], 1),
        "rows": stored, "rows_expected": expected, "messages": consumed, "messages_per_s": round(consumed / secs),
        "seconds": round(secs, 2), "sink_cpu_s": round(cpu_s, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(), "ranks": ranks, "windows": windows,
        "alert_samples": len(latencies), "raw_ingest": raw_ingest,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--alerts", type=int, default=21)
    ap.add_argument("--python-decode", action="store_true",
                    help="decode every record in Python (store.raw_ingest = false), for comparison")
    args = ap.parse_args(argv)
    result = run(args.ranks, args.windows, args.alerts, raw_ingest=not args.python_decode)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:24} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
