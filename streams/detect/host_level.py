"""Host-level merge: the findings of ranks on one host with a host-level cause (CPU
contention) are one incident, joined by the host's other ranks with direct evidence of the
same cause (:func:`merge_host_level`).

Evidence: scheduler evidence of waiting for a CPU (run-queue wait per step against what the
peers' rate expects, :func:`.cpu_evidence.cpu_verdict`) of every rank on the host; a host
peer joins only when it waited at least ``host_join_share`` of what the finding's own ranks
did. Contention is only ever named with such evidence.

CPU rank: its compute threads and the collectives' host work compete for the host's cores,
so a starved rank shows as run-queue wait and late arrivals. GPU/NCCL rank: the same
scheduler evidence of its host thread (launches, data loading, the Python step); its GPU
work is not what waits for a CPU.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from ...schemas.causes import CAUSES, Cause
from ...schemas.records import RankWindow
from .cpu_evidence import CONTENDED, CpuVerdict, cpu_verdict
from .findings import Finding, words_of
from .policy import DetectionPolicy
from .shape import short_ranks

HOST_LEVEL = frozenset({Cause.HOST_CPU_CONTENTION})


def merge_host_level(findings: list[Finding], rank_windows: dict[int, RankWindow],
                     policy: DetectionPolicy) -> list[Finding]:
    """One finding per host and host-level cause: the rank findings (slow functions) and the
    late entries of ranks on one host with such a cause are one incident, joined by the
    other ranks of that host with direct evidence of the same cause (they waited for a CPU
    more than their peers) that no other finding names. Identity ``cause|host``."""
    by_identity: dict[str, list[Finding]] = defaultdict(list)
    rest: list[Finding] = []
    for f in findings:
        (by_identity[f.identity] if f.cause in HOST_LEVEL else rest).append(f)
    named = {r for f in rest for r in f.ranks}
    merged = []
    for parts in by_identity.values():
        host = parts[0].hosts[0] if len(parts[0].hosts) == 1 and parts[0].hosts[0] else None  # known, one
        impact = max(p.impact_ms for p in parts)
        have = {r for p in parts for r in p.ranks}
        verdicts = {r: cpu_verdict(r, rank_windows, impact, policy) for r, rw in sorted(rank_windows.items())
                    if host is not None and rw.get("host") == host and r not in have and r not in named}
        contended = {r: v for r, v in verdicts.items() if v.verdict == CONTENDED}
        worst = _worst_extra_wait(have, rank_windows, impact, policy) if contended else None
        joined = {r: v for r, v in contended.items() if _comparable(v, worst, policy)}
        merged.append(parts[0] if len(parts) == 1 and not joined else _join_host(parts, joined))
    return rest + merged


def _worst_extra_wait(ranks: set[int], rank_windows: dict[int, RankWindow], impact: float,
                      policy: DetectionPolicy) -> float | None:
    """The largest :func:`_extra_wait` of ``ranks`` (a host-level finding's own ranks); None unknown."""
    waits = [_extra_wait(cpu_verdict(r, rank_windows, impact, policy).evidence) for r in sorted(ranks)]
    return max((w for w in waits if w is not None), default=None)


def _extra_wait(ev: Mapping[str, Any]) -> float | None:
    """A CPU verdict's run-queue wait above what its peers' rate expects (ms/step); None unknown."""
    mine = float(ev.get("runqueue_wait_ms_per_step", -1))
    if mine < 0:
        return None
    return mine - float(ev.get("expected_runqueue_wait_ms_per_step", ev.get("peer_runqueue_wait_ms_per_step", 0.0)))


def _comparable(v: CpuVerdict, worst: float | None, policy: DetectionPolicy) -> bool:
    """A contended host peer joins when it waited for a CPU at least ``host_join_share`` of what
    the finding's own ranks did (the same evidence, not a trace of it; decisions table,
    docs/detection.md: "joining a contended host")."""
    mine = _extra_wait(v.evidence)
    return worst is None or mine is None or mine >= policy.host_join_share * worst


def _join_host(parts: list[Finding], joined: dict[int, CpuVerdict]) -> Finding:
    """``parts`` (findings of one host and cause) and the ``joined`` ranks (with the CPU verdict
    that joined them, rank order) as one finding."""
    top = max(parts, key=lambda p: p.impact_ms)
    ranks = tuple(sorted({r for p in parts for r in p.ranks} | set(joined)))
    evidence: dict[str, Any] = dict(top.evidence)
    cpu: dict[str, Any] = {}
    for p in parts:
        cpu.update(p.evidence.get("cpu", {}))
    notes = []
    for r, v in joined.items():
        cpu[str(r)] = {"verdict": v.verdict, **v.evidence}
        notes.append(f"rank {r}: {v.note}")
    evidence["cpu"] = cpu
    evidence["merged"] = [{"ranks": list(p.ranks), "kind": p.kind.value, "function": p.function,
                           "impact_ms": round(p.impact_ms, 3)} for p in parts]
    if joined:
        evidence["joined_ranks"] = list(joined)
    host = ", ".join(sorted({h for p in parts for h in p.hosts}))
    summary = (f"ranks {short_ranks(ranks)} on {host}: {CAUSES[top.cause].title} - "
               + "; ".join(words_of(p) for p in sorted(parts, key=lambda p: -p.impact_ms))
               + "".join(f"; {n}" for n in notes))
    return dataclasses.replace(top, ranks=ranks, hosts=tuple(sorted({h for p in parts for h in p.hosts})),
                               gpus=tuple(sorted({g for p in parts for g in p.gpus})),
                               score=max(p.score for p in parts), summary=summary, evidence=evidence,
                               extra_windows=min(p.extra_windows for p in parts), subject="",
                               onset="", cpu_note="", hot_frame=None)  # each part's are in its words

