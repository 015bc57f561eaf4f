"""A flood of hostile messages mixed with a real job's traffic, through the embedded stack
(tansu broker, a Faust worker process, the sink on chDB).

>= 10,000 distinct hostile messages (tests/hostile.py: random bytes, truncated Avro, unknown
fingerprints, records of the wrong type, huge arrays, absurd ranks and durations, NaN, 100 KB
strings, unknown jobs; some as worker outputs for the later stages and the sink) are sent
interleaved with the first 20 s of a job whose rank 5 is slow and with a job whose function
names hold quotes, markup and control characters; the slow job goes on after the flood. The
worker never dies, every hostile message is dead-lettered by each stage that reads it, with a
reason, nothing else is, every good batch is processed and the slow job's incident reaches
the store.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer
from perftracker_ml.deploy.stack import worker_stats
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.vocabulary import EVENT_BATCH

from ...hostile import Hostile, hostile_messages, odd_but_valid_batches
from ..waiting import wait_for
from .conftest import Stack

pytestmark = pytest.mark.integration

HOSTILE = 10_200
PARTITIONS = 8  # of every keyed topic (kafka.partitions)
ODD = 40
# which stages read each topic, so dead-letter each hostile message sent there
READERS = {"events": {"worker"}, "hardware": {"worker"}, "patterns": {"worker", "sink"},
           "findings": {"worker", "sink"}, "anomalies": {"sink"}}


def job_batches(job: str, seconds: float, first_seq: int = 0, ago_s: float = 0) -> list[tuple[str, bytes]]:
    """(key, EventBatch) of 8 ranks, rank 5's forward 40% slower: ``seconds`` of steps ending
    ``ago_s`` before now, batch numbers from ``first_seq``."""
    codec = Codec(EVENT_BATCH)
    cfg = SyntheticJob(job, ranks=8, seconds=seconds, slow_rank=5, slow_function="forward", slowdown=1.4, seed=1)
    return [(f"{job}|{rank}", codec.encode({**rec, "seq": rec["seq"] + first_seq,
                                            "wall_ns": rec["wall_ns"] - int(ago_s * 1e9)}))
            for rank, rec in batches(cfg)]


def send(bootstrap: str, hostile: list[Hostile], good: list[tuple[str, bytes]]) -> dict[bytes, str]:
    """Produce the flood with the good batches spread evenly through it; returns hostile value -> topic."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4",
                         "batch.num.messages": 10_000, "queue.buffering.max.messages": 200_000})
    good = list(good)
    every = max(1, len(hostile) // max(len(good), 1))
    sent: dict[bytes, str] = {}
    for i, m in enumerate(hostile):
        # spread evenly over the partitions: every rank of the good jobs waits behind as many
        producer.produce(f"pt.{m.topic}", key=f"junk|{i}".encode(), value=m.value, partition=i % PARTITIONS)
        sent[m.value] = m.topic
        if i % every == 0 and good:
            key, value = good.pop(0)
            producer.produce("pt.events", key=key.encode(), value=value)
        producer.poll(0)
    for key, value in good:
        producer.produce("pt.events", key=key.encode(), value=value)
    assert producer.flush(30) == 0
    return sent


def dead_letters(bootstrap: str, expected: int, timeout_s: float) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                         "fetch.wait.max.ms": 200})
    consumer.subscribe(["pt.deadletter"])
    found, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(found) < expected:
        found += [m for m in consumer.consume(num_messages=5000, timeout=0.5) if not m.error()]
    consumer.close()
    return found


def test_hostile_flood_is_dead_lettered_and_the_real_job_still_diagnosed(stack: Stack):
    state = stack.state()
    bootstrap, worker_pid, port = state["bootstrap"], state["worker_pids"][0], state["worker_ports"][0]
    job = f"flood-{uuid.uuid4().hex[:6]}"
    odd_job = f"odd-{uuid.uuid4().hex[:6]}"
    during = job_batches(job, seconds=20, ago_s=30)  # its later steps are sent after the flood
    odd = [(f"{odd_job}|{i % 4}", value) for i, value in enumerate(odd_but_valid_batches(odd_job, ODD))]
    good_values = {value for _, value in during + odd}
    hostile = list(hostile_messages(HOSTILE))
    inputs = sum(1 for m in hostile if m.topic in ("events", "hardware"))

    started = time.monotonic()
    sent = send(bootstrap, hostile, during + odd)
    produced_s = time.monotonic() - started
    # the job's first 20 s ride in the flood; it goes on once the flood is through. Its later
    # steps start now: while the flood was worked through, each rank's batches came further
    # apart than the grace, so the worker closed its windows on its own clock up to about now
    # and older data would be late (see docs/detection.md)
    wait_for(lambda: (worker_stats(port) or {}).get("counters", {}).get("dead_lettered.inputs") == inputs, 120,
             every_s=0.5, describe=lambda: worker_stats(port))
    drained_s = time.monotonic() - started
    after = job_batches(job, seconds=30, first_seq=1000, ago_s=-28)
    good_values |= {value for _, value in after}
    send(bootstrap, [], after)
    rows = wait_for(lambda: [r for r in stack.diagnose(job) if r["ranks"] == [5]], 45, every_s=1.0,
                    describe=lambda: (stack.diagnose(job), worker_stats(port)))
    assert "forward" in rows[0]["function"]
    diagnosed_s = time.monotonic() - started

    expected = sum(len(READERS[topic]) for topic in sent.values())
    found = dead_letters(bootstrap, expected, 45)
    stages: dict[bytes, Counter] = {}
    for m in found:
        headers = dict(m.headers() or [])
        assert headers.get("reason"), headers
        stage = "sink" if headers.get("stage") == b"sink" else "worker"
        stages.setdefault(m.value(), Counter())[stage] += 1
    assert not good_values & set(stages), "a good batch was dead-lettered"
    missing = {v[:16]: t for v, t in sent.items() if set(stages.get(v, ())) != READERS[t]}
    assert not missing, f"{len(missing)} hostile messages not dead-lettered by every reader, e.g. " \
                        f"{list(missing.items())[:3]}"
    assert all(n == 1 for c in stages.values() for n in c.values()), "a message dead-lettered twice"

    assert stack.state()["worker_pids"] == [worker_pid]
    os.kill(worker_pid, 0)  # the same worker, still alive
    counters = (worker_stats(port) or {}).get("counters", {})
    assert counters.get("dead_lettered.inputs") == inputs
    assert counters.get("records_in.EventBatch") == len(good_values)  # every good batch processed, odd names too
    assert not [k for k in counters if k.startswith("errors.")], counters
    print(f"flood: {len(sent)} hostile ({dict(Counter(sent.values()))} by topic) + {len(good_values)} good "
          f"messages, produced in {produced_s:.1f}s, inputs drained after {drained_s:.1f}s, slow rank "
          f"diagnosed after {diagnosed_s:.1f}s; {len(found)} dead letters; worker counters {counters}")
