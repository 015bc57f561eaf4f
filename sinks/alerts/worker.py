"""Delivery to one channel: a bounded queue of per-incident lanes served by a few threads.

Notifications of one incident are delivered in order (one lane, one at a
time); different incidents go out in parallel, so a receiver that hangs on
one incident holds one thread for at most ``timeout_s`` per attempt and never
the others, and never the sink (``submit`` does not block: when the queue is
full the notification is dropped and counted). Failed attempts are retried
with exponential backoff and full jitter; 4xx answers (except 429) are not.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ...schemas.counters import Counter, CounterSet
from .base import Channel, DeliveryError, Event, HttpRequest, Notification
from .http import post

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeliveryPolicy:
    timeout_s: float = 5.0
    max_attempts: int = 12  # backoff 0.5 s doubling to 30 s, jittered: >= 90 s of retries in all
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    queue_size: int = 1000
    workers: int = 4

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [base*2^(n-1)/2, base*2^(n-1)], capped."""
        ceiling = min(self.retry_max_s, self.retry_base_s * (2 ** (attempt - 1)))
        return rng.uniform(ceiling / 2, ceiling)


class AlertCounters(CounterSet):
    """The alert dispatcher's counters and, per channel, its workers'."""

    component = "alerts"

    suppressed = Counter("updates not sent: within update_interval_s of the last one sent")
    skipped = Counter("records that need no notification: exact repeats, or below min_impact_ms_per_step")
    delivered = Counter("notifications delivered", labels=("channel",))
    failed = Counter("notifications given up on (every attempt failed, or a 4xx answer)",
                     labels=("channel",))
    retries = Counter("delivery attempts repeated after a failure", labels=("channel",))
    dropped = Counter("notifications dropped because the channel's queue was full", labels=("channel",))

    CHANNEL: ClassVar[tuple[Counter, ...]] = (delivered, failed, retries, dropped)  # per channel

    def of_channel(self, channel: str) -> dict[str, int]:
        """One channel's counters by name."""
        return {c.name: self.value(c, channel) for c in self.CHANNEL}


class ChannelWorker:
    def __init__(self, channel: Channel, policy: DeliveryPolicy, counters: AlertCounters,
                 send: Callable[[HttpRequest, float], int] = post):
        self.channel = channel
        self.policy = policy
        self.counters = counters
        self._send = send
        self._lanes: OrderedDict[str, deque[Notification]] = OrderedDict()
        self._busy: set[str] = set()
        self._size = 0
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._rng = random.Random()
        self._threads = [threading.Thread(target=self._serve, name=f"pt-alert-{channel.name}-{i}",
                                          daemon=True) for i in range(policy.workers)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, n: Notification) -> bool:
        with self._cv:
            lane = self._lanes.get(n.incident.incident_id)
            if lane and n.event is Event.UPDATE and lane[-1].event is Event.UPDATE:
                lane[-1] = n  # coalesce: only the newest update matters
                return True
            if self._size >= self.policy.queue_size:
                self.counters.inc(AlertCounters.dropped, self.channel.name)
                log.warning("alert queue of %s full; %s of %s dropped", self.channel.name,
                            n.event.value, n.incident.incident_id)
                return False
            self._lanes.setdefault(n.incident.incident_id, deque()).append(n)
            self._size += 1
            self._cv.notify()
            return True

    def _take(self) -> Notification | None:
        with self._cv:
            while not self._stop.is_set():
                for key, lane in self._lanes.items():
                    if key not in self._busy and lane:
                        self._busy.add(key)
                        self._size -= 1
                        return lane.popleft()
                self._cv.wait(0.5)
        return None

    def _done(self, key: str) -> None:
        with self._cv:
            self._busy.discard(key)
            if not self._lanes.get(key):
                self._lanes.pop(key, None)
            self._cv.notify_all()

    def _serve(self) -> None:
        while (n := self._take()) is not None:
            try:
                self._deliver(n)
            finally:
                self._done(n.incident.incident_id)

    def _deliver(self, n: Notification) -> None:
        for attempt in range(1, self.policy.max_attempts + 1):
            try:
                self._send(self.channel.request(n), self.policy.timeout_s)
                self.counters.inc(AlertCounters.delivered, self.channel.name)
                return
            except DeliveryError as exc:
                last = exc
                if not exc.retryable or attempt == self.policy.max_attempts:
                    break
                self.counters.inc(AlertCounters.retries, self.channel.name)
                if self._stop.wait(self.policy.backoff_s(attempt, self._rng)):
                    break
        self.counters.inc(AlertCounters.failed, self.channel.name)
        log.warning("alert %s of incident %s to %s failed: %s", n.event.value,
                    n.incident.incident_id, self.channel.name, last)

    def pending(self) -> int:
        with self._cv:
            return self._size + len(self._busy)

    def drain(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.pending()

    def stop(self, timeout_s: float = 2.0) -> None:
        self.drain(timeout_s)
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=0.5)
