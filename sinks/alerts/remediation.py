"""Which incident drains which node, and when not: the pure part of remediation.

The remediation hook (:mod:`.remediator`) asks three questions of an incident the
alert dispatcher keeps open, each answered here without I/O:

* :func:`candidate`: is it one at all? Only a root cause the dispatcher has open,
  not advice, naming ranks (a job-wide cause names none). Anything else is passed
  over in silence (no record: most incidents are not about a node).
* :func:`refusal`: may it be acted on? Its cause must be in the allow-list, it must
  name exactly one host (a finding spread over hosts is no single bad node), and the
  host must be a plain node name (``node[1-4]`` or ``a,b`` would be a host list to
  ``scontrol``).
* :func:`limit`: would acting break a limit? The history of actions (this process's
  and the store's) holds every node drained (or, in a dry run, that would have been):
  at most ``max_per_hour`` in any rolling hour, never one node twice within
  ``node_cooldown_s``, never more than ``max_job_fraction`` of a job's hosts.

The commands: :func:`slurm_drain` (``scontrol update NodeName=... State=DRAIN
Reason=...``) and :func:`kubernetes_cordon` (``kubectl cordon`` and the Node patch it
sends, recorded only). An :class:`Action` is what is recorded on the incident
(table ``remediations``, :func:`action_row`).
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...schemas.causes import Cause
from ...schemas.errors import ConfigError
from ...schemas.settings import RemediationSettings
from ...schemas.vocabulary import Kind, Status

HOUR_S = 3600.0
SLURM, KUBERNETES = "slurm", "kubernetes"
MODES = (SLURM, KUBERNETES)
# A node name scontrol and the Kubernetes API take as one node: no host-list syntax
# (brackets, commas), no spaces, no '=' that would start another scontrol argument.
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


class Outcome(str, enum.Enum):
    """What became of one decision (``remediations.outcome``)."""

    DONE = "done"  # the node was drained
    DRY_RUN = "dry_run"  # it would have been: recorded and logged, nothing run
    REFUSED = "refused"  # not acted on: the reason says why (allow-list, limits, node state)
    FAILED = "failed"  # the command failed or timed out: the reason holds its error


@dataclass(frozen=True)
class RemediationPolicy:
    """The ``[remediation]`` settings, checked and parsed."""

    enabled: bool = False
    mode: str = SLURM
    dry_run: bool = True
    causes: frozenset[str] = frozenset({Cause.SLOW_GPU.value, Cause.GPU_THROTTLE.value})
    confirm_s: float = 300.0
    max_age_s: float = 600.0
    max_per_hour: int = 2
    node_cooldown_s: float = 86400.0
    max_job_fraction: float = 0.25

    @classmethod
    def from_settings(cls, s: RemediationSettings) -> RemediationPolicy:
        if s.mode not in MODES:
            raise ConfigError(f"remediation.mode {s.mode!r} is not one of {', '.join(MODES)}")
        causes = frozenset(c.strip() for c in s.causes.split(",") if c.strip())
        known = {c.value for c in Cause}
        unknown = sorted(causes - known)
        if unknown:
            raise ConfigError(f"remediation.causes: {', '.join(unknown)} not a cause; known: {', '.join(sorted(known))}")
        return cls(s.enabled, s.mode, s.dry_run, causes, s.confirm_s, s.max_age_s, s.max_per_hour,
                   s.node_cooldown_s, s.max_job_fraction)

    @property
    def action(self) -> str:
        return "cordon" if self.mode == KUBERNETES else "drain"

    @property
    def simulated(self) -> bool:
        """Nothing is run: a dry run, or Kubernetes (recorded only, there is no cluster access)."""
        return self.dry_run or self.mode == KUBERNETES

    @property
    def horizon_s(self) -> float:
        """How far back the history must reach for :func:`limit`."""
        return max(HOUR_S, self.node_cooldown_s)


@dataclass(frozen=True)
class Past:
    """One earlier action, as :func:`limit` counts it."""

    at: float  # epoch seconds
    job: str
    incident_id: str
    node: str
    outcome: str


@dataclass(frozen=True)
class Action:
    """One decision on one incident: recorded (``remediations``) and logged."""

    at: float  # epoch seconds
    job: str
    incident_id: str
    cause: str
    node: str
    mode: str
    action: str  # "drain" or "cordon"
    outcome: Outcome
    reason: str = ""  # why refused or failed; what a dry run would have done
    command: str = ""  # the command line, as run or as it would run
    patch: str = ""  # Kubernetes: the Node patch (JSON) the command sends

    def past(self) -> Past:
        return Past(self.at, self.job, self.incident_id, self.node, self.outcome.value)

    def describe(self) -> str:
        what = f"{self.action} {self.node or '(no node)'} for {self.cause} incident {self.incident_id} of job {self.job}"
        return f"remediation {self.outcome.value}: {what}" + (f": {self.reason}" if self.reason else "")


def candidate(incident: Any, is_open: bool) -> bool:
    """An incident the hook considers at all (else passed over, unrecorded): a root cause the
    dispatcher has open (a RESOLVED record or one below the paging threshold is not), not
    advice about the job's shape, naming ranks (a job-wide cause names none)."""
    return (is_open and incident.status != Status.RESOLVED.value and incident.kind != Kind.ADVICE.value
            and bool(incident.ranks))


