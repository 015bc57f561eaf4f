"""Follows ``pt.control`` (one partition, keyed by job) and hands PROFILE requests on.

The consumer is *assigned* the partition (no consumer group to join, so no
rebalance wait) and reads it from the beginning (the topic is small), so a
request issued just before a rank started still reaches it. Messages of other
jobs, requests issued more than ``STALE_S`` before this process attached, and
repeated request ids are ignored. When the job id changes (the ranks agreed on rank 0's id
after start-up, :mod:`.job_agreement`), the partition is read again from the beginning: a
request for the agreed id read under the provisional one was ignored then.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from ..schemas.kafka_admin import quiet_kafka_logger
from ..schemas.vocabulary import ControlCommand
from .profiling import ProfileRequest, ProfileWindows
from .safety import ErrorBudget
from .transport import LIBRDKAFKA_LOGGER

STALE_S = 60.0


class ControlFollower(threading.Thread):
    def __init__(self, conf: Mapping[str, str], topic: str, job: str, windows: ProfileWindows,
                 errors: ErrorBudget, codec: Any = None):
        super().__init__(name="perftracker-control", daemon=True)
        self.topic = topic
        self.job = job
        self.windows = windows
        self.errors = errors
        self.received = 0  # requests for this job taken
        self.read = 0  # messages read, any job
        self._conf = dict(conf)
        self._seen: set[str] = set()
        self._since_ms = int((time.time() - STALE_S) * 1000)
        self._stop_event = threading.Event()
        self._rewind = threading.Event()  # the job id changed: read the partition again
        self._codec = codec  # a Codec or RegistryCodec of Control; None: the single-object one

    def run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from ..schemas import Codec
        from ..schemas.vocabulary import CONTROL

        codec = self._codec or Codec(CONTROL)
        consumer = Consumer({**self._conf, "group.id": f"perftracker-collector-{self.job}",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 5000,
                             "session.timeout.ms": 10_000, "log_level": 3, "logger": quiet_kafka_logger(LIBRDKAFKA_LOGGER),
                             "error_cb": lambda err: None})
        try:
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            while not self._stop_event.is_set():
                if self._rewind.is_set():
                    self._rewind.clear()
                    consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
                msg = consumer.poll(0.4)
                if msg is None or msg.error():
                    continue
                self.read += 1
                try:
                    self.handle(codec.decode(msg.value() or b""))  # a null value is a bad message
                except Exception as exc:  # noqa: BLE001 - a bad message is skipped
                    self.errors.caught("control message", exc)
        except Exception as exc:  # noqa: BLE001
            self.errors.caught("control", exc)
        finally:
            consumer.close()

    def set_job(self, job: str) -> None:
        """The collector's job id changed: follow ``job``'s requests, those already read included."""
        if job != self.job:
            self.job = job
            self._rewind.set()

    def handle(self, msg: dict) -> None:
        if msg.get("job") != self.job or msg["request_id"] in self._seen:
            return
        issued: Any = msg.get("issued_ms")
        issued_ms = int(issued.timestamp() * 1000) if hasattr(issued, "timestamp") else int(issued or 0)
        if issued_ms < self._since_ms:
            return
        self._seen.add(msg["request_id"])
        self.received += 1
        if msg["command"] == ControlCommand.PROFILE:
            self.windows.request(ProfileRequest(msg["request_id"], int(msg["start_step"]),
                                                float(msg["duration_s"])))
        elif msg["command"] == "STOP_PROFILE":
            self.windows.request_stop()

    def close(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(0.6)
