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
incident by its id: webhook ``dedup_key``, Slack metadata, PagerDuty ``dedup_key``,
Alertmanager labels); ``submit`` never blocks the sink. Channels that must hear of a
firing incident again and again (:class:`Resending`: Alertmanager, whose alerts expire)
are sent every open incident again every ``resend_s`` by one thread.

Remediation (:mod:`.remediator`, off by default): a hook beside the channels, told of every
incident record decided here and whether the incident is open, so it acts only on what this
lifecycle has open (confirmed by persistence, not a replay of a resolved one) and drops what
resolves before it is confirmed; it never blocks ``submit`` either.

Who pages (:func:`build_channels`): with Alertmanager configured, Alertmanager does
(routing, grouping, silences, inhibition), and the sink's own Slack and PagerDuty
channels, the fallback for teams without one, are not built: an incident never pages twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ...schemas.settings import AlertSettings
from ...schemas.vocabulary import Status, is_advice
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


@runtime_checkable
class Resending(Protocol):
    """A channel told again of every firing incident every ``resend_s`` (see :mod:`.alertmanager`)."""

    resend_s: float

    def track(self, n: Notification, source: Hashable = None) -> None: ...

    def due(self) -> list[Notification]: ...

    def release(self, sources: Iterable[Hashable]) -> int: ...


@runtime_checkable
class Remediation(Protocol):
    """A hook told of each incident the dispatcher decided about (:class:`.remediator.Remediator`)."""

    def observe(self, incident: Incident, is_open: bool, source: Hashable = None) -> None: ...

    def release(self, sources: Iterable[Hashable]) -> int: ...

    def start(self) -> None: ...

    def stop(self, timeout_s: float = 2.0) -> None: ...

    def stats(self) -> dict: ...


class AlertDispatcher:
    def __init__(self, channels: list[Channel], policy: AlertPolicy | None = None,
                 remediator: Remediation | None = None):
        self.policy = policy or AlertPolicy()
        self.remediator = remediator
        self.counters = AlertCounters()
        self.workers = [ChannelWorker(c, self.policy.delivery, self.counters) for c in channels]
        self._incidents: OrderedDict[str, _Tracked] = OrderedDict()
        self._resending = [w for w in self.workers if isinstance(w.channel, Resending) and w.channel.resend_s > 0]
        self._lock = threading.Lock()  # a resend never overtakes the resolution it raced with
        self._stop = threading.Event()
        self._resender: threading.Thread | None = None

    @property
    def suppressed(self) -> int:
        return self.counters.suppressed

    @property
    def skipped(self) -> int:
        return self.counters.skipped

    def start(self) -> None:
        for w in self.workers:
            w.start()
        if self.remediator is not None:
            self.remediator.start()
        if self._resending:
            self._resender = threading.Thread(target=self._resend, name="pt-alert-resend", daemon=True)
            self._resender.start()

    def submit(self, record: dict, source: Hashable = None) -> Event | None:
        """Decide what ``record`` (an Anomaly) means to people and queue it; return the event sent.
        ``source``: where the record came from (the sink's topic and partition), for :meth:`release`."""
        if not self.workers and self.remediator is None:
            return None
        if is_advice(record):  # the job's shape (schemas.causes.SHAPE): stored and shown, never paged
            self.counters.inc(AlertCounters.skipped)
            return None
        incident = Incident.from_anomaly(record)
        event = self._decide(incident, time.monotonic())
        if self.remediator is not None:
            tracked = self._incidents.get(incident.incident_id)
            self.remediator.observe(incident, bool(tracked and tracked.opened), source)
        if event is None:
            return None
        n = Notification(incident, event, self.policy.dashboard_url)
        with self._lock:
            for w in self.workers:
                if isinstance(w.channel, Resending):
                    w.channel.track(n, source)
                w.submit(n)
        return event

    def _resend(self) -> None:
        """Every ``resend_s`` (the shortest of the channels'), each open incident again."""
        period = min(w.channel.resend_s for w in self._resending)  # type: ignore[attr-defined]
        while not self._stop.wait(period):
            for w in self._resending:
                with self._lock:
                    for n in w.channel.due():  # type: ignore[attr-defined]
                        w.submit(n)

    def release(self, sources: Iterable[Hashable]) -> int:
        """Stop re-sending the incidents whose records came from ``sources`` (partitions revoked
        from this sink: the new owner sends them); return how many, over every channel."""
        sources = list(sources)
        if self.remediator is not None:
            self.remediator.release(sources)
        return sum(w.channel.release(sources) for w in self._resending)  # type: ignore[attr-defined]

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
        self._stop.set()
        if self._resender is not None:
            self._resender.join(timeout=1.0)
        for w in self.workers:
            w.stop(timeout_s)
        if self.remediator is not None:
            self.remediator.stop(timeout_s)

    def stats(self) -> dict:
        return {"suppressed": self.suppressed, "skipped": self.skipped,
                **{w.channel.name: self.counters.of_channel(w.channel.name) for w in self.workers},
                **({"remediation": self.remediator.stats()} if self.remediator is not None else {})}


def alertmanager_urls(s: AlertSettings) -> list[str]:
    return [u.strip() for u in s.alertmanager_urls.split(",") if u.strip()]


def build_channels(s: AlertSettings) -> list[Channel]:
    """The configured channels. With Alertmanager URLs set, one Alertmanager channel per URL
    (an HA cluster: each gets every alert) and no Slack or PagerDuty channel: Alertmanager
    pages, and the sink's own paging channels would page the same incident again."""
    from .alertmanager import AlertmanagerChannel
    from .pagerduty import PagerDutyChannel
    from .slack import SlackChannel
    from .webhook import WebhookChannel

    channels: list[Channel] = []
    if s.webhook_url:
        channels.append(WebhookChannel(s.webhook_url, s.webhook_secret))
    urls = alertmanager_urls(s)
    for k, url in enumerate(urls):
        channels.append(AlertmanagerChannel(
            url, s.alertmanager_username, s.alertmanager_password, s.alertmanager_bearer_token,
            s.alertmanager_resend_s, name="alertmanager" if len(urls) == 1 else f"alertmanager-{k + 1}"))
    paging = [name for name, on in (("alerts.slack_webhook_url", bool(s.slack_webhook_url)),
                                    ("alerts.pagerduty_routing_key", bool(s.pagerduty_routing_key))) if on]
    if urls and paging:
        log.warning("alerts.alertmanager_urls is set: Alertmanager pages, so %s (the sink's own paging, "
                    "for teams without Alertmanager) is not used; route to Slack or PagerDuty in "
                    "Alertmanager's configuration", " and ".join(paging))
        return channels
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
