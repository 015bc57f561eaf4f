"""The schema registry wired into collectors, workers and sink (no broker: codecs and handlers).

Producers encode with Confluent framing when ``kafka.schema_registry_url`` is set;
consumers read both framings, a schema id naming the record. Against the fake
registry of :mod:`tests.registry_fake` (a real HTTP server).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from perftracker_ml.collectors.batch import BatchBuilder
from perftracker_ml.collectors.counters import CollectorCounters
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.collectors.transport import NullSink, Sender
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec, MultiCodec, SchemaError
from perftracker_ml.schemas.registry import (
    RegistryCodec,
    RegistryMultiCodec,
    RegistryUnavailable,
    multi_codec_for,
    registry_client,
)
from perftracker_ml.schemas.settings import CollectorSettings, KafkaSettings, Secret, Settings
from perftracker_ml.schemas.topics import TopicNames
from perftracker_ml.schemas.vocabulary import (
    ANOMALY,
    EVENT_BATCH,
    FUNCTION_COMPARISON,
    FUNCTION_PATTERN,
    RANK_WINDOW,
)
from perftracker_ml.sinks.decode import RecordDecoder
from perftracker_ml.streams.detect import DetectionPolicy

from ...registry_fake import PASSWORD, USER, FakeRegistry
from ..collectors.test_batch_and_drops import IDENT

NAMES = TopicNames.for_prefix("pt")


def settings(url: str) -> Settings:
    return Settings(kafka=KafkaSettings(schema_registry_url=url, schema_registry_username=USER,
                                        schema_registry_password=Secret(PASSWORD)))


def findings_records() -> list[tuple[str, dict]]:
    return [(n, r) for n, r in samples.job_records("job-reg", world=2, windows=1)
            if n in (RANK_WINDOW, FUNCTION_COMPARISON)]


def test_a_multi_record_topic_has_one_subject_per_record_type(registry):
    codec = multi_codec_for(settings(registry), [RANK_WINDOW, FUNCTION_COMPARISON], NAMES.findings)
    assert isinstance(codec, RegistryMultiCodec)
    records = findings_records()
    framed = [(name, codec.encode(name, rec)) for name, rec in records]
    assert {name for name, _ in records} == {RANK_WINDOW, FUNCTION_COMPARISON}
    assert set(FakeRegistry.subjects) == {"pt.findings-RankWindow", "pt.findings-FunctionComparison"}
    reader = multi_codec_for(settings(registry), [RANK_WINDOW, FUNCTION_COMPARISON], NAMES.findings)
    for (name, data), (_, rec) in zip(framed, records, strict=True):
        assert data[:1] == b"\x00"
        got_name, got = reader.decode(data)
        assert got_name == name and got["job"] == rec["job"] and got["window_id"] == rec["window_id"]
        assert reader.decode(MultiCodec([name]).encode(name, rec))[0] == name  # single-object too


def test_a_schema_id_of_a_record_the_consumer_does_not_take_is_a_schema_error(registry):
    anomaly = RegistryCodec(ANOMALY, NAMES.anomalies, registry_client(settings(registry)))
    data = anomaly.encode(samples.anomaly("job-reg"))
    reader = multi_codec_for(settings(registry), [RANK_WINDOW, FUNCTION_COMPARISON], NAMES.findings)
    with pytest.raises(SchemaError, match="holds a Anomaly record"):
        reader.decode(data)


def test_without_registry_the_plain_multi_codec():
    assert type(multi_codec_for(Settings(), [RANK_WINDOW], NAMES.findings)) is MultiCodec
    assert registry_client(Settings()) is None


def test_sink_decoder_reads_registry_framing_on_its_fast_path(registry):
    client = registry_client(settings(registry))
    [(_, pattern)] = [(n, r) for n, r in samples.job_records("job-reg", world=1, windows=1)
                      if n == FUNCTION_PATTERN][:1]
    framed = RegistryCodec(FUNCTION_PATTERN, NAMES.patterns, client).encode(pattern)
    decoder = RecordDecoder([FUNCTION_PATTERN, RANK_WINDOW, ANOMALY], registry_client(settings(registry)))
    name, record = decoder.decode(framed)
    plain_name, plain = decoder.decode(Codec(FUNCTION_PATTERN).encode(pattern))
    assert name == plain_name == FUNCTION_PATTERN and record == plain  # epoch-ms ints both ways
    assert isinstance(record["window_start_ms"], int)
    FakeRegistry.calls.clear()
    decoder.decode(framed)
    assert FakeRegistry.calls == []  # the id is looked up once
    with pytest.raises(SchemaError, match="unknown to the registry"):
        decoder.decode(b"\x00\x00\x00\x00\x63\x02")


def test_worker_codecs_register_at_start_and_read_both_framings(registry):
    from perftracker_ml.streams.app import stream_codecs
    from perftracker_ml.streams.context import StreamContext

    codecs = stream_codecs(settings(registry), NAMES)
    assert set(FakeRegistry.subjects) == {"pt.patterns-FunctionPattern", "pt.patterns-FunctionPatternSet",
                                          "pt.anomalies-value", "pt.control-value",
                                          "pt.findings-RankWindow", "pt.findings-FunctionComparison",
                                          "pt.findings-RankWindowSet"}
    ctx = StreamContext(names=NAMES, policy=DetectionPolicy(), codecs=codecs)
    batch = next(iter(batches(SyntheticJob("job-reg", ranks=2, seconds=2))))[1]
    collector_codec = RegistryCodec(EVENT_BATCH, NAMES.events, registry_client(settings(registry)))
    for data in (collector_codec.encode(batch), Codec(EVENT_BATCH).encode(batch)):
        name, record = asyncio.run(ctx.decode(ctx.codecs["inputs"], "inputs", data))
        assert name == EVENT_BATCH and record["names"] == batch["names"]
    assert ctx.encode(ANOMALY, samples.anomaly("job-reg"))[:1] == b"\x00"
    assert stream_codecs(Settings(), NAMES) == {}  # no registry: the plain codecs


def test_a_worker_does_not_start_without_its_registry():
    from perftracker_ml.streams.app import stream_codecs

    with pytest.raises(RegistryUnavailable, match="unreachable"):
        stream_codecs(settings("http://127.0.0.1:9"), NAMES)


def test_worker_holds_a_message_while_the_registry_is_away(registry):
    from perftracker_ml.streams.context import StreamContext

    data = RegistryCodec(EVENT_BATCH, NAMES.events, registry_client(settings(registry))).encode(
        next(iter(batches(SyntheticJob("job-reg", ranks=1, seconds=1))))[1])
    ctx = StreamContext(names=NAMES, policy=DetectionPolicy(), codecs={"inputs": multi_codec_for(
        settings(registry), [EVENT_BATCH], NAMES.events)})
    FakeRegistry.up = False
    threading.Timer(1.0, lambda: setattr(FakeRegistry, "up", True)).start()
    started = time.monotonic()
    name, _ = asyncio.run(ctx.decode(ctx.codecs["inputs"], "inputs", data))
    assert name == EVENT_BATCH and time.monotonic() - started >= 0.9
    assert ctx.counters.snapshot().get("dead_lettered", 0) == 0


def test_sink_holds_a_message_while_the_registry_is_away_and_leaves_it_at_stop(registry):
    from perftracker_ml.sinks.service import Interrupted, SinkService

    service = SinkService(settings(registry), dispatcher=object())  # type: ignore[arg-type]
    data = RegistryCodec(ANOMALY, NAMES.anomalies, registry_client(settings(registry))).encode(
        samples.anomaly("job-reg"))
    FakeRegistry.up = False
    threading.Timer(0.8, lambda: setattr(FakeRegistry, "up", True)).start()
    service._wait_for_registry(data)  # returns once the registry answers again
    FakeRegistry.up = False
    service.registry = registry_client(settings(registry))  # a fresh cache: the id must be fetched again
    service.stop()
    with pytest.raises(Interrupted):
        service.handle(NAMES.anomalies, 0, 41, data)
    assert service._offsets == {}  # not handled: re-read by the next consumer


def test_collector_codecs_follow_the_registry_setting(registry):
    from perftracker_ml.collectors.collector import Collector
    from perftracker_ml.collectors.config import AttachSettings

    with_registry = Collector(AttachSettings(CollectorSettings(), settings(registry).kafka), IDENT, "")
    assert isinstance(with_registry.codec(EVENT_BATCH, NAMES.events), RegistryCodec)
    plain = Collector(AttachSettings(CollectorSettings(), KafkaSettings()), IDENT, "")
    assert type(plain.codec(EVENT_BATCH, NAMES.events)) is Codec


def test_a_batch_the_registry_could_not_frame_is_counted_lost():
    rec = Recorder(100, IterationDetector(), ErrorBudget())
    codec = RegistryCodec(EVENT_BATCH, NAMES.events, registry_client(settings("http://127.0.0.1:9")))
    sender = Sender(rec, BatchBuilder(IDENT), codec.encode, NullSink(CollectorCounters(), rec.lost),
                    CollectorSettings(), b"k")
    rec.span(1, "x", 0, 1)
    sender.flush_once()
    assert rec.dropped == 1 and rec.errors.count == 1
