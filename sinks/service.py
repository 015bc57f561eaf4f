"""The sink service: Kafka -> store, plus incident alerts and the local query API.

Loop (one thread): consume a batch; decode each message by its schema
fingerprint; turn records into rows (:mod:`.rows`) buffered by the
:class:`~.clickhouse.ClickHouseSink`; hand Anomaly records to the alert
dispatcher at once; flush when the buffer is full or old enough and only
after the flush succeeded commit the offsets consumed before it. A failed
flush keeps its rows and offsets and is retried with exponential backoff; a message that cannot be decoded or
mapped goes to the dead-letter topic with its reason and is counted.
Flushes run in the background (:mod:`.flusher`), one batch at a time, so
decoding continues while the store writes.
Delivery is at-least-once; tables collapse replays (see :mod:`.schema`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..schemas import SchemaError, bundle, bundled_schemas, record_sets
from ..schemas.codec import writer_fingerprint
from ..schemas.counters import Counter, CounterSet, Histogram, Kind
from ..schemas.gc_policy import SERVICE_YOUNG, tune_gc
from ..schemas.http_auth import check_bind
from ..schemas.kafka_admin import rewind
from ..schemas.logs import setup_logging
from ..schemas.metrics import exposition, registry_of
from ..schemas.registry import RegistryUnavailable, fetch_writer, registry_client
from ..schemas.settings import Settings
from ..schemas.stackfile import resolve_bootstrap
from ..schemas.topics import TopicNames, all_topics
from ..schemas.validate import validate
from ..schemas.vocabulary import (
    ANOMALY,
    DEADLETTER_OFFSET,
    DEADLETTER_PARTITION,
    DEADLETTER_REASON,
    DEADLETTER_REASON_MAX_CHARS,
    DEADLETTER_SOURCE_TOPIC,
    DEADLETTER_STAGE,
    DEADLETTER_TABLE,
)
from .alerts.dispatcher import AlertDispatcher, build_dispatcher
from .alerts.remediation import RemediationPolicy
from .alerts.remediator import build_remediator
from .api import QueryServer
from .clickhouse import ClickHouseSink
from .decode import RecordDecoder
from .errors import SinkError, StoreUnavailable
from .flusher import BackgroundFlusher, Flushed
from .lag import consumer_lag
from .raw import RawMessage, raw_fingerprints
from .rows import ROW_BUILDERS
from .store import Store, StoreTarget, store_target

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """The sink stopped while a message waited (for the schema registry); it stays unhandled."""


class SinkCounters(CounterSet):
    """The sink's counters (``GET /health`` and the stop log line show their snapshot)."""

    component = "sink"

    consumed = Counter("messages consumed from Kafka")
    rows_buffered = Counter("rows (and raw messages) added to the store's buffer")
    rows_written = Counter("rows written to the store")
    rows_dropped = Counter("rows dropped while the store was down (oldest first, past max_backlog_rows)")
    dead_lettered = Counter("messages sent to the dead-letter topic: undecodable or unmappable")
    flushes = Counter("batches written to the store")
    flush_failures = Counter("failed attempts to write a batch (retried with backoff)")
    commits = Counter("offset commits after a successful flush")
    rows_rejected = Counter("rows the store refused, dead-lettered one by one (part of dead_lettered)")
    decode_errors = Counter("messages that could not be decoded (dead-lettered)")
    backlog_rows = Counter("rows buffered or being written, not yet in the store", kind=Kind.GAUGE)
    flush_seconds = Histogram("from a batch handed to the store to it being written, retries included, in "
                              "seconds (observed in ms)", per_unit=1000,
                              buckets=(10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000))
    consumer_lag = Counter("messages in a partition not yet read: the high watermark seen in the "
                           "consumer's fetches minus its position, at least 0",
                           labels=("topic", "partition"), kind=Kind.GAUGE)


