"""Incident lifecycle and fan-out to the configured channels (faust "sensors" style).

From the stream of Anomaly records (OPEN, UPDATED, RESOLVED; re-sent and
possibly replayed) the dispatcher decides what to tell people:

* the first record of an incident costing at least ``min_impact_ms_per_step``
  opens it (sent as ``open``);
* later records of an open incident are ``update`` s, at most one per
  ``update_interval_s`` per incident (rate limit; the rest are counted);
* RESOLVED sends ``resolve`` once per incident (also for an incident this process
  never saw open, e.g. after a restart, when it is costly enough to have paged); a
  later RESOLVED of an incident already resolved (a replay, another last_seen, the job
  end after the incident cleared) is skipped until the incident opens again;
* an OPEN or UPDATED of a resolved incident opens it again only when it saw data after
  the resolution (its ``last_seen`` later than the resolution's): one no later is a
  replay of its history -- a stream worker that took over a dead one's partitions
  re-reads them from the last committed offsets and sends the incident's OPEN and
  RESOLVED again (seen as ``open, resolve, open, resolve`` for one incident in
  tests/integration/faults/test_worker_kill.py under load);
* an exact repeat (same incident, status and last_seen) is ignored.

Each notification goes to every channel's :class:`ChannelWorker` (each keys the
incident by its id: webhook ``dedup_key``, Slack metadata, PagerDuty ``dedup_key``);
``submit`` never blocks the sink.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from ...schemas.settings import AlertSettings
from ...schemas.vocabulary import Status
from .base import Channel, Event, Incident, Notification
from .worker import AlertCounters, ChannelWorker, DeliveryPolicy

log = logging.getLogger(__name__)

MAX_TRACKED = 10_000


@dataclass(frozen=True)
class AlertPolicy:
    min_impact_ms_per_step: float = 0.0
    update_interval_s: float = 300.0
    dashboard_url: str = ""
    delivery: DeliveryPolicy = DeliveryPolicy()


@dataclass
class _Tracked:
    opened: bool
    last_key: tuple[str, float]
    last_sent: float
    resolved_seen: float | None = None  # the latest last_seen of its RESOLVED records (None: never resolved)


class AlertDispatcher:
    def __init__(self, channels: list[Channel], policy: AlertPolicy | None = None):
        self.policy = policy or AlertPolicy()
        self.counters = AlertCounters()
        self.workers = [ChannelWorker(c, self.policy.delivery, self.counters) for c in channels]
        self._incidents: OrderedDict[str, _Tracked] = OrderedDict()

    @property
    def suppressed(self) -> int:
        return self.counters.suppressed

    @property
    def skipped(self) -> int:
        return self.counters.skipped

    def start(self) -> None:
        for w in self.workers:
            w.start()

    def submit(self, record: dict) -> Event | None:
        """Decide what ``record`` (an Anomaly) means to people and queue it; return the event sent."""
        if not self.workers:
            return None
        incident = Incident.from_anomaly(record)
        event = self._decide(incident, time.monotonic())
        if event is None:
            return None
        n = Notification(incident, event, self.policy.dashboard_url)
        for w in self.workers:
            w.submit(n)
        return event

    def _decide(self, i: Incident, now: float) -> Event | None:
        key = (i.status, i.last_seen.timestamp())
        tracked = self._incidents.get(i.incident_id)
        if tracked and tracked.last_key == key:
            self.counters.inc(AlertCounters.skipped)
            return None
        if i.status == Status.RESOLVED:
            if tracked and not tracked.opened:  # resolved already: once per incident
                tracked.resolved_seen = max(tracked.resolved_seen or key[1], key[1])
                self.counters.inc(AlertCounters.skipped)
                return None
            was_open = bool(tracked and tracked.opened)
            self._track(i.incident_id, _Tracked(False, key, now, key[1]))
            if was_open or (tracked is None and i.impact_ms_per_step >= self.policy.min_impact_ms_per_step):
                return Event.RESOLVE
            return None
        if tracked is not None and not tracked.opened and tracked.resolved_seen is not None \
                and key[1] <= tracked.resolved_seen:  # a replay of what came before its resolution
            self.counters.inc(AlertCounters.skipped)
            return None
        if tracked is None or not tracked.opened:
            if i.impact_ms_per_step < self.policy.min_impact_ms_per_step:
                self.counters.inc(AlertCounters.skipped)
                return None
            self._track(i.incident_id, _Tracked(True, key, now))
            return Event.OPEN
        tracked.last_key = key
        if now - tracked.last_sent < self.policy.update_interval_s:
            self.counters.inc(AlertCounters.suppressed)
            return None
        tracked.last_sent = now
        return Event.UPDATE

    def _track(self, incident_id: str, t: _Tracked) -> None:
        self._incidents.pop(incident_id, None)
        self._incidents[incident_id] = t
        while len(self._incidents) > MAX_TRACKED:
            self._incidents.popitem(last=False)

    def drain(self, timeout_s: float = 5.0) -> bool:
        return all(w.drain(timeout_s) for w in self.workers)

    def stop(self, timeout_s: float = 2.0) -> None:
        for w in self.workers:
            w.stop(timeout_s)

    def stats(self) -> dict:
        return {"suppressed": self.suppressed, "skipped": self.skipped,
                **{w.channel.name: self.counters.of_channel(w.channel.name) for w in self.workers}}


def build_channels(s: AlertSettings) -> list[Channel]:
    from .pagerduty import PagerDutyChannel
    from .slack import SlackChannel
    from .webhook import WebhookChannel

    channels: list[Channel] = []
    if s.webhook_url:
        channels.append(WebhookChannel(s.webhook_url, s.webhook_secret))
    if s.slack_webhook_url:
        channels.append(SlackChannel(s.slack_webhook_url))
    if s.pagerduty_routing_key:
        channels.append(PagerDutyChannel(s.pagerduty_routing_key, s.pagerduty_url))
    return channels


def build_dispatcher(s: AlertSettings) -> AlertDispatcher:
    delivery = DeliveryPolicy(
        timeout_s=s.timeout_s, max_attempts=s.max_attempts, retry_base_s=s.retry_base_s,
        queue_size=s.queue_size, workers=s.workers_per_channel)
    policy = AlertPolicy(s.min_impact_ms_per_step, s.update_interval_s, s.dashboard_url, delivery)
    return AlertDispatcher(build_channels(s), policy)
