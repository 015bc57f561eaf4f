"""Asynchronous send: a background thread builds batches and produces them to Kafka.

The training thread never waits for Kafka. librdkafka keeps its own bounded
queue and reconnects by itself; a batch it cannot deliver (queue full, broker
down past ``message.timeout.ms``) is counted as dropped events, and the
cumulative drop count travels in every batch header.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..schemas.kafka_admin import quiet_kafka_logger
from ..schemas.settings import CollectorSettings
from ..schemas.vocabulary import HEARTBEAT_S
from .batch import BatchBuilder, StackRow, event_count
from .counters import CollectorCounters
from .events import OpSummary
from .flight_recorder import FlightRecorder
from .identity import RankIdentity
from .recorder import Recorder
from .safety import ErrorBudget

LIBRDKAFKA_LOGGER = "perftracker_ml.collectors.librdkafka"

log = logging.getLogger("perftracker_ml.collectors")

# a collective still in flight this long is reported as entered (hang culprits); shorter calls
# usually complete before the next batch and need no marker
IN_FLIGHT_MARKER_AGE_NS = 1_000_000_000
STATS_INTERVAL_MS = 1000  # librdkafka statistics (wire bytes) this often, parsed on the sender thread


# Batches are sent at a fixed phase of the wall clock: FLUSH_PHASE of the interval past each
# multiple of it, plus up to FLUSH_SPREAD of it by rank (the job's ranks do not all send at
# the same instant). Comparison windows start at multiples of their length, so a window ends
# on a multiple of the interval too, and closes (the rank's data ``close_lag_ms`` past its end)
# with the first batch after it: 0.75 s later on every rank. At a random phase each rank
# waited 0.5-1.5 s, the job its slowest rank: ~1.3 s at 4 ranks, ~1.5 s at thousands.
FLUSH_PHASE = 0.7
FLUSH_SPREAD = 0.1
WINDOW_CLOSE_LAG_S = 0.5  # the workers close a rank's window once its data is this far past the end (close_lag_ms)


def flush_delay(now_s: float, interval_s: float, key: bytes = b"") -> float:
    """Seconds from wall time ``now_s`` to this rank's next send (never less than a tenth of
    the interval: a send cycle that ended just before the phase does not start another at once)."""
    if not interval_s > 0:
        return 1.0
    phase = (FLUSH_PHASE + FLUSH_SPREAD * (zlib.crc32(key) % 1000) / 1000) * interval_s
    delay = interval_s - (now_s - phase) % interval_s
    return delay + interval_s if delay < interval_s / 10 else delay


# what a rank's producer (and a host's relay, collectors/relay_server.py) holds and how long it
# retries: lz4, a 16 MB queue, 60 s to deliver, quiet reconnects
PRODUCER_CONF = {"compression.type": "lz4", "queue.buffering.max.kbytes": 16 * 1024, "message.timeout.ms": 60_000,
                 "log.connection.close": False, "log_level": 3}


def count_sent(counters: CollectorCounters, n_events: int, n_bytes: int) -> None:
    """One batch delivered (or handed to the host's relay): its events and encoded bytes."""
    counters.inc(CollectorCounters.batches_sent)
    counters.inc(CollectorCounters.events_sent, by=n_events)
    counters.inc(CollectorCounters.sent_bytes, by=n_bytes)


def window_slot(wall_s: float, window_s: float) -> int | None:
    """Which window a send at wall time ``wall_s`` closes the one before of: windows start at
    multiples of ``window_s`` and close once a rank's data is :data:`WINDOW_CLOSE_LAG_S` past
    their end, so every cycle of one slot closes the same windows (None: no slots)."""
    return int((wall_s - WINDOW_CLOSE_LAG_S) // window_s) if window_s > 0 else None


class BatchSink(Protocol):
    """Where the sender's encoded batches go; it counts what it delivers in ``counters``."""

    counters: CollectorCounters
    wire_at_ns: int  # when ``wire_bytes`` was last read (monotonic ns)

    def send(self, key: bytes, payload: bytes, n_events: int) -> None: ...
    def poll(self) -> None: ...
    def flush(self, timeout_s: float) -> int: ...


class KafkaSink:
    """confluent-kafka producer; counts delivered and failed messages."""

    def __init__(self, conf: Mapping[str, str], topic: str, counters: CollectorCounters,
                 on_lost: Callable[[int], None], errors: ErrorBudget):
        from confluent_kafka import Producer

        self.topic = topic
        self.counters = counters
        self.wire_at_ns = 0
        self._on_lost = on_lost
        self._errors = errors
        self._wire = WireBytes()
        self.producer = Producer({
            **conf, **PRODUCER_CONF, "linger.ms": 50, "reconnect.backoff.max.ms": 5_000,
            "error_cb": self._on_error, "logger": quiet_kafka_logger(LIBRDKAFKA_LOGGER),
            "statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self._on_stats,
        })

    def send(self, key: bytes, payload: bytes, n_events: int) -> None:
        counters = self.counters

        def delivered(err: object, _msg: object) -> None:
            counters.inc(CollectorCounters.events_in_flight, by=-n_events)
            if err is None:
                count_sent(counters, n_events, len(payload))
            else:
                counters.inc(CollectorCounters.batches_failed)
                self._on_lost(n_events)

        try:
            self.producer.produce(self.topic, payload, key, on_delivery=delivered)
            counters.inc(CollectorCounters.events_in_flight, by=n_events)
        except BufferError:
            counters.inc(CollectorCounters.batches_failed)
            self._on_lost(n_events)
        self.producer.poll(0)

    def poll(self) -> None:
        self.producer.poll(0)

    def send_to(self, topic: str, key: bytes, payload: bytes) -> None:
        """Another record type (e.g. HardwareBatch) on another topic; losses are not events."""
        try:
            self.producer.produce(topic, payload, key)
        except BufferError:
            self.counters.inc(CollectorCounters.batches_failed)

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for delivery; return messages still queued."""
        return int(self.producer.flush(max(0.0, timeout_s)))

    def _on_error(self, err: object) -> None:
        self._errors.caught("kafka", RuntimeError(str(err)))

    def _on_stats(self, stats_json: str) -> None:
        """librdkafka's statistics: each broker connection's ``txbytes``, summed over time."""
        try:
            counters = self.counters
            counters.set(CollectorCounters.wire_bytes, self._wire.add(json.loads(stats_json)["brokers"]))
            self.wire_at_ns = time.monotonic_ns()
            counters.set(CollectorCounters.wire_base_bytes, counters.sent_bytes)
        except Exception as exc:  # noqa: BLE001 - called from librdkafka: never raise back
            self._errors.caught("kafka statistics", exc)


class WireBytes:
    """Bytes written to the brokers since start, from librdkafka's per-broker ``txbytes``.

    librdkafka's totals cover only the broker handles alive at that moment, and a
    handle's counter starts again from 0 when it reconnects (measured against tansu:
    the top-level ``tx_bytes`` read 3192, then 0 while the broker was down, then
    2326). So each handle's counter is followed on its own: growth adds its
    difference, a drop (a reset) adds the new value, and a handle that goes away
    keeps what it had sent. Never counts more than was sent.
    """

    def __init__(self) -> None:
        self.total = 0
        self._last: dict[str, int] = {}

    def add(self, brokers: Mapping[str, Mapping[str, Any]]) -> int:
        for name, broker in brokers.items():
            value = int(broker.get("txbytes", 0))
            last = self._last.get(name, 0)
            self.total += value - last if value >= last else value
            self._last[name] = value
        return self.total


class NullSink:
    """No broker configured: every batch is counted as lost."""

    wire_at_ns = 0  # never: wire_bytes stays unknown

    def __init__(self, counters: CollectorCounters, on_lost: Callable[[int], None]):
        self.counters = counters
        self._on_lost = on_lost

    def send(self, key: bytes, payload: bytes, n_events: int) -> None:
        self.counters.inc(CollectorCounters.batches_failed)
        self._on_lost(n_events)

    def poll(self) -> None:
        pass

    def flush(self, timeout_s: float) -> int:
        return 0


class SpoolSink:
    """No broker, a directory (``spool:DIR``): every message goes to this process's spool file
    (:mod:`perftracker_ml.schemas.spool`), written by the sender thread; a message past the
    file's bound is counted as lost, as an undeliverable one is."""

    wire_at_ns = 0  # no wire: wire_bytes stays unknown

    def __init__(self, directory: Any, topic: str, counters: CollectorCounters,
                 on_lost: Callable[[int], None], errors: ErrorBudget):
        from ..schemas.spool import SpoolWriter

        self.topic = topic
        self.counters = counters
        self._on_lost = on_lost
        self._errors = errors
        self.writer = SpoolWriter(directory)

    def send(self, key: bytes, payload: bytes, n_events: int) -> None:
        if self._write(self.topic, key, payload):
            count_sent(self.counters, n_events, len(payload))
        else:
            self.counters.inc(CollectorCounters.batches_failed)
            self._on_lost(n_events)

    def send_to(self, topic: str, key: bytes, payload: bytes) -> None:
        if not self._write(topic, key, payload):
            self.counters.inc(CollectorCounters.batches_failed)

    def _write(self, topic: str, key: bytes, payload: bytes) -> bool:
        try:
            return self.writer.append(topic, key, payload)
        except Exception as exc:  # noqa: BLE001 - a full disk must not reach training
            self._errors.caught("spool", exc)
            return False

    def poll(self) -> None:
        try:
            self.writer.flush()
        except Exception as exc:  # noqa: BLE001
            self._errors.caught("spool", exc)

    def flush(self, timeout_s: float) -> int:
        self.poll()
        return 0


class Sender(threading.Thread):
    """Every ``flush_interval_s``: run periodic tasks, drain the buffer, encode, send."""

    def __init__(self, recorder: Recorder, builder: BatchBuilder, encode: Callable[[dict], bytes],
                 sink: BatchSink, config: CollectorSettings, key: bytes):
        super().__init__(name="perftracker-sender", daemon=True)
        self.recorder = recorder
        self.builder = builder
        self.encode = encode
        self.sink = sink
        self.config = config
        self.key = key
        self._tasks: list[Callable[[], object]] = []
        self._kernels: deque[list[OpSummary]] = deque(maxlen=16)
        self._cpu: deque[dict] = deque(maxlen=16)  # CpuSample records for the next batch
        self._stacks: list[StackRow] = []  # stack rows for the next batch
        self._net: deque[dict] = deque(maxlen=16)  # NetSample records for the next batch
        self.started_ns = time.monotonic_ns()
        self._stop_event = threading.Event()
        self._tasks_lock = threading.Lock()  # the periodic tasks: one run at a time
        self._lock = threading.Lock()  # sending (drain, build, send): short, never held by a task
        self._ended = False  # the exit flush sent the final batch: nothing is sent after it
        self._last_send = 0.0
        self._last_slot: int | None = None  # batch_window_s: the window slot of the last send
        self.wall: Callable[[], float] = time.time  # the wall clock the window slots follow
        self._may_send: Callable[[], bool] = lambda: True
        self.flight: FlightRecorder | None = None  # read on a suspected hang (collectors/flight_recorder.py)

    def add_task(self, task: Callable[[], object]) -> None:
        """Run ``task()`` on the sender thread at every send cycle, before the buffer is drained."""
        self._tasks.append(task)

    def add_kernels(self, ops: list[OpSummary]) -> None:
        """Op summaries of one profiling window, sent with the next batch (the newest 16 are kept)."""
        self._kernels.append(ops)
        self.recorder.counters.inc(CollectorCounters.profile_windows)

    def add_cpu(self, sample: dict | None, stacks: list[StackRow]) -> None:
        """CPU evidence of one flush interval, sent with the next batch (called on this thread)."""
        if sample is not None:
            self._cpu.append(sample)
        if stacks:
            self._stacks = stacks if not self._stacks else _merge_rows(self._stacks, stacks)

    def add_net(self, sample: dict) -> None:
        """Network evidence of one flush interval, sent with the next batch (called on this thread)."""
        self._net.append(sample)

    def set_identity(self, identity: RankIdentity) -> None:
        """The identity (and message key) later batches carry (the GPU once known, the agreed job)."""
        self.builder.identity = identity
        self.key = identity.key

    def hold_until(self, may_send: Callable[[], bool]) -> None:
        """Keep batches back (events stay in the recorder's bounded buffer) until ``may_send()``;
        the last flush at exit sends regardless."""
        self._may_send = may_send

    def run(self) -> None:
        while not self._stop_event.wait(flush_delay(time.time(), self.config.flush_interval_s, self.key)):
            self.flush_once()

    def flush_once(self, final: bool = False) -> None:
        """One send cycle; never raises. ``final``: the exit flush: send even an empty batch,
        and mark the last batch ``final`` (EventBatch v4: the rank ended cleanly)."""
        with self._tasks_lock:
            self._run_tasks()
        self._send_cycle(final)

    def _run_tasks(self) -> None:
        try:
            for task in self._tasks:
                task()
        except Exception as exc:  # noqa: BLE001 - the sender thread must survive
            self.recorder.errors.caught("sender", exc)

    def _send_cycle(self, final: bool) -> None:
        with self._lock:
            if self._ended:  # the exit flush went first (this thread was inside a task meanwhile)
                return
            try:
                if final or self._may_send():
                    self._send_available(final)
                self.sink.poll()
            except Exception as exc:  # noqa: BLE001 - the sender thread must survive
                self.recorder.errors.caught("sender", exc)
            finally:
                self._ended = self._ended or final

    def _holding(self, now: float) -> bool:
        """Whether this cycle keeps the buffered events for a larger message. With
        ``batch_window_s``: this cycle falls in the window slot of the last send (it would close
        no window; at most one window long). Else: fewer than ``batch_min_events`` of them, and
        the last send less than ``batch_max_delay_s`` ago (to the nearest cycle). Entry markers,
        profile summaries and the exit flush never wait (checked by the caller)."""
        cfg = self.config
        if cfg.batch_window_s > 0:
            return (window_slot(self.wall(), cfg.batch_window_s) == self._last_slot
                    and now - self._last_send < cfg.batch_window_s)
        if cfg.batch_min_events <= 0 or len(self.recorder.events) >= cfg.batch_min_events:
            return False
        return now - self._last_send < cfg.batch_max_delay_s - cfg.flush_interval_s / 2

    def _send_available(self, final: bool) -> None:
        limit = self.config.max_batch_events
        now_ns = time.perf_counter_ns()
        markers = self.recorder.in_flight_markers(now_ns, IN_FLIGHT_MARKER_AGE_NS)
        if not (final or markers or self._kernels) and self._holding(time.monotonic()):
            self.recorder.counters.inc(CollectorCounters.cycles_held)
            return
        flight = self.flight.read(markers, now_ns) if self.flight is not None and markers else []
        closing = final
        while True:
            events = self.recorder.drain(limit)
            more = len(events) >= limit  # the buffer may hold more: this is not the last batch
            if markers:  # after the completed calls: a call that completed meanwhile comes next batch
                events += markers
                markers = []
            kernels = self._kernels.popleft() if self._kernels else []
            now = time.monotonic()
            if not events and not kernels and now - self._last_send < HEARTBEAT_S and not (final or closing):
                return
            cpu, stacks = list(self._cpu), self._stacks
            self._cpu.clear()
            self._stacks = []
            record = self.builder.build(events, self.recorder.dropped, kernels, cpu, stacks)
            if self._net:  # EventBatch v7
                record["net"] = list(self._net)
                self._net.clear()
            if flight:  # with the entry markers' batch (EventBatch v6)
                record["flight_records"], flight = flight, []
            if closing and not more and not self._kernels:
                record["final"] = True  # the last batch this process sends
            try:
                payload = self.encode(record)
            except Exception:  # e.g. the schema registry away: these events are lost, and counted
                self.recorder.lost(event_count(record))
                raise
            self.sink.send(self.key, payload, event_count(record))
            self._last_send = now
            self._last_slot = window_slot(self.wall(), self.config.batch_window_s)
            final = False
            if not more and not self._kernels:
                return

    def close(self, timeout_s: float) -> None:
        """Stop the thread, send what is left, wait for delivery at most ``timeout_s``. The
        tasks run once more only if the sender thread is not inside one (a task that blocks,
        as a profile summary once did on this thread, must not hold the training process's
        exit up); the final batch goes out either way (the send lock is never held by a task),
        and the thread sends nothing after it."""
        deadline = time.monotonic() + timeout_s
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(max(0.0, min(0.5, deadline - time.monotonic())))
        if self._tasks_lock.acquire(timeout=max(0.0, min(0.5, deadline - time.monotonic()))):
            try:
                self._run_tasks()
            finally:
                self._tasks_lock.release()
        else:
            self.recorder.counters.inc(CollectorCounters.exit_tasks_skipped)
            log.info("perftracker: the sender thread is busy in a task at exit; sending the last batch without it")
        self._send_cycle(final=True)
        left = self.sink.flush(deadline - time.monotonic())
        if left:
            counters = self.sink.counters
            lost = counters.events_in_flight
            self.recorder.lost(lost)
            counters.set(CollectorCounters.events_in_flight, 0)
            log.warning("perftracker: %d batches (%d events) undelivered at exit", left, lost)

    def bytes_per_s(self) -> float:
        """Encoded batch bytes delivered per second since start."""
        return self.sink.counters.sent_bytes / self._elapsed_s()

    def wire_bytes_per_s(self) -> float:
        """Bytes written to the brokers per second, from start to librdkafka's last statistics
        (-1 unknown: no broker, or no statistics yet)."""
        counters = self.sink.counters
        if counters.wire_bytes < 0:
            return -1.0
        return counters.wire_bytes / self._elapsed_s(self.sink.wire_at_ns)

    def wire_ratio(self) -> float:
        """Bytes on the wire per encoded batch byte delivered, up to the last statistics
        (compression, Kafka framing and metadata requests; -1 unknown)."""
        counters = self.sink.counters
        if counters.wire_bytes < 0 or counters.wire_base_bytes <= 0:
            return -1.0
        return counters.wire_bytes / counters.wire_base_bytes

    def _elapsed_s(self, until_ns: int | None = None) -> float:
        end = time.monotonic_ns() if until_ns is None else until_ns
        return max(1e-9, (end - self.started_ns) / 1e9)


def _merge_rows(a: list[StackRow],
                b: list[StackRow]) -> list[StackRow]:
    """Stack rows of two intervals that were not sent in between, counts added."""
    total: dict[tuple[str, int, int, str], int] = {}
    for name, line, kind, n, code in (*a, *b):
        total[(name, line, kind, code)] = total.get((name, line, kind, code), 0) + n
    return sorted(((k[0], k[1], k[2], n, k[3]) for k, n in total.items()), key=lambda r: -r[3])
