"""Confluent Schema Registry framing against a real local HTTP server.

The registry is an external service that cannot be installed here, so these tests run
the narrow fake of :mod:`tests.registry_fake` (a real HTTP server on 127.0.0.1).
Everything on our side (urllib, framing, caching, schema resolution, errors) runs for real.
"""

from __future__ import annotations

import json

import pytest
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec, SchemaError, bundled_schemas
from perftracker_ml.schemas.columns import as_lists
from perftracker_ml.schemas.registry import (
    RegistryClient,
    RegistryCodec,
    RegistryError,
    RegistryUnavailable,
    codec_for,
)
from perftracker_ml.schemas.settings import KafkaSettings, Secret, Settings
from perftracker_ml.schemas.vocabulary import EVENT_BATCH

from ...registry_fake import PASSWORD, USER, FakeRegistry


@pytest.fixture(autouse=True, params=["collector", "server"])
def side(request, monkeypatch):
    """Every test on both clients: the collectors' standard-library one and the server side's
    confluent_kafka.schema_registry one (``registry_client(..., server=True)``)."""
    if request.param == "server":
        import functools

        import perftracker_ml.schemas.registry as registry_module
        monkeypatch.setattr(registry_module, "registry_client",
                            functools.partial(registry_module.registry_client, server=True))
    return request.param


def settings(url: str, password: str = PASSWORD) -> Settings:
    return Settings(kafka=KafkaSettings(schema_registry_url=url, schema_registry_username=USER,
                                        schema_registry_password=Secret(password)))


def event_batch() -> dict:
    return next(iter(batches(SyntheticJob("job-r", ranks=2, seconds=2))))[1]


def test_encode_uses_confluent_wire_format_with_registered_id(registry):
    codec = codec_for(settings(registry), EVENT_BATCH, "pt.events")
    assert isinstance(codec, RegistryCodec)
    data = codec.encode(event_batch())
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == 1
    assert FakeRegistry.subjects == {"pt.events-value": [1]}
    assert json.loads(FakeRegistry.schemas[1]) == bundled_schemas().latest(EVENT_BATCH).raw


def test_round_trip_and_cache_hit_the_registry_once(registry):
    record = event_batch()
    producer = codec_for(settings(registry), EVENT_BATCH, "pt.events")
    for _ in range(3):
        data = producer.encode(record)
    consumer = codec_for(settings(registry), EVENT_BATCH, "pt.events")  # fresh cache
    for _ in range(3):
        decoded = consumer.decode(data)
    decoded = as_lists(decoded)
    assert decoded["spans"] == record["spans"] and decoded["comms"] == record["comms"]
    assert FakeRegistry.calls == ["POST /subjects/pt.events-value/versions", "GET /schemas/ids/1"]


def test_decode_accepts_single_object_framing_too(registry):
    record = event_batch()
    codec = codec_for(settings(registry), EVENT_BATCH, "pt.events")
    decoded = codec.decode(Codec(EVENT_BATCH).encode(record))
    assert decoded["names"] == record["names"]
    assert FakeRegistry.calls == []  # no registry round trip for single-object messages


def test_old_writer_in_registry_is_resolved_to_new_reader(registry):
    old_schemas = bundled_schemas().restricted(EVENT_BATCH, 1)
    client = RegistryClient(registry, USER, Secret(PASSWORD))
    old = RegistryCodec(EVENT_BATCH, "pt.events", client, old_schemas)
    data = old.encode(event_batch())
    new = codec_for(settings(registry), EVENT_BATCH, "pt.events")
    decoded = new.decode(data)
    assert decoded["kernels"] == [] and decoded["schema_version"] == 1


def test_without_registry_url_the_plain_codec_is_used():
    codec = codec_for(Settings(), EVENT_BATCH, "pt.events")
    assert type(codec) is Codec
    assert codec.encode(event_batch())[:2] == b"\xc3\x01"


@pytest.mark.parametrize("data, fragment", [
    (b"", "neither Confluent"),
    (b"\x07garbage", "neither Confluent"),
    (b"\x00\x00\x00\x00\x63" + b"\x02", "schema id 99 unknown to the registry"),
])
def test_bad_bytes_are_schema_errors(registry, data, fragment):
    with pytest.raises(SchemaError, match=fragment):
        codec_for(settings(registry), EVENT_BATCH, "pt.events").decode(data)


def test_schema_id_of_another_record_type_is_refused(registry):
    client = RegistryClient(registry, USER, Secret(PASSWORD))
    anomaly_id = client.register("pt.anomalies-value", bundled_schemas().latest("Anomaly").raw)
    data = b"\x00" + anomaly_id.to_bytes(4, "big") + b"\x02"
    with pytest.raises(SchemaError, match="is a Anomaly record, expected EventBatch"):
        codec_for(settings(registry), EVENT_BATCH, "pt.events").decode(data)


def test_wrong_password_is_a_clear_error_that_never_shows_it(registry):
    codec = codec_for(settings(registry, password="wrong-pw-123"), EVENT_BATCH, "pt.events")
    with pytest.raises(RegistryError, match="refused the credentials") as info:
        codec.encode(event_batch())
    assert "wrong-pw-123" not in str(info.value) and PASSWORD not in str(info.value)
    assert "wrong-pw-123" not in repr(codec.client)


def test_credentials_in_url_are_used_and_never_shown(registry):
    url = registry.replace("http://", f"http://{USER}:{PASSWORD}@")
    codec = codec_for(Settings(kafka=KafkaSettings(schema_registry_url=url)), EVENT_BATCH, "pt.events")
    assert codec.decode(codec.encode(event_batch()))["rank"] in (0, 1)
    assert PASSWORD not in codec.client.url and PASSWORD not in repr(codec.client)


def test_unreachable_registry_is_unavailable_not_a_schema_error():
    codec = codec_for(settings(f"http://{USER}:{PASSWORD}@127.0.0.1:9"), EVENT_BATCH, "pt.events")
    with pytest.raises(RegistryUnavailable, match="unreachable") as info:
        codec.encode(event_batch())
    assert PASSWORD not in str(info.value)
    assert not isinstance(info.value, SchemaError)
