"""Prometheus Alertmanager, API v2: ``POST <url>/api/v2/alerts`` with a JSON list of one alert.

Alertmanager then routes, groups, silences, inhibits and pages; this channel only says
which incidents are firing. It behaves as Prometheus does towards Alertmanager:

* **identity**: the labels are the alert's identity (Alertmanager's fingerprint). They
  are fixed at the first notification of an incident (``alertname``
  ``PerftrackerIncident``, ``training_job``, ``incident_id``, ``cause``, ``kind``,
  ``severity``, ``host``, ``ranks``) and reused for every later post of that incident,
  so an update that changes its ranks or its cost is the same alert, never a second
  one; the current values are in the annotations. (``training_job``, not ``job``:
  Prometheus's target label ``job`` would collide with it in routes and inhibitions.)
* **firing**: ``startsAt`` is the incident's ``first_seen``; ``endsAt`` is now + 4 ×
  ``resend_s``, and the dispatcher posts every open incident again every ``resend_s``
  (Prometheus: resend delay 1 m, ``endsAt`` = 4 × that ahead). An incident whose sink
  died is so resolved by Alertmanager itself after 4 missed resends, never stuck firing.
* **resolved**: the same labels with ``endsAt`` = now (a past ``endsAt`` is how a v2
  client resolves); Alertmanager sends the resolved notification.
* annotations: ``summary``, ``description`` (who, what, why, how much), ``dashboard``
  (the Grafana job view over the incident's time range), ``time_range``, ``report`` (the
  command that writes the HTML report), ``resolved_reason``; ``generatorURL`` is the
  dashboard link.

Several Alertmanagers of one HA cluster: one channel per URL, each sent every alert (the
cluster deduplicates notifications), as Prometheus does.
"""

from __future__ import annotations

import base64
import json
import shlex
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

from ...schemas.causes import CAUSES, Cause
from ...schemas.settings import Secret
from ...schemas.vocabulary import Kind
from .base import Event, HttpRequest, Incident, Notification
from .pagerduty import severity

ALERTNAME = "PerftrackerIncident"
API_PATH = "/api/v2/alerts"
ENDS_AFTER_RESENDS = 4  # endsAt of a firing alert: this many resend intervals ahead (Prometheus's factor)
MAX_TRACKED = 10_000
MARGIN_MS = 5 * 60_000  # the dashboard link shows 5 minutes either side of the incident
MAX_HOSTS = 8


def alerts_url(base: str) -> str:
    """``http://am:9093`` (or with a route prefix) -> ``http://am:9093/api/v2/alerts``."""
    base = base.strip().rstrip("/")
    return base if base.endswith(API_PATH) else base + API_PATH


def compact_ranks(ranks: Iterable[int], max_runs: int = 16) -> str:
    """``[0, 1, 2, 3, 8, 10, 11]`` -> ``"0-3,8,10-11"``; past ``max_runs`` runs, ``"…+N"`` ranks more."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:max_runs])
    if len(runs) > max_runs:
        text += f",…+{sum(b - a + 1 for a, b in runs[max_runs:])}"
    return text


def compact_hosts(hosts: Iterable[str]) -> str:
    unique = sorted(set(hosts))
    text = ",".join(unique[:MAX_HOSTS])
    return text + (f",…+{len(unique) - MAX_HOSTS}" if len(unique) > MAX_HOSTS else "")


def incident_severity(i: Incident) -> str:
    """PagerDuty's severity by the share of the step (critical, error, warning); a hang is critical."""
    if i.kind == Kind.HANG.value or i.cause == Cause.HANG.value:
        return "critical"
    return severity(i.impact_ms_per_step, i.step_time_ms)


def labels_of(i: Incident) -> dict[str, str]:
    """The alert's labels from ``i`` (empty values left out: Alertmanager treats them as absent)."""
    labels = {"alertname": ALERTNAME, "training_job": i.job, "incident_id": i.incident_id,
              "cause": i.cause, "kind": i.kind, "severity": incident_severity(i),
              "host": compact_hosts(i.hosts), "ranks": compact_ranks(i.ranks)}
    return {k: v for k, v in labels.items() if v}


def _rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def dashboard_link(n: Notification, now: datetime) -> str:
    """The Grafana job view from 5 minutes before the incident to 5 after it (``now`` while open)."""
    if not n.dashboard_url:
        return ""
    i = n.incident
    start = _ms(i.first_seen) - MARGIN_MS
    end = str(max(_ms(i.last_seen), _ms(now)) + MARGIN_MS) if n.event is Event.RESOLVE else "now"
    return (f"{n.dashboard_url.rstrip('/')}/d/perftracker-job/perftracker-job"
            f"?var-job={quote(i.job)}&from={start}&to={end}")


def cause_title(cause: str) -> str:
    """``slow_dataloader`` -> ``Slow data loader`` (an unknown cause: its id)."""
    words = CAUSES.get(Cause(cause)) if cause in Cause._value2member_map_ else None
    return words.title if words else cause


