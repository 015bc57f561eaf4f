"""The per-host relay (``perftracker relay``): the messages of a host's ranks, one Kafka message
per job and topic each flush.

The ranks of a host write their messages as datagrams to the relay's Unix socket
(:mod:`.relay`). :class:`RelayBuffer` (pure: no socket, no Kafka) groups them by topic and job
(the job is the rank's key up to its last ``|``) and hands a group on ``linger_s`` after its
first message, or at once when it holds :data:`..schemas.bundle.MAX_BYTES`; :func:`serve` sends
each group as RecordBundles (:func:`..schemas.bundle.bundled`) keyed ``<job>|relay:<host>``, so
a host's ranks of one job share a partition and each rank's messages stay in order.

**What it costs.** Latency: ``linger_s`` at most (default 0.2 s, a fifth of the collectors'
flush interval: the ranks' sends of one cycle are spread over a tenth of it,
``transport.FLUSH_SPREAD``, so one group holds every rank's message of the cycle). Memory:
the messages of one linger, bounded by ``max_buffer_bytes`` (default 64 MB; past it a
datagram is dropped and counted, ``frames_dropped``) plus the producer's queue (16 MB, as a
rank's). CPU: a datagram read and a bundle written per message, no decoding.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..schemas import bundle
from ..schemas.counters import Counter, CounterSet
from ..schemas.errors import ConfigError
from .relay import FrameError, parse_frame

log = logging.getLogger(__name__)

LINGER_S = 0.2
MAX_DATAGRAM = 4 << 20  # read buffer: a rank's datagram is at most its socket's send buffer (the kernel's wmem_max)
MAX_BUFFER_BYTES = 64 << 20
RCVBUF_BYTES = 8 << 20  # asked for: a burst of a host's ranks while the relay sends


class RelayCounters(CounterSet):
    component = "relay"

    frames_in = Counter("messages received from the host's ranks")
    frames_bad = Counter("datagrams that are not relay frames, dropped")
    frames_dropped = Counter("messages dropped: the relay's buffer was full (max_buffer_bytes)")
    messages_out = Counter("Kafka messages (bundles, or a lone message) the brokers acknowledged")
    frames_out = Counter("ranks' messages in the Kafka messages the brokers acknowledged")
    messages_failed = Counter("Kafka messages not delivered (producer queue full, broker away past "
                              "message.timeout.ms)")
    frames_failed = Counter("ranks' messages in those")


@dataclass
class Group:
    """The messages of one topic and job waiting for their send."""

    items: list[bytes] = field(default_factory=list)
    size: int = 0
    first_s: float = 0.0


Send = tuple[str, str, list[bytes]]  # (topic, Kafka key, the ranks' messages in order)


class RelayBuffer:
    """The relay's waiting messages (see the module docstring); pure, on the caller's clock."""

    def __init__(self, host: str, linger_s: float = LINGER_S, max_buffer_bytes: int = MAX_BUFFER_BYTES,
                 counters: RelayCounters | None = None):
        self.host, self.linger_s, self.max_buffer_bytes = host, linger_s, max_buffer_bytes
        self.counters = counters or RelayCounters()
        self.groups: dict[tuple[str, str], Group] = {}
        self.size = 0

    def add(self, datagram: bytes, now_s: float) -> None:
        try:
            topic, key, payload = parse_frame(datagram)
            job = key.decode().rsplit("|", 1)[0]
        except (FrameError, UnicodeDecodeError) as exc:
            self.counters.inc(RelayCounters.frames_bad)
            log.warning("relay: dropped a datagram: %s", exc)
            return
        self.counters.inc(RelayCounters.frames_in)
        if self.size + len(payload) > self.max_buffer_bytes:
            self.counters.inc(RelayCounters.frames_dropped)
            return
        group = self.groups.get((topic, job))
        if group is None:
            group = self.groups[(topic, job)] = Group(first_s=now_s)
        group.items.append(payload)
        group.size += len(payload)
        self.size += len(payload)

    def due(self, now_s: float, flush: bool = False) -> list[Send]:
        """The groups to send now (``flush``: every one), taken out of the buffer."""
        out: list[Send] = []
        for (topic, job), group in list(self.groups.items()):
            if flush or now_s - group.first_s >= self.linger_s or group.size >= bundle.MAX_BYTES:
                del self.groups[(topic, job)]
                self.size -= group.size
                out.append((topic, f"{job}|relay:{self.host}", group.items))
        return out

    def next_due_s(self, now_s: float) -> float:
        """Seconds until the earliest group is due (``linger_s`` with none waiting)."""
        if not self.groups:
            return self.linger_s
        return max(0.0, min(g.first_s for g in self.groups.values()) + self.linger_s - now_s)


def bind(path: str) -> socket.socket:
    """The relay's socket at ``path``. A stale socket file there (a relay that died without
    removing it) is replaced; anything else there is left alone and refused with a
    :class:`ConfigError` naming it: a file that is not a socket (a mistyped path must not delete
    it), or a socket another relay still serves (two relays would each take some of the ranks'
    messages, and the first to stop would remove the other's socket)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise ConfigError(f"the relay's socket path {path} is taken by a file that is not a socket; "
                              "not replaced: remove it or choose another --socket")
        if serving(path):
            raise ConfigError(f"another relay serves {path}: stop it first or choose another --socket")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    except OSError:
        pass
    sock.bind(path)
    os.chmod(path, 0o660)  # the ranks run as the relay's user or group
    return sock


