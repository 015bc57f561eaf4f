"""The collector's own account of its bytes on the wire, against the real tansu broker."""

import time

from perftracker_ml.collectors.batch import BatchBuilder
from perftracker_ml.collectors.counters import CollectorCounters
from perftracker_ml.collectors.identity import RankIdentity
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.collectors.transport import STATS_INTERVAL_MS, KafkaSink, Sender
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.kafka_admin import ensure_topics
from perftracker_ml.schemas.settings import CollectorSettings
from perftracker_ml.schemas.topics import Topic
from perftracker_ml.schemas.vocabulary import EVENT_BATCH, SpanKind

IDENT = RankIdentity("wire", 0, 0, 1, "h", -1, "", 1)


def test_wire_bytes_come_from_librdkafka_and_are_smaller_than_the_encoded_batches(kafka_broker):
    topic = "wire-bytes-events"
    ensure_topics({"bootstrap.servers": kafka_broker.bootstrap}, [Topic(topic, 1, "job|rank", "test")])
    errors = ErrorBudget()
    rec = Recorder(100_000, IterationDetector(), errors)
    counters = CollectorCounters()
    sink = KafkaSink({"bootstrap.servers": kafka_broker.bootstrap}, topic, counters,
                     lambda n: None, errors)
    sender = Sender(rec, BatchBuilder(IDENT), Codec(EVENT_BATCH).encode, sink, CollectorSettings(),
                    IDENT.key)
    for _ in range(3):  # a training loop's repetitive spans, as the collectors record them
        for i in range(2000):
            rec.span(SpanKind.FORWARD, "model.forward", 10_000_000 * i, 1_500_000 + i % 7)
        sender.flush_once()
    assert sink.flush(10.0) == 0
    deadline = time.monotonic() + 5 * STATS_INTERVAL_MS / 1000
    while counters.wire_base_bytes < counters.sent_bytes and time.monotonic() < deadline:
        sink.poll()
        time.sleep(0.05)
    assert counters.events_sent == 6000 and errors.count == 0
    assert counters.wire_base_bytes == counters.sent_bytes  # statistics after the last delivery
    assert 0 < counters.wire_bytes < counters.sent_bytes  # lz4 on the wire
    assert 0 < sender.wire_ratio() < 1 and sender.wire_bytes_per_s() > 0
