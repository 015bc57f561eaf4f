"""The per-host relay end to end: `perftracker relay` as a process, ranks' real senders, the real
tansu broker; one message per host and flush, and Kafka directly once the relay is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from perftracker_ml.collectors.batch import BatchBuilder
from perftracker_ml.collectors.counters import CollectorCounters
from perftracker_ml.collectors.identity import RankIdentity
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.relay import RelaySink
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.collectors.transport import KafkaSink, Sender
from perftracker_ml.deploy.tansu import free_port
from perftracker_ml.schemas import Codec, bundle
from perftracker_ml.schemas.kafka_admin import ensure_topics
from perftracker_ml.schemas.settings import CollectorSettings
from perftracker_ml.schemas.topics import Topic
from perftracker_ml.schemas.vocabulary import EVENT_BATCH, SpanKind

TOPIC = "relay-test-events"
JOB = "relay-job"


def rank_sender(rank: int, path: str, conf: dict[str, str]) -> tuple[Sender, Recorder, CollectorCounters]:
    ident = RankIdentity(JOB, rank, rank, 4, "node-a", -1, "", 1000 + rank)
    errors = ErrorBudget()
    counters = CollectorCounters()
    rec = Recorder(100_000, IterationDetector(), errors, counters)
    sink = RelaySink(path, TOPIC, counters, lambda: KafkaSink(conf, TOPIC, counters, rec.lost, errors), errors)
    return Sender(rec, BatchBuilder(ident), Codec(EVENT_BATCH).encode, sink, CollectorSettings(), ident.key), rec, counters


def read_all(conf: dict[str, str], want: int, timeout_s: float = 60.0) -> list[tuple[bytes, bytes]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({**conf, "group.id": f"relay-test-{time.time_ns()}", "enable.auto.commit": False})
    c.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(4)])
    out: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < want and time.monotonic() < deadline:
            out += [(m.key(), m.value()) for m in c.consume(10, timeout=0.5) if not m.error()]
    finally:
        c.close()
    return out


def test_a_hosts_ranks_go_out_as_one_message_and_straight_to_kafka_once_the_relay_is_gone(kafka_broker, tmp_path):
    conf = {"bootstrap.servers": kafka_broker.bootstrap}
    ensure_topics(conf, [Topic(TOPIC, 4, "job|rank", "test")])
    path = str(tmp_path / "relay.sock")
    port = free_port()
    env = {**os.environ, "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap}
    # a linger of 2 s: the four senders' flushes below fall in one group even on a loaded machine
    relay = subprocess.Popen([sys.executable, "-m", "perftracker_ml.deploy.cli", "relay", "--socket", path,
                              "--host", "node-a", "--linger-s", "2", "--metrics-port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and relay.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(path), relay.stderr.read() if relay.poll() is not None else "no socket"
        ranks = [rank_sender(r, path, conf) for r in range(4)]
        for r, (sender, rec, _) in enumerate(ranks):
            for i in range(10 * (r + 1)):
                rec.span(SpanKind.FORWARD, "model.forward", 10_000_000 * i, 1_000_000 + r)
            sender.flush_once()
        ((key, value),) = read_all(conf, 1)
        assert key == f"{JOB}|relay:node-a".encode() and bundle.is_bundle(value)
        batches = [Codec(EVENT_BATCH).decode(item) for item in bundle.records_in(value)]
        assert [(b["rank"], b["job"]) for b in batches] == [(r, JOB) for r in range(4)]
        for (_, _, counters), b in zip(ranks, batches, strict=True):
            assert counters.batches_relayed == 1 and counters.relay_fallbacks == 0
            assert counters.events_sent == 10 * (b["rank"] + 1)
        want, metrics, deadline = 'perftracker_relay_frames_out_total{host="node-a"} 4.0', "", time.monotonic() + 30
        while want not in metrics and time.monotonic() < deadline:  # counted at the delivery report
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                metrics = answer.read().decode()
            time.sleep(0.1)
        assert want in metrics, metrics
    finally:
        relay.send_signal(signal.SIGTERM)
        _, err = relay.communicate(timeout=60)
    assert relay.returncode == 0, err
    stats = json.loads(err.strip().splitlines()[-1].split("perftracker relay: ", 1)[1])
    assert stats["frames_in"] == 4 and stats["frames_out"] == 4 and stats["messages_out"] == 1
    assert not os.path.exists(path)

    sender, rec, counters = ranks[0]
    rec.span(SpanKind.FORWARD, "model.forward", 0, 5)
    sender.flush_once()
    assert sender.sink.flush(30.0) == 0
    later = read_all(conf, 2)  # the relay's message and this one, in no set order (other partitions)
    direct = [value for key, value in later if key == f"{JOB}|0".encode()]
    assert len(later) == 2 and len(direct) == 1 and not bundle.is_bundle(direct[0]), later
    assert Codec(EVENT_BATCH).decode(direct[0])["rank"] == 0
    assert counters.relay_fallbacks == 1 and counters.batches_relayed == 1 and counters.batches_sent == 2
