"""The per-host relay, rank side: a rank hands its encoded messages to the relay of its host.

A job of 8 ranks per host sends 8 Kafka messages per host each flush interval, each with
Faust's and aiokafka's per-message cost at the stream worker (docs/benchmarks.md, "What
bounds it"). With ``relay_socket`` set (``PERFTRACKER_COLLECTOR_RELAY_SOCKET``, or
``perftracker launch --relay``), the rank's sender writes each message as one datagram to
the relay of its host (:mod:`.relay_server`, ``perftracker relay``) over a Unix datagram
socket, and the relay sends the host's messages of one job and topic as one
:mod:`RecordBundle <..schemas.bundle>` (the worker reads each item as the message it would
have been).

**Never blocks, never loses silently.** The socket is non-blocking: a relay that is not
running (no socket, nobody bound), whose queue is full, or a message larger than a datagram
may be, and the message goes to Kafka directly through the producer the rank would have used
without a relay (made on first need; ``relay_fallbacks`` counts those messages). A message
the relay has taken counts as sent for the rank (``batches_relayed`` too); from there the relay
counts its own deliveries and losses (:class:`.relay_server.RelayCounters`).

Datagram: ``b"PTR1"``, the topic's and the key's lengths (two little-endian u16), the topic,
the key, the message (:func:`frame`, :func:`parse_frame`).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

from .counters import CollectorCounters
from .safety import ErrorBudget
from .transport import BatchSink, count_sent

MAGIC = b"PTR1"
_HEAD = struct.Struct("<4sHH")
SNDBUF_BYTES = 1 << 20  # asked for; the kernel caps it (net.core.wmem_max) and so a datagram's size


class FrameError(ValueError):
    """A datagram that is not a relay frame."""


def frame(topic: str, key: bytes, payload: bytes) -> bytes:
    t = topic.encode()
    return _HEAD.pack(MAGIC, len(t), len(key)) + t + key + payload


def parse_frame(data: bytes) -> tuple[str, bytes, bytes]:
    """(topic, key, message) of a datagram; :class:`FrameError` naming the problem."""
    if len(data) < _HEAD.size:
        raise FrameError(f"relay frame of {len(data)} bytes is shorter than its {_HEAD.size}-byte header")
    magic, tlen, klen = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise FrameError(f"relay frame starts with {magic!r}, not {MAGIC!r}")
    start = _HEAD.size
    if start + tlen + klen > len(data) or tlen == 0:
        raise FrameError(f"relay frame of {len(data)} bytes cannot hold a topic of {tlen} and a key of {klen} bytes")
    try:
        topic = data[start:start + tlen].decode()
    except UnicodeDecodeError as exc:
        raise FrameError(f"relay frame's topic is not UTF-8: {exc}") from exc
    return topic, data[start + tlen:start + tlen + klen], data[start + tlen + klen:]


class RelaySink:
    """The sender's sink with a relay: each message to the relay's socket, else to Kafka directly
    (see the module docstring). ``direct`` makes the direct sink on first need."""

    def __init__(self, path: str, topic: str, counters: CollectorCounters, direct: Callable[[], BatchSink],
                 errors: ErrorBudget):
        self.path, self.topic, self.counters = path, topic, counters
        self._make_direct = direct
        self._direct: BatchSink | None = None
        self._errors = errors
        self.wire_at_ns = 0  # the direct producer's, once there is one (wire bytes: its own only)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
        except OSError:
            pass

    def _relay(self, topic: str, key: bytes, payload: bytes) -> bool:
        try:
            self.sock.sendto(frame(topic, key, payload), self.path)
            return True
        except OSError:  # not running, queue full, too large for a datagram: Kafka directly
            self.counters.inc(CollectorCounters.relay_fallbacks)
            return False
        except Exception as exc:  # noqa: BLE001 - never into training
            self._errors.caught("relay", exc)
            return False

    def direct(self) -> BatchSink:
        if self._direct is None:
            self._direct = self._make_direct()
        return self._direct

    def send(self, key: bytes, payload: bytes, n_events: int) -> None:
        if self._relay(self.topic, key, payload):
            self.counters.inc(CollectorCounters.batches_relayed)
            count_sent(self.counters, n_events, len(payload))
        else:
            self.direct().send(key, payload, n_events)

    def send_to(self, topic: str, key: bytes, payload: bytes) -> None:
        if not self._relay(topic, key, payload):
            sink = self.direct()
            send_to = getattr(sink, "send_to", None)
            if send_to is not None:
                send_to(topic, key, payload)
            else:
                self.counters.inc(CollectorCounters.batches_failed)

    def poll(self) -> None:
        if self._direct is not None:
            self._direct.poll()
            self.wire_at_ns = self._direct.wire_at_ns

    def flush(self, timeout_s: float) -> int:
        """Messages still queued for Kafka (those handed to the relay are the relay's)."""
        return self._direct.flush(timeout_s) if self._direct is not None else 0

    def close(self) -> None:
        self.sock.close()
