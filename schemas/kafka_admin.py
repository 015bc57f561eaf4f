"""Create topics explicitly and check a broker is reachable (confluent-kafka AdminClient).

Shared by `perftracker up`, every stream worker and the sink (:func:`ensure_topics`)
and by the collectors (:func:`quiet_kafka_logger`), so it sits at the bottom
with the topic list it creates. confluent-kafka is imported only when called.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .errors import PerftrackerError
from .topics import Topic


class KafkaUnreachable(PerftrackerError):
    """No Kafka-protocol broker answered at the configured address."""


def quiet_kafka_logger(name: str = "perftracker.kafka") -> logging.Logger:
    """A logger for librdkafka's ``logger`` setting: its lines (every failed connect, ...) stay
    off the caller's stderr; errors still reach the clients' ``error_cb`` and results."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


def ensure_topics(conf: Mapping[str, str], topics: list[Topic], timeout_s: float = 10.0) -> list[str]:
    """Create the missing topics; return the names created. Existing topics are left alone."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin_conf: dict[str, Any] = {**conf, "logger": quiet_kafka_logger("perftracker.kafka.admin")}
    admin = AdminClient(admin_conf)
    try:
        existing = set(admin.list_topics(timeout=min(timeout_s, 5.0)).topics)
    except Exception as exc:
        raise KafkaUnreachable(
            f"cannot reach Kafka at {conf.get('bootstrap.servers')}: {exc}. "
            "Check bootstrap_servers in the config or PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS") from None
    missing = [t for t in topics if t.name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(t.name, num_partitions=t.partitions, replication_factor=-1) for t in missing],
        operation_timeout=timeout_s)
    created = []
    for name, fut in futures.items():
        try:
            fut.result(timeout_s)
            created.append(name)
        except Exception as exc:  # already created by a racing process is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise PerftrackerError(f"could not create topic {name}: {exc}") from None
    return created
