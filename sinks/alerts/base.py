"""Alert channel protocol and the incident payload every channel formats.

A channel only *formats*: ``request(notification)`` returns the HTTP request
to send. Delivery (queue, retries, rate limits) is the dispatcher's, so a new
channel is one small module and its payload is unit-testable without a network.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol


class Event(enum.Enum):
    OPEN = "open"
    UPDATE = "update"
    RESOLVE = "resolve"


@dataclass(frozen=True)
class Incident:
    """One root cause of one job, as the on-call engineer sees it."""

    incident_id: str
    job: str
    status: str
    kind: str
    cause: str
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    function: str
    score: float
    impact_ms_per_step: float
    step_time_ms: float
    first_seen: datetime
    last_seen: datetime
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    resolved_reason: str = ""  # RESOLVED: "cleared", "job finished" or "job died"

    @classmethod
    def from_anomaly(cls, r: dict) -> Incident:
        try:
            evidence = json.loads(r.get("evidence_json") or "{}")
        except ValueError:
            evidence = {"raw": r.get("evidence_json", "")}
        return cls(r["incident_id"], r["job"], str(r["status"]), r["kind"], r["cause"],
                   tuple(r["ranks"]), tuple(r["hosts"]), r["function"], float(r["score"]),
                   float(r["impact_ms_per_step"]), float(r.get("step_time_ms", 0.0)),
                   _dt(r["first_seen_ms"]), _dt(r["last_seen_ms"]), r["summary"],
                   evidence if isinstance(evidence, dict) else {"value": evidence},
                   str(r.get("resolved_reason") or ""))

    def as_json(self) -> dict[str, Any]:
        return {
            "incident_id": self.incident_id, "job": self.job, "status": self.status, "kind": self.kind,
            "cause": self.cause, "ranks": list(self.ranks), "hosts": list(self.hosts),
            "function": self.function, "score": self.score,
            "impact_ms_per_step": self.impact_ms_per_step, "step_time_ms": self.step_time_ms,
            "first_seen": self.first_seen.isoformat(), "last_seen": self.last_seen.isoformat(),
            "summary": self.summary, "evidence": self.evidence, "resolved_reason": self.resolved_reason,
        }

    @property
    def dedup_key(self) -> str:
        """The key every channel gives this incident (all its events): the incident id."""
        return self.incident_id

    def who(self) -> str:
        ranks = ",".join(map(str, self.ranks[:8])) + ("…" if len(self.ranks) > 8 else "")
        hosts = ",".join(self.hosts[:4]) + ("…" if len(self.hosts) > 4 else "")
        return f"rank {ranks} on {hosts}" if hosts else f"rank {ranks}"


def _dt(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return datetime.fromtimestamp(int(value) / 1000.0, tz=timezone.utc)


@dataclass(frozen=True)
class Notification:
    incident: Incident
    event: Event
    dashboard_url: str = ""

    @property
    def delivery_id(self) -> str:
        """Same incident, event and last_seen -> same id: receivers dedupe replays on it."""
        key = f"{self.incident.incident_id}|{self.event.value}|{self.incident.last_seen.isoformat()}"
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def link(self) -> str:
        if not self.dashboard_url:
            return ""
        from urllib.parse import quote
        return f"{self.dashboard_url.rstrip('/')}/d/perftracker-job/perftracker-job?var-job={quote(self.incident.job)}"


@dataclass(frozen=True)
class HttpRequest:
    url: str
    body: bytes
    headers: dict[str, str]

    def __repr__(self) -> str:  # URLs of Slack webhooks are secrets
        return f"HttpRequest(<{len(self.body)} bytes>)"


class Channel(Protocol):
    """An alert destination: a name for logs and counters, and a payload formatter."""

    name: str

    def request(self, n: Notification) -> HttpRequest: ...


class DeliveryError(Exception):
    """A delivery that failed; ``retryable`` is False for answers that will not change (4xx)."""

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable
