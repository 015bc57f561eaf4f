"""The embedded broker made reachable from other hosts: it listens on every interface and
advertises the name set in ``kafka.embedded_advertised_host`` (a real tansu; the metadata a
Kafka client gets back names the advertised address, the one every client then connects to)."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient
from perftracker_ml.deploy.tansu import port_open, start_broker

pytestmark = pytest.mark.integration


def test_a_wildcard_listener_advertises_the_configured_name(tmp_path):
    broker = start_broker(host="0.0.0.0", advertised_host="localhost", log_path=tmp_path / "tansu.log")
    try:
        assert broker.bootstrap == f"localhost:{broker.port}"
        assert port_open("127.0.0.1", broker.port)
        meta = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.port}"}).list_topics(timeout=10)
        assert [(b.host, b.port) for b in meta.brokers.values()] == [("localhost", broker.port)]
    finally:
        broker.stop()