def hosts_of(incident: Any) -> list[str]:
    """The distinct named hosts (unknown ones, empty, left out), in the incident's order."""
    return list(dict.fromkeys(h for h in incident.hosts if h))


def refusal(incident: Any, policy: RemediationPolicy) -> str | None:
    """Why ``incident`` (a :func:`candidate`) is not acted on whatever the limits, or None."""
    if incident.cause not in policy.causes:
        return f"cause {incident.cause} is not in remediation.causes ({', '.join(sorted(policy.causes))})"
    hosts = hosts_of(incident)
    if not hosts:
        return "no host named (the collectors did not report one)"
    if len(hosts) > 1:
        return f"{len(hosts)} hosts named ({', '.join(hosts[:4])}): not one culprit node"
    if not _NODE.fullmatch(hosts[0]):
        return f"host {hosts[0][:80]!r} is not a plain node name"
    return None


def stale(last_seen_s: float, now: float, policy: RemediationPolicy) -> str | None:
    """Why an incident newly open here is history rather than news (a replay), or None."""
    age = now - last_seen_s
    if age > policy.max_age_s:
        return f"its newest data is {age:.0f} s old (remediation.max_age_s {policy.max_age_s:g}): a replay"
    return None


def counted(history: Iterable[Past], policy: RemediationPolicy) -> list[Past]:
    """The actions the limits count: nodes drained, and in a dry run also those that would
    have been (so a dry run refuses what the real thing would)."""
    outcomes = {Outcome.DONE.value, Outcome.DRY_RUN.value} if policy.simulated else {Outcome.DONE.value}
    return [p for p in history if p.outcome in outcomes]


def limit(node: str, job: str, job_hosts: int | None, history: Sequence[Past], now: float,
          policy: RemediationPolicy) -> str | None:
    """Why draining ``node`` for ``job`` now would break a limit, or None.
    ``job_hosts``: the job's distinct hosts (None: unknown, refused)."""
    acts = counted(history, policy)
    same = [p.at for p in acts if p.node == node and now - p.at < policy.node_cooldown_s]
    if same:
        return (f"node {node} was drained {now - max(same):.0f} s ago "
                f"(remediation.node_cooldown_s {policy.node_cooldown_s:g})")
    last_hour = [p for p in acts if now - p.at < HOUR_S]
    if len(last_hour) >= policy.max_per_hour:
        return f"rate limit: {len(last_hour)} nodes drained in the last hour (remediation.max_per_hour {policy.max_per_hour})"
    if not job_hosts:
        return "the job's hosts are unknown: cannot check remediation.max_job_fraction"
    drained = {p.node for p in acts if p.job == job} | {node}
    allowed = math.floor(policy.max_job_fraction * job_hosts + 1e-9)
    if len(drained) > allowed:
        return (f"draining {node} would make {len(drained)} of the job's {job_hosts} hosts "
                f"(remediation.max_job_fraction {policy.max_job_fraction:g} allows {allowed})")
    return None


def drain_reason(cause: str, incident_id: str) -> str:
    """The node's Reason in SLURM (what ``sinfo -R`` shows)."""
    return f"perftracker: {cause} {incident_id}"


def slurm_drain(scontrol: str, node: str, cause: str, incident_id: str) -> list[str]:
    """``scontrol update NodeName=<node> State=DRAIN Reason="perftracker: <cause> <id>"`` as argv."""
    return [scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={drain_reason(cause, incident_id)}"]


def kubernetes_cordon(node: str) -> tuple[list[str], dict[str, Any]]:
    """``kubectl cordon <node>`` and the Node patch it sends (a strategic merge patch of
    ``/api/v1/nodes/<node>``: the same as ``kubectl patch node <node> -p '<patch>'``)."""
    return ["kubectl", "cordon", node], {"spec": {"unschedulable": True}}


def shell_line(argv: Sequence[str]) -> str:
    """``argv`` as one shell line (how the record and the log show it)."""
    import shlex

    return " ".join(shlex.quote(a) for a in argv)


def patch_json(patch: dict[str, Any]) -> str:
    return json.dumps(patch, sort_keys=True, separators=(",", ":"))


REMEDIATION_COLUMNS = ("job", "incident_id", "at", "cause", "node", "mode", "action", "outcome", "reason",
                       "command", "patch")


def action_row(a: Action) -> tuple[Any, ...]:
    """An :class:`Action` as a ``remediations`` row (columns :data:`REMEDIATION_COLUMNS`; ``at``
    in epoch ms, the tick of ``DateTime64(3)``)."""
    return (a.job, a.incident_id, int(round(a.at * 1000)), a.cause, a.node, a.mode, a.action,
            a.outcome.value, a.reason, a.command, a.patch)
