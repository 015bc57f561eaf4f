"""Rank findings: ranks whose own functions (collective time excluded) are above their peers',
one finding per rank and cause (:func:`rank_findings`), host-level causes keyed by host and
data imbalance by function (:func:`.findings.classify` names the cause).

Evidence: the non-collective comparisons' outliers of each rank (:func:`.facts.outliers_by_rank`),
the late arrivals the rank caused (the cost of the finding is the larger of its own excess
and the wait it caused), its CPU verdict, and for a GPU rank its GPU clock, temperature and
fault readings against its peers'; its step times tell a slowdown that began inside the
window (:mod:`.onset`).

CPU rank: host times of its phases and functions, and scheduler evidence of waiting for a
CPU. GPU/NCCL rank: device times of its phases beside the host times, so a slow GPU (or a
throttled one, with clock or temperature evidence) is told from slow host code; a GPU cause
says what it is missing when the evidence that would confirm it is not there.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...schemas.causes import CAUSES, Cause
from ...schemas.records import RankWindow
from ...schemas.vocabulary import Kind
from .cpu_evidence import CpuVerdict, cpu_verdict
from .device_evidence import gpu_side
from .facts import LateArrivals, Outlier, Outliers
from .findings import (
    IN_WINDOW,
    INTERMITTENT,
    Finding,
    classify,
    fault_evidence,
    fault_words,
    finite_ratio,
    missing_evidence,
    rank_impact,
    throttle_evidence,
    top_function,
)
from .host_level import HOST_LEVEL
from .onset import onset_step
from .policy import DetectionPolicy
from .rank_cpu import with_cpu_evidence as _with_cpu
from .shape import short_ranks

GPU_CAUSES = frozenset({Cause.SLOW_GPU, Cause.GPU_THROTTLE})


def hw_peer_clock(rank_windows: dict[int, RankWindow]) -> float:
    clocks = [rw["sm_clock_mhz"] for rw in rank_windows.values() if rw.get("sm_clock_mhz", -1) > 0]
    return float(np.median(clocks)) if clocks else -1.0


def rank_findings(by_rank: Outliers, stragglers: LateArrivals,
                  rank_windows: dict[int, RankWindow], policy: DetectionPolicy) -> list[Finding]:
    peer_clock = hw_peer_clock(rank_windows)
    groups: dict[tuple, list[tuple[int, Cause, list[Outlier], dict, CpuVerdict]]] = defaultdict(list)
    for rank, outs in by_rank.items():
        rw: Mapping[str, Any] = rank_windows.get(rank, {})
        gpu = int(outs[0].gpu)
        hw = throttle_evidence(rw, peer_clock, policy.clock_ratio, policy.hot_temp_c) if gpu >= 0 else {}
        cpu = cpu_verdict(rank, rank_windows, rank_impact(outs), policy)
        cause = classify(outs, gpu, hw, policy, cpu.verdict)
        if cause in GPU_CAUSES:
            hw = {**hw, **fault_evidence(rw, rank_windows)}
        if cause in HOST_LEVEL:
            key: tuple = (cause, outs[0].host)
        elif cause == Cause.DATA_IMBALANCE:
            key = (cause, top_function(outs, cause).function)
        else:
            key = (cause, rank)
        groups[key].append((rank, cause, outs, hw, cpu))
    return [_with_cpu(_onset(_merge_rank_group(key, members, stragglers), rank_windows, policy), members,
                      rank_windows, policy) for key, members in groups.items()]


def _step_times(rank_windows: dict[int, RankWindow], rank: int) -> list[int]:
    rw = rank_windows.get(rank)
    return list(rw.get("step_time_ns") or []) if rw is not None else []


def _onset(f: Finding, rank_windows: dict[int, RankWindow], policy: DetectionPolicy) -> Finding:
    """An intermittent finding whose every rank's steps all turned slow from some step of this
    window to its end began inside it: it opens like a sustained one (:mod:`.onset`). The
    summary says which of the two it is (``onset``, rendered by :func:`.findings.words_of`)."""
    if not f.evidence.get("intermittent"):
        return f
    onsets = [onset_step(_step_times(rank_windows, r), policy.persist_steps, policy) for r in f.ranks] \
        if policy.persist_steps > 0 else []
    if not onsets or any(k is None for k in onsets):
        return dataclasses.replace(f, onset=INTERMITTENT)
    evidence = {k: v for k, v in f.evidence.items() if k != "intermittent"}
    evidence["onset_in_window_step"] = min(k for k in onsets if k is not None)
    return dataclasses.replace(f, evidence=evidence, onset=IN_WINDOW, extra_windows=0)


def _merge_rank_group(key: tuple, members: list, stragglers: LateArrivals) -> Finding:
    cause = key[0]
    ranks = tuple(sorted(m[0] for m in members))
    outs = [o for m in members for o in m[2]]
    top = top_function(outs, cause)
    impact = max(rank_impact(m[2]) for m in members)
    late = [s for r in ranks for s in stragglers.get(r, [])]
    if late:
        impact = max(impact, max(s.caused_ms_per_step for s in late))
    hosts = tuple(sorted({o.host for o in outs}))
    gpus = tuple(sorted({int(o.gpu) for o in outs}))
    evidence = {
        "function": top.function, "peer_median_ms": round(top.peer_median_ms_per_step, 3),
        "rank_value_ms": round(top.value_ms_per_step, 3), "ratio": round(top.ratio, 3),
        "robust_z": round(top.robust_z, 1), "calls_ratio": round(top.calls_ratio, 3),
        "abnormal_functions": sorted({o.function for o in outs}),
        "hardware": {str(m[0]): m[3] for m in members if m[3]},
        "late_arrivals": [{"function": s.function, "late_seqs": s.late_seqs, "late_fraction": s.late_fraction,
                           "caused_ms_per_step": s.caused_ms_per_step} for s in late[:5]],
    }
    kind = Kind.IMBALANCE if cause == Cause.DATA_IMBALANCE else Kind.OUTLIER
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {short_ranks(ranks)}"
    side = gpu_side(members[0][2], 0.0, 0.0) if cause in GPU_CAUSES else None
    missing = sorted({w for m in members for w in missing_evidence(m[2], int(m[2][0].gpu), cause,
                                                                   m[4].verdict)})
    if side is not None:
        evidence["gpu_side"] = side.evidence()
        what = side.words()
    else:
        what = (f"{top.function} takes {top.value_ms_per_step:.1f} ms/step vs "
                f"{top.peer_median_ms_per_step:.1f} ms on its peers ({_times(top.ratio)})")
    if missing:
        evidence["missing_evidence"] = missing
    faults = next((fault_words(m[3]) for m in members if fault_words(m[3])), "")
    summary = (f"{who} on {', '.join(hosts[:3])}: {what} - {CAUSES[cause].reason}{faults}"
               + (f" (no {'; no '.join(missing)})" if missing else "") + f"; costs the job ~{impact:.1f} ms per step")
    intermittent = all(o.intermittent for o in outs)
    if intermittent:
        evidence["intermittent"] = True  # the summary says so (:func:`_onset`)
    return Finding(kind=kind, cause=cause, identity=f"{cause.value}|{key[1]}", ranks=ranks, hosts=hosts,
                   gpus=gpus, function=top.function, score=float(max(o.robust_z for o in outs)),
                   impact_ms=float(impact), summary=summary, evidence=evidence,
                   extra_windows=1 if intermittent else 0, subject=who if len(ranks) == 1 else "")


def _times(ratio: float) -> str:
    """``'3.20x'``; for a function the median peer spends no time in (:func:`.findings.finite_ratio`),
    words instead of a made-up factor."""
    return f"{ratio:.2f}x" if finite_ratio(ratio) else "its median peer spends none"

