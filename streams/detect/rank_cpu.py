"""A rank finding's CPU evidence and code location, in numbers and in words.

:func:`with_cpu_evidence` adds to a rank finding (built by :mod:`.rank_findings`) each rank's CPU
verdict (:func:`.cpu_evidence.cpu_verdict`), its most sampled user-code frames, the phase a
``slow_function`` is confined to, and what the cause rests on: scheduler evidence (contention is
only ever named with it), or "CPU evidence unavailable" (``cpu_note``), and the frame its
extra time goes to (``hot_frame``); the summary says them when it is rendered
(:func:`.findings.words_of`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...schemas.causes import Cause
from .cpu_evidence import UNAVAILABLE, CpuVerdict, frame_location, top_frames
from .findings import Finding, phase_of, top_function
from .policy import DetectionPolicy


def with_cpu_evidence(f: Finding, members: list[tuple], rank_windows: Mapping[int, Mapping[str, Any]],
                      policy: DetectionPolicy) -> Finding:
    """``members``: (rank, cause, outliers (:class:`.facts.Outlier`), hardware, CpuVerdict) of the finding's ranks."""
    verdicts: dict[int, CpuVerdict] = {m[0]: m[4] for m in members}
    ev: dict[str, Any] = dict(f.evidence)
    ev["cpu"] = {str(r): {"verdict": v.verdict, **v.evidence} for r, v in verdicts.items()}
    frames = {str(r): top_frames(rank_windows.get(r, {})) for r in verdicts}
    ev["top_frames"] = {r: fr for r, fr in frames.items() if fr}
    where = {str(r): loc for r in verdicts if (loc := frame_location(r, rank_windows, policy))}
    if where:
        ev["location"] = where
    first = verdicts[min(verdicts)]
    note = ""
    if f.cause == Cause.HOST_CPU_CONTENTION:  # classify names it only on a contended verdict
        ev["cpu_basis"] = "scheduler evidence"
        note = first.note
    elif f.cause == Cause.SLOW_FUNCTION:
        outs = [o for m in members for o in m[2]]
        phase = phase_of(top_function(outs, f.cause))
        ev["phase"] = phase
        if phase != "function":
            note = f"slow in its {phase} only; {first.note}"
    elif first.verdict == UNAVAILABLE:
        note = first.note
    hot = None
    if where:
        r, loc = next(iter(where.items()))
        hot = (int(r), float(loc["extra_ms_per_step"]), str(loc["frame"]))
    return dataclasses.replace(f, evidence=ev, cpu_note=note, hot_frame=hot)


def late_entry_words(rank: int, where: dict[str, Any]) -> str:
    """Where a late arriver's delay is: the sampled frame when there is one."""
    if not where:
        return "the delay is in code just before the call (no stack samples to say where)"
    return (f"the delay is in uninstrumented code: rank {rank} spends {where['extra_ms_per_step']:.1f} "
            f"ms/step more than its peers in {where['frame']}")