def description(i: Incident) -> str:
    """Who, what, why, how much (and, resolved, why it ended)."""
    title = cause_title(i.cause)
    share = f" ({100 * i.impact_ms_per_step / i.step_time_ms:.0f}% of a {i.step_time_ms:.1f} ms step)" \
        if i.step_time_ms > 0 else ""
    text = (f"{title} in training job {i.job}. Who: {i.who()}. What: {i.kind} in {i.function}. "
            f"Why: {i.summary}. Cost: {i.impact_ms_per_step:.1f} ms per step{share}.")
    if i.resolved_reason:
        text += f" Resolved: {i.resolved_reason}."
    return text


class AlertmanagerChannel:
    """One Alertmanager. ``resend_s``: how often the dispatcher posts an open incident again."""

    def __init__(self, url: str, username: str = "", password: Secret | None = None,
                 bearer_token: Secret | None = None, resend_s: float = 60.0, name: str = "alertmanager",
                 clock: Callable[[], float] = time.time):
        self.name = name
        self.url = alerts_url(url)
        self.resend_s = float(resend_s)
        self._clock = clock
        self._auth: Secret | None = None
        if bearer_token:
            self._auth = Secret("Bearer " + bearer_token.reveal())
        elif username:
            pw = password.reveal() if password else ""
            self._auth = Secret("Basic " + base64.b64encode(f"{username}:{pw}".encode()).decode())
        self._labels: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._open: OrderedDict[str, tuple[Notification, Hashable]] = OrderedDict()
        self._lock = threading.Lock()

    def labels(self, i: Incident) -> dict[str, str]:
        """``i``'s labels, the same for every post of the incident (fixed at its first)."""
        with self._lock:
            labels = self._labels.get(i.incident_id)
            if labels is None:
                labels = self._labels[i.incident_id] = labels_of(i)
                while len(self._labels) > MAX_TRACKED:
                    self._labels.popitem(last=False)
            return labels

    def alert(self, n: Notification) -> dict:
        i = n.incident
        now = datetime.fromtimestamp(self._clock(), tz=timezone.utc)
        if n.event is Event.RESOLVE:
            ends = max(now, i.first_seen)  # past: resolved (never before startsAt, which Alertmanager refuses)
        else:
            ends = now + timedelta(seconds=ENDS_AFTER_RESENDS * self.resend_s)
        link = dashboard_link(n, now)
        annotations = {
            "summary": f"{i.job}: {cause_title(i.cause)} on {i.who()} costs {i.impact_ms_per_step:.1f} ms per step",
            "description": description(i),
            "dashboard": link,
            "time_range": f"{_rfc3339(i.first_seen)} to "
                          + (_rfc3339(i.last_seen) if n.event is Event.RESOLVE else "now"),
            "report": f"perftracker report --job {shlex.quote(i.job)} --out report.html",
            "function": i.function,
            "impact_ms_per_step": f"{i.impact_ms_per_step:.1f}",
            "resolved_reason": i.resolved_reason,
        }
        alert: dict = {"labels": self.labels(i), "annotations": {k: v for k, v in annotations.items() if v},
                       "startsAt": _rfc3339(i.first_seen), "endsAt": _rfc3339(ends)}
        if link:
            alert["generatorURL"] = link
        return alert

    def request(self, n: Notification) -> HttpRequest:
        headers = {"Authorization": self._auth.reveal()} if self._auth else {}
        return HttpRequest(self.url, json.dumps([self.alert(n)]).encode(), headers)

    # --- firing incidents, posted again every resend_s (the dispatcher's resend thread) ---------

    def track(self, n: Notification, source: Hashable = None) -> None:
        """Remember ``n`` as its incident's latest (``source``: where its record came from, for
        :meth:`release`); a resolution forgets the incident (its labels stay, for the resolution and a reopening)."""
        with self._lock:
            key = n.incident.incident_id
            self._open.pop(key, None)
            if n.event is not Event.RESOLVE:
                self._open[key] = (n, source)
                while len(self._open) > MAX_TRACKED:
                    self._open.popitem(last=False)

    def due(self) -> list[Notification]:
        """The open incidents to post again (as updates: the worker coalesces them with a queued one)."""
        with self._lock:
            return [Notification(n.incident, Event.UPDATE, n.dashboard_url) for n, _ in self._open.values()]

    def release(self, sources: Iterable[Hashable]) -> int:
        """Stop posting the incidents whose records came from ``sources`` (partitions this sink no
        longer owns: their new owner tracks them); return how many."""
        gone = set(sources)
        with self._lock:
            keys = [k for k, (_, src) in self._open.items() if src in gone]
            for k in keys:
                del self._open[k]
            return len(keys)

    def firing(self) -> int:
        with self._lock:
            return len(self._open)
