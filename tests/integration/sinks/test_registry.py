"""A schema registry configured: registry-framed records through tansu reach the store.

The registry is the narrow fake of :mod:`tests.registry_fake` (a real HTTP server on
127.0.0.1: no Confluent Schema Registry can be installed here); the broker is tansu,
the store chDB, the sink the real service.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from confluent_kafka import Producer
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas.registry import multi_codec_for, registry_client
from perftracker_ml.schemas.settings import Secret
from perftracker_ml.schemas.stackfile import StackState
from perftracker_ml.schemas.topics import TopicNames
from perftracker_ml.sinks import client

from ...registry_fake import PASSWORD, USER, FakeRegistry
from .conftest import CODEC_NAMES, wait_for

pytestmark = pytest.mark.integration


def test_registry_framed_records_reach_the_store(sink_settings, start_sink, kafka_conf, unique, registry):
    settings = replace(sink_settings, kafka=replace(
        sink_settings.kafka, schema_registry_url=registry, schema_registry_username=USER,
        schema_registry_password=Secret(PASSWORD)))
    topics = TopicNames.for_prefix(settings.kafka.topic_prefix)
    where = {"FunctionPattern": topics.patterns, "RankWindow": topics.findings,
             "FunctionComparison": topics.findings, "Anomaly": topics.anomalies}
    job = f"job-{unique}"
    sink = start_sink(settings)
    reg = registry_client(settings)
    codecs = {topic: multi_codec_for(settings, CODEC_NAMES, topic, reg) for topic in set(where.values())}
    producer = Producer({**kafka_conf, "linger.ms": 5})
    for name, rec in samples.job_records(job, world=4, windows=2):
        if name in where:
            data = codecs[where[name]].encode(name, rec)
            assert data[:1] == b"\x00"  # Confluent framing: magic 0 + schema id
            producer.produce(where[name], value=data, key=rec["job"].encode())
    producer.flush(10)
    ready = json.loads(sink.ready.read_text())
    StackState(bootstrap="", broker_pid=0, sink_pid=__import__("os").getpid(),
               query_url=ready["query_url"]).save(settings.data_dir)
    found = wait_for(lambda: client.diagnose(settings, job), 30)
    assert found[0]["ranks"] == [3] and found[0]["cause"] == "slow_dataloader"
    steps = wait_for(lambda: client.query(settings, "step_times", job=job), 10)
    assert {r["rank"] for r in steps} == {0, 1, 2, 3}
    assert sink.service.stats.snapshot()["dead_lettered"] == 0
    assert any(s.startswith(f"{topics.findings}-") for s in FakeRegistry.subjects)
    assert any(call.startswith("GET /schemas/ids/") for call in FakeRegistry.calls)  # the sink looked them up
