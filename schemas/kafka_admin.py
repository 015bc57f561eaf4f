"""Create topics explicitly and check a broker is reachable (confluent-kafka AdminClient).

Shared by `perftracker up`, every stream worker and the sink (:func:`ensure_topics`,
:class:`TopicKeeper`) and by the collectors (:func:`quiet_kafka_logger`), so it sits
at the bottom with the topic list it creates. confluent-kafka is imported only when called.
"""

from __future__ import annotations

import logging
import threading
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


log = logging.getLogger("perftracker.topics")

TOPIC_CHECK_S = 1.0


def _admin(conf: Mapping[str, str]) -> Any:
    from confluent_kafka.admin import AdminClient

    admin_conf: dict[str, Any] = {**conf, "logger": quiet_kafka_logger("perftracker.kafka.admin")}
    return AdminClient(admin_conf)


def ensure_topics(conf: Mapping[str, str], topics: list[Topic], timeout_s: float = 10.0,
                  admin: Any = None) -> list[str]:
    """Create the missing topics; return the names created. Existing topics are left alone.
    ``admin``: an AdminClient to reuse (one is made from ``conf`` otherwise)."""
    from confluent_kafka.admin import NewTopic

    admin = admin or _admin(conf)
    try:
        existing = set(admin.list_topics(timeout=min(timeout_s, 5.0)).topics)
    except Exception as exc:
        raise KafkaUnreachable(
            f"cannot reach Kafka at {conf.get('bootstrap.servers')} "
            f"(security protocol {conf.get('security.protocol', 'plaintext')}): {exc}. "
            "Check kafka.bootstrap_servers (PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS): the addresses the brokers "
            "advertise must resolve and be reachable from here; then kafka.security_protocol, the SASL "
            "mechanism and credentials, and the TLS CA file when the brokers require them") from None
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


class TopicKeeper(threading.Thread):
    """Re-creates the topics when they vanish, checking every ``interval_s`` (daemon thread).

    A memory-only broker (tansu) comes back from a restart with no topics: consumers
    then wait on topics that no longer exist, and tansu acknowledges what is produced to
    them and keeps nothing. Workers and the sink each run one keeper so the topics come
    back with their partition counts without anyone's help; a broker that is away is
    simply tried again later. ``recreated`` counts the topics it created. A topic whose
    id changed since the last check (re-created, by this keeper or anyone) is handed out
    by :meth:`take_recreated`: a consumer's position in the old topic means nothing in
    the new one (see :func:`rewind`).
    """

    def __init__(self, conf: Mapping[str, str], topics: list[Topic], interval_s: float = TOPIC_CHECK_S):
        super().__init__(name="perftracker-topic-keeper", daemon=True)
        self.conf, self.topics, self.interval_s = dict(conf), list(topics), interval_s
        self.recreated = 0
        self._ids: dict[str, str] = {}
        self._changed: set[str] = set()
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def run(self) -> None:
        admin = _admin(self.conf)
        while not self._stop_event.wait(self.interval_s):
            try:
                created = ensure_topics(self.conf, self.topics, timeout_s=5.0, admin=admin)
                ids = _topic_ids(admin, [t.name for t in self.topics])
            except Exception as exc:  # broker away or refusing: try again next round
                log.debug("topic check failed: %s", exc)
                continue
            if created:
                self.recreated += len(created)
                log.warning("re-created %d topic(s) the broker had lost: %s", len(created), ", ".join(created))
            with self._lock:
                self._changed.update(n for n, i in ids.items() if self._ids.get(n, i) != i)
                self._ids.update(ids)

    def take_recreated(self) -> set[str]:
        """Topics re-created since the last call (thread-safe)."""
        with self._lock:
            changed, self._changed = self._changed, set()
        return changed

    def stop(self) -> None:
        self._stop_event.set()


def _topic_ids(admin: Any, names: list[str]) -> dict[str, str]:
    from confluent_kafka import TopicCollection

    futures = admin.describe_topics(TopicCollection(names), request_timeout=5.0)
    return {name: str(fut.result(5.0).topic_id) for name, fut in futures.items()}


def rewind(consumer: Any, topics: set[str]) -> list[tuple[str, int]]:
    """Seek ``consumer``'s assigned partitions of ``topics`` (re-created: everything in them is
    new) to their first offset; returns the partitions moved."""
    if not topics:
        return []
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    moved = []
    for tp in consumer.assignment():
        if tp.topic in topics:
            try:
                consumer.seek(TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING))
                moved.append((tp.topic, tp.partition))
            except Exception as exc:  # not fetching yet: it starts from the (absent) commit anyway
                log.warning("could not rewind %s[%d] after it was re-created: %s", tp.topic, tp.partition, exc)
    if moved:
        log.warning("read %d re-created partition(s) from their start", len(moved))
    return moved
