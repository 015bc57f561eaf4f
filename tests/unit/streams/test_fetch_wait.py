"""The worker's Kafka consumer takes ``streams.fetch_wait_ms`` as its fetch wait (Faust's fixed
1,500 ms otherwise): with the embedded tansu broker the wait sets how late each hop delivers."""

from __future__ import annotations

import asyncio

import pytest
from perftracker_ml.deploy.tansu import free_port
from perftracker_ml.schemas.settings import Settings, StreamSettings
from perftracker_ml.streams.app import create_app
from perftracker_ml.streams.fetch_wait import set_fetch_wait


def worker_fetch_wait(fetch_wait_ms: int) -> int:
    """The fetch wait of the aiokafka consumer a worker's app builds (not started: no broker)."""
    async def build() -> int:
        app = create_app(Settings(streams=StreamSettings(web_port=free_port(), fetch_wait_ms=fetch_wait_ms)),
                         "127.0.0.1:1")
        consumer = app.consumer._thread._create_consumer(loop=asyncio.get_running_loop())
        try:
            return int(consumer._fetch_max_wait_ms)
        finally:
            await consumer.stop()
    return asyncio.run(build())


@pytest.mark.parametrize("wait_ms", [200, 50, 1000])
def test_the_worker_consumer_waits_as_configured(wait_ms: int) -> None:
    assert worker_fetch_wait(wait_ms) == wait_ms


def test_zero_keeps_fausts_own_wait() -> None:
    assert worker_fetch_wait(0) == 1500


def test_the_default_wait_is_short() -> None:
    assert worker_fetch_wait(StreamSettings().fetch_wait_ms) <= 250


def test_a_consumer_without_the_setting_is_left_alone() -> None:
    class Other:
        pass

    other = Other()
    assert not set_fetch_wait(other, 200)
    assert not hasattr(other, "_fetch_max_wait_ms")