def serving(path: str) -> bool:
    """Whether a process reads the datagram socket at ``path`` (connecting to a socket file whose
    relay died is refused)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def receive(sock: socket.socket, buf: RelayBuffer) -> None:
    """One datagram into ``buf``; one cut short by the read buffer is dropped and counted as bad
    (OSError, BlockingIOError or TimeoutError when there is none)."""
    data, _, flags, _ = sock.recvmsg(MAX_DATAGRAM)
    if flags & socket.MSG_TRUNC:
        buf.counters.inc(RelayCounters.frames_bad)
        log.warning("relay: dropped a datagram larger than %d bytes", MAX_DATAGRAM)
        return
    buf.add(data, time.monotonic())


def make_producer(conf: Mapping[str, str]) -> Any:
    from confluent_kafka import Producer

    from ..schemas.kafka_admin import quiet_kafka_logger
    from .transport import PRODUCER_CONF
    return Producer({**conf, **PRODUCER_CONF, "linger.ms": 5,
                     "logger": quiet_kafka_logger("perftracker_ml.relay.librdkafka")})


def send_groups(producer: Any, groups: list[Send], counters: RelayCounters) -> None:
    """Produce each group as bundles; deliveries and losses counted per message and per item."""
    for topic, key, items in groups:
        for message, n in bundle.bundled_counted(items):
            def delivered(err: object, _msg: object, n: int = n) -> None:
                if err is None:
                    counters.inc(RelayCounters.messages_out)
                    counters.inc(RelayCounters.frames_out, by=n)
                else:
                    counters.inc(RelayCounters.messages_failed)
                    counters.inc(RelayCounters.frames_failed, by=n)
            try:
                producer.produce(topic, message, key.encode(), on_delivery=delivered)
            except BufferError:
                delivered("producer queue full", None)
    producer.poll(0)


def serve(path: str, conf: Mapping[str, str], host: str, linger_s: float = LINGER_S,
          max_buffer_bytes: int = MAX_BUFFER_BYTES, stop: Callable[[], bool] | None = None,
          counters: RelayCounters | None = None) -> RelayCounters:
    """Run the relay on ``path`` until SIGTERM/SIGINT (or ``stop()``); what is waiting is sent and
    delivered (up to 10 s) before it returns its counters."""
    buf = RelayBuffer(host, linger_s, max_buffer_bytes, counters)
    producer = make_producer(conf)
    sock = bind(path)
    mine = os.stat(path).st_ino  # the socket file this relay made
    stopping = [False]

    def on_signal(signum: int, _frame: object) -> None:
        stopping[0] = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    log.info("relay on %s for host %s (linger %.2f s)", path, host, linger_s)
    try:
        while not stopping[0] and not (stop is not None and stop()):
            sock.settimeout(max(0.001, buf.next_due_s(time.monotonic())))
            try:
                receive(sock, buf)
                sock.setblocking(False)
                while True:  # what else is queued, without waiting
                    receive(sock, buf)
            except (BlockingIOError, TimeoutError, InterruptedError):
                pass
            send_groups(producer, buf.due(time.monotonic()), buf.counters)
    finally:
        try:
            if os.stat(path).st_ino == mine:  # not a socket another relay made there since
                os.unlink(path)  # the ranks send to Kafka directly from here on
        except OSError:
            pass
        sock.setblocking(False)
        try:
            while True:  # what the ranks sent before that
                receive(sock, buf)
        except OSError:
            pass
        sock.close()
        send_groups(producer, buf.due(time.monotonic(), flush=True), buf.counters)
        producer.flush(10.0)
    return buf.counters
