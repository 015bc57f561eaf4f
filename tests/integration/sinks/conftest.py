"""Fixtures for the sink service: settings on a temp chDB and random topics, a running sink."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from perftracker_ml.schemas import MultiCodec, bundle
from perftracker_ml.schemas.record_sets import in_sets
from perftracker_ml.schemas.settings import KafkaSettings, Settings, StoreSettings, StreamSettings
from perftracker_ml.schemas.topics import TopicNames
from perftracker_ml.sinks.service import SinkService

from ..waiting import wait_for  # noqa: F401 - re-exported for the sink tests

pytestmark = pytest.mark.integration

CODEC_NAMES = ["FunctionPattern", "RankWindow", "FunctionComparison", "Anomaly"]


@pytest.fixture
def sink_settings(tmp_path: Path, kafka_conf: dict[str, str], unique: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        kafka=KafkaSettings(bootstrap_servers=kafka_conf["bootstrap.servers"], topic_prefix=f"t{unique}",
                            partitions=2),
        streams=StreamSettings(app_id=f"g{unique}"),
        store=StoreSettings(flush_interval_s=0.2, flush_rows=10_000),
    )




class RunningSink:
    def __init__(self, service: SinkService, ready: Path):
        self.service = service
        self.ready = ready
        self.thread = threading.Thread(target=service.run, args=(ready,), daemon=True)

    def start(self) -> RunningSink:
        self.thread.start()
        wait_for(self.ready.exists, 30)
        return self

    def stop(self) -> None:
        self.service.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.fixture
def start_sink(tmp_path: Path) -> Iterator[Callable[..., RunningSink]]:
    started: list[RunningSink] = []

    def start(settings: Settings, service: SinkService | None = None) -> RunningSink:
        s = RunningSink(service or SinkService(settings), tmp_path / f"ready-{len(started)}.json")
        started.append(s)
        return s.start()

    yield start
    for s in started:
        if s.thread.is_alive():
            s.stop()


@pytest.fixture
def produce(kafka_conf: dict[str, str]) -> Callable[..., None]:
    """produce(settings, [(record name, record), ...], raw=[bytes...]); ``bundled``: the patterns
    and findings of one topic and key in RecordBundles, as the stream workers send them."""
    def send(settings: Settings, records: list[tuple[str, dict]], raw: list[bytes] = (),
             bundled: bool = False, sets: bool = False) -> None:
        """``sets``: the RankWindows and FunctionPatterns of one key and window in sets, as the workers send them."""
        topics = TopicNames.for_prefix(settings.kafka.topic_prefix)
        codec = MultiCodec([*CODEC_NAMES, "RankWindowSet", "FunctionPatternSet"])
        where = {"FunctionPattern": topics.patterns, "RankWindow": topics.findings,
                 "FunctionComparison": topics.findings, "Anomaly": topics.anomalies, "RankWindowSet": topics.findings,
                 "FunctionPatternSet": topics.patterns}
        records = in_sets(records, 2) if sets else records
        p = Producer({**kafka_conf, "linger.ms": 5})
        groups: dict[tuple[str, bytes], list[bytes]] = {}
        for name, rec in records:
            if name in where:
                value, topic = codec.encode(name, rec), where[name]
                if bundled and topic != topics.anomalies:
                    groups.setdefault((topic, rec["job"].encode()), []).append(value)
                else:
                    p.produce(topic, value=value, key=rec["job"].encode())
        for (topic, key), items in groups.items():
            for value in bundle.bundled(items, max_records=7):
                p.produce(topic, value=value, key=key)
        for data in raw:
            p.produce(topics.findings, value=data, key=b"garbage")
        p.flush(10)
    return send
