"""How long a worker's Kafka fetch may wait for data (``streams.fetch_wait_ms``).

Faust's aiokafka driver builds its worker consumer with a fixed ``fetch_max_wait_ms`` of
1,500 ms. Kafka answers a waiting fetch as soon as data arrives, so there the wait only
sets how often an idle consumer asks. The embedded tansu broker does not wake a waiting
fetch: measured (aiokafka 0.14, one message produced at a random moment), a message is
delivered after up to half the wait, 0.27 s on average with 1,500 ms, 0.10 s with 500 ms,
0.01 s with 100 ms. A record crosses three worker topics between a rank's batch and an
anomaly (inputs, patterns, findings), so the fixed wait added about 1.1 s on average (up
to 2.2 s) to every diagnosis. Under load a fetch fills before its wait ends, whatever the
wait, so a short one costs nothing but a few idle fetches a second.

This module hands Faust a transport whose worker consumer takes the configured wait;
everything else is Faust's own. ``fetch_wait_ms`` 0 keeps Faust's 1,500 ms.
"""

from __future__ import annotations

import logging
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

log = logging.getLogger("perftracker_ml.streams")

SCHEMES = ("kafka", "aiokafka")  # the broker URL schemes that name Faust's aiokafka driver


def set_fetch_wait(consumer: Any, wait_ms: int) -> bool:
    """Give an aiokafka consumer not started yet ``wait_ms`` as its fetch wait (its fetcher,
    built at start, takes it); whether the consumer had such a setting to change."""
    if wait_ms <= 0 or not hasattr(consumer, "_fetch_max_wait_ms"):
        return False
    consumer._fetch_max_wait_ms = int(wait_ms)
    return True


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        wait_ms = int(getattr(self.app, "perftracker_fetch_wait_ms", 0))
        if wait_ms > 0 and not set_fetch_wait(consumer, wait_ms):
            log.warning("this aiokafka has no fetch wait to set; Faust's 1500 ms stays (adds latency with tansu)")
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport with the worker consumer's fetch wait set."""

    Consumer = _Consumer


class App(faust.App):
    """``faust.App`` whose Kafka transport takes ``fetch_wait_ms`` (0: Faust's own)."""

    def __init__(self, *args: Any, fetch_wait_ms: int = 0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.perftracker_fetch_wait_ms = int(fetch_wait_ms)

    def _new_transport(self) -> Any:
        url = self.conf.broker_consumer[0]
        if self.perftracker_fetch_wait_ms > 0 and getattr(url, "scheme", "") in SCHEMES:
            return Transport(self.conf.broker_consumer, self)
        return super()._new_transport()
