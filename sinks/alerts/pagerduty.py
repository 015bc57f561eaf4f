"""PagerDuty Events API v2: trigger on open/update, resolve on clear, ``dedup_key`` = incident id."""

from __future__ import annotations

import json

from ...schemas.settings import Secret
from .base import Event, HttpRequest, Notification

SEVERITY_MS = ((100.0, "critical"), (10.0, "error"), (0.0, "warning"))


def severity(impact_ms_per_step: float, step_time_ms: float) -> str:
    """Severity from the share of the step the incident costs (>=50% critical, >=10% error)."""
    if step_time_ms > 0:
        share = impact_ms_per_step / step_time_ms
        return "critical" if share >= 0.5 else "error" if share >= 0.1 else "warning"
    return next(s for ms, s in SEVERITY_MS if impact_ms_per_step >= ms)


class PagerDutyChannel:
    name = "pagerduty"

    def __init__(self, routing_key: Secret, url: str):
        self._routing_key = routing_key
        self.url = url

    def request(self, n: Notification) -> HttpRequest:
        i = n.incident
        body: dict = {"routing_key": self._routing_key.reveal(), "dedup_key": i.dedup_key}
        if n.event is Event.RESOLVE:
            body["event_action"] = "resolve"  # Events API v2: a resolve carries no payload
        else:
            body["event_action"] = "trigger"
            body["payload"] = {
                "summary": f"[{i.job}] {i.summary}"[:1024],
                "source": ",".join(i.hosts[:4]) or i.job,
                "severity": severity(i.impact_ms_per_step, i.step_time_ms),
                "timestamp": i.last_seen.isoformat(),
                "component": i.function[:255], "group": i.job[:255], "class": i.cause,
                "custom_details": i.as_json(),
            }
            link = n.link()
            if link:
                body["links"] = [{"href": link, "text": "perftracker dashboard"}]
        return HttpRequest(self.url, json.dumps(body).encode(), {})
