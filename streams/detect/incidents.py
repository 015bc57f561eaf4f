"""Incident lifecycle: persistence before OPEN, UPDATED on material change, RESOLVED after quiet.

A finding's ``identity`` (cause + culprit ranks/host/group) is its root cause. It must
be seen in ``persist_windows`` consecutive evaluated windows to open, or in consecutive
windows holding ``persist_steps`` steps in all (the job's median steps per window; a fast
job's slowdown so opens after its first window, a slow job's still needs
``persist_windows``); hangs open at once, and a finding that waits extra windows (a
regression) still waits them; it is re-sent as UPDATED when its impact moves by more than ``update_change``
(relative) or its ranks change; it resolves after ``clear_windows`` windows without it
(``resolved_reason`` "cleared"), or when the job ends (:func:`end_all`, "job finished" or
"job died", decided by :mod:`.diagnose`).
The incident_id is a hash of job, cause, ranks and function at opening, so re-deliveries
and restarts from the same inputs give the same id.

A window without data of a rank the incident names (its ``observed`` ranks lack it) is no
evidence that the rank recovered: it is not a clean window for that incident. A stream
worker that takes over a dead one's partitions re-reads the dead one's ranks from the last
committed offsets, and the job's windows of those seconds close without them; counted as
clean, the incident would resolve and, once the ranks' data was back, open again (``open,
resolve, open, resolve`` of one incident; docs/detection.md, decisions: "a window without
the named ranks is not clean"). Nor is a window in which the incident's function was not compared with
every rank that sent it (``unjudged``): the dead worker's comparator had read and committed
patterns of the windows it held open, so after the takeover the slow rank's pattern was
missing from its function's comparison, while its lateness still showed in a collective (the
same test in a fresh clone the same day: the incident resolved and a late entry of the same
rank opened). A culprit unobserved for ``idle_after_s`` (its collector died while the job
runs on) counts again, so such an incident still ends.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from ...schemas.records import Anomaly
from ...schemas.vocabulary import ANOMALY_VERSION, RESOLVED_CLEARED, Kind, Status
from .findings import Finding
from .policy import DetectionPolicy


@dataclass
class Track:
    """Plain state of one identity."""

    streak: int = 0
    steps: int = 0  # the job's steps in the ``streak`` windows
    misses: int = 0
    blind: int = 0  # consecutive windows without data of a rank it names (open tracks)
    open: bool = False
    incident_id: str = ""
    first_seen_ms: int = 0
    last_seen_ms: int = 0
    sent_impact: float = 0.0
    sent_ranks: tuple = ()
    explains_ms: float = 0.0  # step time this root cause accounts for
    advice: bool = False  # the job's shape, seen before its steady state (causes.SHAPE): never an incident
    last: Anomaly | None = None  # last Anomaly record sent


def incident_id(job: str, f: Finding) -> str:
    key = f"{job}|{f.cause.value}|{','.join(map(str, f.ranks))}|{f.function}"
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def step(tracks: dict[str, Track], findings: list[Finding], job: str, window_start_ms: int,
         window_end_ms: int, step_time_ms: float, policy: DetectionPolicy,
         progress: bool = True, steps: int = 0, observed: set[int] | None = None,
         unjudged: frozenset[str] = frozenset(), shape: frozenset[str] = frozenset()) -> list[Anomaly]:
    """Advance every track by one evaluated window; Anomaly records to send. A window in
    which the job made no ``progress`` (no rank completed a step) is missing data, not a
    clean window: it never counts toward resolving an incident; nor, for one incident, is a
    window without data of a rank it names (``observed``: the ranks that sent data in this
    window; None: all) or in which its function was not compared with every rank that sent it
    (``unjudged``), for up to ``idle_after_s``. ``steps``: the job's (median) steps in
    this window, toward ``persist_steps``. ``shape``: identities of findings that are the job's
    shape (:data:`...schemas.causes.SHAPE`, :meth:`.job_checks.JobChecks.shape`); a track that
    starts as one goes out as advice (``kind`` "advice"), never as an incident."""
    out = []
    seen = {f.identity: f for f in findings}
    for ident, f in seen.items():
        t = tracks.get(ident)
        if t is None:
            t = tracks[ident] = Track(first_seen_ms=window_start_ms, advice=ident in shape)
        t.streak, t.misses, t.blind, t.last_seen_ms = t.streak + 1, 0, 0, window_end_ms
        t.steps += max(0, int(steps))
        if not t.open and (persisted(t, f, policy) or f.immediate):
            t.open, t.incident_id = True, incident_id(job, f)
            out.append(_record(t, f, job, Status.OPEN, step_time_ms))
        elif t.open and _material(t, f, policy):
            out.append(_record(t, f, job, Status.UPDATED, step_time_ms))
    for ident in [i for i in tracks if i not in seen]:
        t = tracks[ident]
        if not t.open:
            if progress:
                del tracks[ident]
            continue
        if not progress or _unobserved(t, observed, unjudged, policy):
            continue
        t.misses += 1
        if t.misses >= policy.clear_windows:
            if t.last is not None:  # always, for an open track: opening sent its first record
                out.append(resolved(t.last, t.last_seen_ms, RESOLVED_CLEARED))
            del tracks[ident]
    return out


def _unobserved(t: Track, observed: set[int] | None, unjudged: frozenset[str], policy: DetectionPolicy) -> bool:
    """The window has no data of a rank open track ``t`` names, or did not compare its function
    with every rank that sent it, and so for less than ``idle_after_s`` (counted in ``t.blind``)."""
    seen = observed is None or set(t.sent_ranks) <= observed
    if seen and (t.last is None or t.last.get("function") not in unjudged):
        t.blind = 0
        return False
    t.blind += 1
    return t.blind * policy.window_ms < policy.idle_after_s * 1000


def persisted(t: Track, f: Finding, policy: DetectionPolicy) -> bool:
    """``t`` (the track of ``f``, this window counted) has persisted long enough to open:
    ``persist_windows`` windows, or ``persist_steps`` steps (never before the extra
    windows ``f`` waits for)."""
    if t.streak >= policy.persist_windows + f.extra_windows:
        return True
    return 0 < policy.persist_steps <= t.steps and t.streak >= 1 + f.extra_windows


def persisting(tracks: dict[str, Track], f: Finding, policy: DetectionPolicy) -> bool:
    """``f`` was seen in the previous window too, or is open (a one-window candidate explains nothing)."""
    t = tracks.get(f.identity)
    return t is not None and (t.open or t.streak >= policy.persist_windows - 1)


def explained_ms(tracks: dict[str, Track], findings: list[Finding], exclude: str,
                 policy: DetectionPolicy) -> float:
    """Step time (ms) the root causes of a window account for: the persisting ``findings``,
    plus the open incidents not among them (other than ``exclude``). Advice (the job's shape,
    :data:`...schemas.causes.SHAPE`) explains too: a regression it covers is that shape
    settling in after the job's first windows, not a second fault."""
    explained = sum(float(f.evidence.get("explains_ms", f.impact_ms)) for f in findings
                    if persisting(tracks, f, policy))
    seen = {f.identity for f in findings}
    explained += sum(t.explains_ms for i, t in tracks.items() if t.open and i != exclude and i not in seen)
    return explained