def consumer_conf(settings: Settings) -> dict[str, Any]:
    conf: dict[str, Any] = dict(settings.kafka.client_conf())
    conf["bootstrap.servers"] = resolve_bootstrap(settings) or conf["bootstrap.servers"]
    conf.update({
        "group.id": f"{settings.streams.app_id}-sink", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000,
        "fetch.wait.max.ms": 100, "max.partition.fetch.bytes": 4 << 20, "fetch.max.bytes": 50 << 20,
    })
    return conf


class SinkService:
    """One sink process; :func:`run_sink` is the blocking entry point."""

    def __init__(self, settings: Settings, dispatcher: AlertDispatcher | None = None,
                 open_store: Callable[[StoreTarget], Store] = Store.open):
        self.settings = settings
        self._open_store_fn = open_store
        self.topics = TopicNames.for_prefix(settings.kafka.topic_prefix)
        names = [n for n in (*ROW_BUILDERS, *record_sets.SET_NAMES) if n in bundled_schemas().names()]
        self.registry = registry_client(settings, server=True)
        self.codec = RecordDecoder(names, self.registry)
        self._raw_fps = raw_fingerprints() if settings.store.raw_ingest else {}
        self.stats = SinkCounters()
        # added to inline: once per message, on the consumer thread only
        self._consumed = self.stats.cell(SinkCounters.consumed)
        self._rows_buffered = self.stats.cell(SinkCounters.rows_buffered)
        self.dispatcher = dispatcher or build_dispatcher(settings.alerts)
        self._remediation = RemediationPolicy.from_settings(settings.remediation) \
            if settings.remediation.enabled else None  # a bad mode or cause refused before anything starts
        self._stop = threading.Event()
        self._offsets: dict[tuple[str, int], int] = {}
        self.flusher: BackgroundFlusher | None = None
        self.store: Store | None = None
        self.sink: ClickHouseSink | None = None
        self.api: QueryServer | None = None
        self._consumer: Any = None
        self._producer: Any = None
        self._keeper: Any = None
        self._gauges_due = 0.0

    # -- lifecycle ---------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def _open_store(self) -> None:
        target = store_target(self.settings)
        delay = 0.5
        while not self._stop.is_set():
            try:
                self.store = self._open_store_fn(target)
                self.sink = ClickHouseSink(self.store, self.settings.store, self._dead_letter_raw,
                                           self._dead_letter_row)
                self.sink.setup()
                self.flusher = BackgroundFlusher(self.sink, self._stop)
                return
            except StoreUnavailable as exc:
                log.warning("store not ready (%s); retrying in %.1fs", exc, delay)
                if self.store is not None:
                    self.store.close()
                    self.store = None
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
        raise SinkError("stopped before the store became available")

    def start(self) -> None:
        from confluent_kafka import Consumer, Producer

        from ..schemas.kafka_admin import TopicKeeper, ensure_topics

        store = self.settings.store
        check_bind(store.query_host, self.settings.http_token, "store.query_host")  # before a long store wait
        self._open_store()
        assert self.store is not None
        registry = registry_of(self.stats, self.dispatcher.counters)
        self.api = QueryServer(self.store, store.query_port, self.stats_dict,
                               lambda: exposition(registry), store.query_host,
                               self.settings.http_token, keep=self.keep_records).start()
        conf = consumer_conf(self.settings)
        base = {**self.settings.kafka.client_conf(), "bootstrap.servers": conf["bootstrap.servers"]}
        topics = all_topics(self.settings.kafka.topic_prefix, self.settings.kafka.partitions)
        ensure_topics(base, topics)
        self._keeper = TopicKeeper(base, topics)  # a restarted memory-only broker gets its topics back
        self._keeper.start()
        self._producer = Producer({**base, "linger.ms": 50})
        self._consumer = Consumer(conf)
        self._consumer.subscribe([self.topics.patterns, self.topics.findings, self.topics.anomalies],
                                 on_revoke=self._on_revoke)
        if self._remediation is not None and self.dispatcher.remediator is None:
            self.dispatcher.remediator = build_remediator(self.settings.remediation, self.store)
        self.dispatcher.start()

    def keep_records(self, body: bytes) -> dict:
        """``POST /store`` (query API thread): records made outside the stream workers, such as
        an imported trace's, written into the store this sink owns (no alerts: not a live job)."""
        from .keep import decode_records, write_records

        assert self.store is not None
        kept = write_records(self.store, self.settings.store, decode_records(body))
        log.info("stored %d records from POST /store: %d rows, %d refused, %d invalid",
                 kept.records, kept.rows_written, kept.rows_rejected, len(kept.invalid))
        return kept.as_dict()

    def write_ready(self, ready_file: Path) -> None:
        assert self.api is not None and self.store is not None
        ready_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = ready_file.with_suffix(ready_file.suffix + ".tmp")
        tmp.write_text(json.dumps({"query_url": self.api.url, "pid": os.getpid(),
                                   "store": self.store.target.describe()}))
        tmp.replace(ready_file)

    def run(self, ready_file: Path | None = None) -> None:
        try:
            self.start()
            if ready_file is not None:
                self.write_ready(ready_file)
            log.info("sink consuming %s, query API at %s", self.topics.findings, self.api and self.api.url)
            while not self._stop.is_set():
                self.poll_once()
        finally:
            self.close()

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
        if self.flusher is not None and self._consumer is not None:
            self._final_flush()
            self.flusher.shutdown()
        if self._consumer is not None:
            self._consumer.close()
        if self._producer is not None:
            self._producer.flush(5)
        self.dispatcher.stop()
        if self.api is not None:
            self.api.stop()
        if self.store is not None:
            self.store.close()
        log.info("sink stopped: %s", self.stats_dict())

    # -- data path ---------------------------------------------------------
    def poll_once(self, timeout_s: float = 0.2) -> None:
        msgs = self._consumer.consume(num_messages=5000, timeout=timeout_s)
        try:
            for msg in msgs:
                if msg.error():
                    log.warning("kafka: %s", msg.error())
                    continue
                self.handle(msg.topic(), msg.partition(), msg.offset(), msg.value())
        except Interrupted:  # stopping: what was not handled is re-read by the next consumer
            return
        self._producer.poll(0)
        if self._keeper is not None:  # topics re-created under us: their old offsets mean nothing
            for tp in rewind(self._consumer, self._keeper.take_recreated()):
                self._offsets.pop(tp, None)
        self._maybe_flush(caught_up=not msgs)

    def handle(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        """One consumed message: its record, or each record of a bundle (:mod:`..schemas.bundle`)."""
        self._consumed.value += 1
        if type(value) is bytes and bundle.is_bundle(value):
            try:
                items = bundle.unpack(value)
            except SchemaError as exc:
                self._offsets[(topic, partition)] = offset
                self.stats.inc(SinkCounters.decode_errors)
                self._dead_letter(topic, partition, offset, value, f"undecodable: {exc}")
                return
            for item in items:  # all writers known before any item counts as handled
                self._wait_for_registry(item)
            for item in items:
                self._handle_record(topic, partition, offset, item)
            if not items:  # nothing in it to store: handled all the same, not re-read after a restart
                self._offsets[(topic, partition)] = offset
            return
        self._handle_record(topic, partition, offset, value)

    def _handle_record(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        self._wait_for_registry(value)  # before the offset counts as handled
        self._offsets[(topic, partition)] = offset
        assert self.sink is not None
        fp = writer_fingerprint(value) if value else None
        raw_name = self._raw_fps.get(fp) if fp is not None else None
        if raw_name is not None:
            self.sink.add_raw(raw_name, RawMessage(value, topic, partition, offset))  # type: ignore[arg-type]
            self._rows_buffered.value += 1
            return
        try:
            name, record = self.codec.decode(value or b"")
            invalid = validate(name, record)
            if name in record_sets.SET_NAMES and not invalid:
                self._handle_set(topic, partition, offset, value, name, record)
                return
            batches = [] if invalid else ROW_BUILDERS[name](record)
        except SchemaError as exc:
            self.stats.inc(SinkCounters.decode_errors)
            self._dead_letter(topic, partition, offset, value, f"undecodable: {exc}")
            return
        except (KeyError, TypeError, ValueError) as exc:
            self._dead_letter(topic, partition, offset, value, f"unmappable record: {exc!r}")
            return
        if invalid:
            self._dead_letter(topic, partition, offset, value, f"invalid: {invalid}")
            return
        for table, rows in batches:
            self.sink.add_rows(table, rows)
            self._rows_buffered.value += len(rows)
        if name == ANOMALY:
            self.dispatcher.submit(record, source=(topic, partition))

    def _handle_set(self, topic: str, partition: int, offset: int, value: bytes | None, name: str,
                    record: dict) -> None:
        """A record set (schemas/record_sets.py): each of its records stored as if it had come alone;
        a set whose columns are unreadable is dead-lettered whole, a record that fails its rules
        alone (the set's bytes, the reason naming its rank)."""
        assert self.sink is not None
        try:
            members = record_sets.read(name, record)
        except SchemaError as exc:
            self.stats.inc(SinkCounters.decode_errors)
            self._dead_letter(topic, partition, offset, value, f"unreadable {name}: {exc}")
            return
        rows_of = ROW_BUILDERS[record_sets.member(name)]
        for one, invalid in members:
            if invalid:
                self._dead_letter(topic, partition, offset, value, record_sets.problem(name, one, invalid))
                continue
            for table, rows in rows_of(one):
                self.sink.add_rows(table, rows)
                self._rows_buffered.value += len(rows)

    def _wait_for_registry(self, value: bytes | None) -> None:
        """Hold a registry-framed message while the schema registry is away (it is not the
        message's fault): retry with backoff; at stop, :class:`Interrupted` leaves it unhandled."""
        delay = 0.5
        while True:
            try:
                return fetch_writer(self.registry, value)
            except RegistryUnavailable as exc:
                if self._stop.is_set():
                    raise Interrupted("stopped while the schema registry was unavailable") from None
                log.warning("%s; retrying in %.1fs", exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)

    def _dead_letter_raw(self, m: RawMessage, reason: str) -> None:
        self._dead_letter(m.topic, m.partition, m.offset, m.value, reason)

    def _dead_letter_row(self, table: str, row: dict[str, Any], reason: str) -> None:
        """A row the store refused (flush thread): its values as JSON, headers ``table`` and ``reason``."""
        self.stats.inc(SinkCounters.rows_rejected)
        value = json.dumps({"table": table, "row": row}, default=str).encode()
        self._dead_letter(table, -1, -1, value, f"rejected by the store: {reason}", table)

    def idle(self) -> bool:
        """Everything consumed so far is in the store (or dead-lettered)."""
        return self.sink is not None and self.flusher is not None and (
            not self.sink.buffered and not self.flusher.busy)

    def _dead_letter(self, topic: str, partition: int, offset: int, value: bytes | None,
                     reason: str, table: str = "") -> None:
        self.stats.inc(SinkCounters.dead_lettered)
        log.debug("dead-letter %s[%d]@%d: %s", topic, partition, offset, reason)
        where = [(DEADLETTER_TABLE, table.encode())] if table else [(DEADLETTER_SOURCE_TOPIC, topic.encode())]
        try:
            self._producer.produce(
                self.topics.deadletter, value=value, key=topic.encode(),
                headers=[(DEADLETTER_REASON, reason[:DEADLETTER_REASON_MAX_CHARS].encode()), *where,
                         (DEADLETTER_PARTITION, str(partition).encode()),
                         (DEADLETTER_OFFSET, str(offset).encode()), (DEADLETTER_STAGE, b"sink")])
        except BufferError:
            log.warning("dead-letter queue full; message %s[%d]@%d not forwarded", topic, partition, offset)

    def _maybe_flush(self, caught_up: bool = False) -> None:
        """Flush when the buffer is full or old, or when the consumer has caught up with a
        sizable buffer (>= 1/10 of flush_rows: after a burst, write now instead of waiting
        for the interval; a trickle still goes out once per interval, in few parts)."""
        assert self.sink is not None and self.flusher is not None
        done = self.flusher.reap()
        if done is not None:
            self._flushed(done)
        idle_flush = caught_up and self.sink.buffered >= self.sink.flush_rows // 10
        if not self.flusher.busy and (self.sink.due() or idle_flush):
            self.flusher.submit(self.sink.take(), dict(self._offsets))
        self.stats.set(SinkCounters.rows_dropped, self.sink.dropped_rows)
        self.stats.set(SinkCounters.flush_failures, self.flusher.failures)
        self._refresh_gauges()

    def _refresh_gauges(self, every_s: float = 1.0) -> None:
        """Backlog and consumer lag, at most once per ``every_s``."""
        now = time.monotonic()
        if now < self._gauges_due or self.sink is None or self.flusher is None:
            return
        self._gauges_due = now + every_s
        self.stats.set(SinkCounters.backlog_rows, self.sink.buffered + self.flusher.inflight_rows)
        if self._consumer is not None:
            self.stats.replace(SinkCounters.consumer_lag, consumer_lag(self._consumer))

    def _flushed(self, done: Flushed) -> None:
        self.stats.inc(SinkCounters.flushes)
        if done.duration_ms >= 0:
            self.stats.observe(SinkCounters.flush_seconds, done.duration_ms)
        self.stats.inc(SinkCounters.rows_written, by=done.rows)
        self._commit(done.offsets)

    def _final_flush(self) -> None:
        """At stop: wait for the batch in flight, then write what is left once, and commit."""
        assert self.sink is not None and self.flusher is not None
        done = self.flusher.reap(wait_s=30.0)
        if done is not None:
            self._flushed(done)
        if self.flusher.busy:
            log.warning("store did not take the last batch; it will be re-read on restart")
            return
        offsets = dict(self._offsets)
        try:
            rows = self.sink.write_batch(self.sink.take())
        except StoreUnavailable as exc:
            log.warning("final flush failed (%s); unflushed messages will be re-read on restart", exc)
            return
        self._flushed(Flushed(rows, offsets))

    def _commit(self, offsets: dict[tuple[str, int], int]) -> None:
        from confluent_kafka import TopicPartition

        if not offsets:
            return
        tps = [TopicPartition(t, p, o + 1) for (t, p), o in offsets.items()]
        try:
            self._consumer.commit(offsets=tps, asynchronous=False)
            self.stats.inc(SinkCounters.commits)
            for key, off in offsets.items():
                if self._offsets.get(key) == off:
                    del self._offsets[key]
        except Exception as exc:  # KafkaException: rebalance in progress, broker away
            log.warning("offset commit failed (%s); rows will be replayed and deduplicated", exc)

    def _on_revoke(self, consumer: Any, partitions: list) -> None:
        if self.flusher is not None:
            done = self.flusher.reap(wait_s=10.0)
            if done is not None:
                self._flushed(done)
        for tp in partitions:  # their new owner re-reads what we did not commit
            self._offsets.pop((tp.topic, tp.partition), None)
        # their incidents are the new owner's to keep firing in Alertmanager (and to resolve)
        self.dispatcher.release((tp.topic, tp.partition) for tp in partitions)

    def stats_dict(self) -> dict:
        return {**self.stats.snapshot(), "alerts": self.dispatcher.stats()}


def run_sink(settings: Settings, ready_file: Path | None = None) -> None:
    """Blocking: run the sink until SIGTERM/SIGINT (or :meth:`SinkService.stop`)."""
    check_bind(settings.store.query_host, settings.http_token, "store.query_host")  # refuse before anything
    setup_logging(settings, "sink")
    tune_gc(SERVICE_YOUNG)  # the sink allocates millions of short-lived rows and keeps few
    service = SinkService(settings)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: service.stop())
    service.run(ready_file)
