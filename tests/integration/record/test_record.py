"""`perftracker record` against the real tansu broker: a past job from what the topics retain,
a running job followed until it goes silent; only the job's messages, bytes untouched."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from perftracker_ml.deploy.record import RecordError, RecordOptions, record_job
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.kafka_admin import ensure_topics
from perftracker_ml.schemas.recording import Recording
from perftracker_ml.schemas.settings_loader import load_settings
from perftracker_ml.schemas.topics import TopicNames, all_topics
from perftracker_ml.schemas.vocabulary import EVENT_BATCH
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.replay import replay

pytestmark = pytest.mark.integration


def encoded(job: str, slow_rank: int) -> list[tuple[bytes, bytes]]:
    codec = Codec(EVENT_BATCH)
    cfg = SyntheticJob(job, ranks=4, seconds=12, slow_rank=slow_rank, slowdown=1.6, seed=1, final=True)
    return [(f"{job}|{rank}".encode(), codec.encode(rec)) for rank, rec in batches(cfg)]


def produce(bootstrap: str, topic: str, items: list[tuple[bytes, bytes]], pause_s: float = 0.0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value in items:
        p.produce(topic, value, key)
        p.poll(0)
        if pause_s:
            time.sleep(pause_s)
    assert p.flush(30) == 0


def settings_for(tmp_path: Path, bootstrap: str, prefix: str):
    return load_settings(env={"PERFTRACKER_DATA_DIR": str(tmp_path), "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                              "PERFTRACKER_KAFKA_TOPIC_PREFIX": prefix})


def test_a_past_job_is_recorded_from_what_the_topics_retain(kafka_broker, unique, tmp_path: Path):
    prefix = f"rec{unique}"
    ensure_topics({"bootstrap.servers": kafka_broker.bootstrap}, all_topics(prefix))
    topics = TopicNames.for_prefix(prefix)
    mine, other = encoded(f"a-{unique}", 2), encoded(f"b-{unique}", 1)
    produce(kafka_broker.bootstrap, topics.events, [x for pair in zip(mine, other, strict=True) for x in pair])
    settings = settings_for(tmp_path, kafka_broker.bootstrap, prefix)
    out = tmp_path / "a.ptrec"
    n = record_job(settings, out, RecordOptions(job=f"a-{unique}", quiet_s=2.0))
    rec = Recording(out)
    kept = list(rec.messages())
    assert n == len(mine) == len(kept)
    assert Counter((m.key, m.value) for m in kept) == Counter(mine)  # every one, bytes untouched, no other job's
    assert rec.header.job == f"a-{unique}" and rec.header.source == "retained" and rec.header.topic_prefix == prefix
    assert {m.topic for m in kept} == {topics.events} and all(m.timestamp_ms > 0 for m in kept)
    # the recording replays: the slow rank is named from the kept messages alone
    found = replay(kept, DetectionPolicy(window_s=2.0, window_grace_s=1.0)).anomalies
    assert found and all(a["ranks"] == [2] for a in found), found


def test_a_running_job_is_followed_until_it_goes_silent(kafka_broker, unique, tmp_path: Path):
    prefix = f"fol{unique}"
    ensure_topics({"bootstrap.servers": kafka_broker.bootstrap}, all_topics(prefix))
    topics = TopicNames.for_prefix(prefix)
    items = encoded(f"f-{unique}", 3)
    sender = threading.Thread(target=produce, args=(kafka_broker.bootstrap, topics.events, items, 0.05))
    settings = settings_for(tmp_path, kafka_broker.bootstrap, prefix)
    out = tmp_path / "f.ptrec"
    sender.start()  # still sending while the recorder starts: it reads on until the job is silent
    try:
        n = record_job(settings, out, RecordOptions(job=f"f-{unique}", follow=True, idle_s=4.0, wait_s=60.0))
    finally:
        sender.join()
    assert n == len(items)
    assert Recording(out).header.source == "live"


def test_an_unknown_job_is_an_error_naming_it(kafka_broker, unique, tmp_path: Path):
    prefix = f"unk{unique}"
    ensure_topics({"bootstrap.servers": kafka_broker.bootstrap}, all_topics(prefix))
    with pytest.raises(RecordError, match=f"no message of job 'nobody-{unique}'"):
        record_job(settings_for(tmp_path, kafka_broker.bootstrap, prefix), tmp_path / "x.ptrec",
                   RecordOptions(job=f"nobody-{unique}", quiet_s=1.0))
    assert not (tmp_path / "x.ptrec").exists()
