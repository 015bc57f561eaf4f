"""`perftracker launch --relay -- torchrun --nproc-per-node 2`: the ranks' batches reach Kafka
through the host's relay, several ranks to a message, every batch once and in order."""

from __future__ import annotations

import socket
import time

import pytest
from perftracker_ml.schemas import Codec, bundle
from perftracker_ml.schemas.kafka_admin import ensure_topics
from perftracker_ml.schemas.topics import TopicNames, all_topics
from perftracker_ml.schemas.vocabulary import EVENT_BATCH

from .helpers import launch, torchrun

pytestmark = pytest.mark.e2e


def messages(bootstrap: str, topic: str, quiet_s: float = 3.0, limit_s: float = 60.0) -> list[tuple[bytes, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"relay-e2e-{time.time_ns()}",
                  "enable.auto.commit": False})
    out: list[tuple[bytes, bytes]] = []
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        c.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        deadline, last = time.monotonic() + limit_s, time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - last < quiet_s:
            got = [(m.key(), m.value()) for m in c.consume(50, timeout=0.5) if not m.error()]
            if got:
                out += got
                last = time.monotonic()
    finally:
        c.close()
    return out


def test_a_launch_with_a_relay_sends_its_ranks_together_and_loses_nothing(kafka_broker, tmp_path):
    prefix = "relay" + tmp_path.name[-6:].replace("_", "")
    conf = {"bootstrap.servers": kafka_broker.bootstrap}
    ensure_topics(conf, all_topics(prefix))
    job = f"job-{prefix}"
    env = {"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap, "PERFTRACKER_KAFKA_TOPIC_PREFIX": prefix,
           "TRAIN_STEPS": "150", "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0",
           "PERFTRACKER_COLLECTOR_EXIT_FLUSH_S": "8"}
    code, _ = launch(torchrun("train_ddp.py", nproc=2), job, env, relay=True)
    assert code == 0
    got = messages(kafka_broker.bootstrap, TopicNames.for_prefix(prefix).events)
    codec = Codec(EVENT_BATCH)
    relay_key = f"{job}|relay:{socket.gethostname()}".encode()
    batches, relayed, together = [], 0, 0
    for key, value in got:
        records = [codec.decode(item) for item in bundle.records_in(value)]
        records = [r for r in records if r["job"] == job]
        if not records:
            continue
        batches += records
        relayed += key == relay_key
        together += len({r["rank"] for r in records}) > 1
    by_rank: dict[int, list[int]] = {}
    for r in batches:
        by_rank.setdefault(r["rank"], []).append(r["seq"])
    assert sorted(by_rank) == [0, 1]
    for seqs in by_rank.values():
        assert sorted(seqs) == list(range(len(seqs))), "a batch lost or sent twice"
    assert all(r["dropped_events"] == 0 for r in batches)
    assert relayed and together, "no message carried both ranks' batches"
    assert relayed < len(batches)  # fewer messages than batches