def advice(tracks: dict[str, Track], f: Finding) -> bool:
    """``f`` is advice about the job's shape (its track started before the steady state)."""
    t = tracks.get(f.identity)
    return t is not None and t.advice


def _finite(x: Any) -> Any:
    """Evidence as strict JSON: NaN and infinities become null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _material(t: Track, f: Finding, policy: DetectionPolicy) -> bool:
    base = max(abs(t.sent_impact), 1e-9)
    return abs(f.impact_ms - t.sent_impact) / base > policy.update_change or f.ranks != t.sent_ranks


def resolved(last: Anomaly, last_seen_ms: int, reason: str) -> Anomaly:
    """The incident's last record again, RESOLVED for ``reason``, seen last at ``last_seen_ms``."""
    rec = last.copy()
    rec["status"], rec["last_seen_ms"], rec["resolved_reason"] = Status.RESOLVED.value, last_seen_ms, reason
    return rec


def end_all(tracks: dict[str, Track], reason: str) -> list[Anomaly]:
    """The job ended: every open incident RESOLVED once for ``reason``; every track dropped."""
    out = [resolved(t.last, t.last_seen_ms, reason) for t in tracks.values() if t.open and t.last is not None]
    tracks.clear()
    return out


def _record(t: Track, f: Finding, job: str, status: Status, step_time_ms: float) -> Anomaly:
    t.sent_impact, t.sent_ranks = f.impact_ms, f.ranks
    t.explains_ms = float(f.evidence.get("explains_ms", f.impact_ms))
    evidence = dict(f.evidence, windows=t.streak)
    rec = Anomaly(
        schema_version=ANOMALY_VERSION, incident_id=t.incident_id, job=job,
        status=status.value, kind=(Kind.ADVICE if t.advice else f.kind).value, cause=f.cause.value,
        ranks=list(f.ranks), hosts=list(f.hosts), gpus=list(f.gpus), function=f.function,
        score=float(f.score), impact_ms_per_step=round(float(f.impact_ms), 3),
        step_time_ms=round(float(step_time_ms), 3), first_seen_ms=int(t.first_seen_ms),
        last_seen_ms=int(t.last_seen_ms), windows=int(t.streak), summary=f.summary,
        evidence_json=json.dumps(_finite(evidence), sort_keys=True, default=str), resolved_reason="")
    t.last = rec
    return rec
