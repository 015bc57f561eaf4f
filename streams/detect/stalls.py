"""Periodic stalls: one rank that now and then keeps every peer waiting for several steps.

A synchronous checkpoint write, a metrics or log flush, an evaluation on one rank: every few
tens or hundreds of steps one rank blocks for a long moment before its next collective, and
its peers wait there for it. Averaged over a window the rank is late in one call out of
hundreds (far from the late-arrival rule's fraction), its functions look like its peers',
and when the period is longer than a window most windows hold no stall at all: the
per-window rules see nothing, or only a job-wide slowdown with no culprit.

Evidence (:func:`.late_arrival.score_collective` lists each window's stalls in
``FunctionComparison.stalls``, v3): a *stall* is a single call of a collective group at
which the last arriver kept the other members waiting at least ``stall_steps`` of the
window's steps and at least ``stall_min_ms`` (a wait no ordinary step-to-step jitter reaches).
A CPU rank (gloo) shows it as one call with a long wait on every member but the culprit; a
GPU rank (NCCL) the same from its CUDA-timed arrivals: the culprit enqueues the collective
late, so its peers' kernels wait on the stream while its own time inside the call is the
pure transfer. Stalls are kept per job over the last ``stall_horizon_windows`` windows
(:class:`StallHistory`: bounded, plain state), so periods longer than a window count.

Rule (:func:`periodic_stalls`): a rank is named when, over the horizon,

* it was the last arriver of at least ``stall_min_count`` stalls of one group, and of more
  than ``stall_rank_share`` of that group's stalls (with every rank stalling now and then,
  an unsynchronized garbage collection say, no rank holds most of them);
* its latest stall is recent: within ``stall_recent_periods`` of its periods (or of windows,
  for periods shorter than a window) of now, so the finding clears once the stalls stop;
* the wait its stalls cost, spread over the steps between its first and last stall, reaches
  ``min_cost_ms_per_step`` and ``stall_step_share`` of the job's step time;
* no other finding of this window names the rank (the per-window rules explain it better);
* its stalls are its own: in a window where it waited, in groups it is a member of, for
  other ranks' stalls at least as long as its stalls kept others waiting, they are left out
  (propagated: see :func:`_held_up`).

The finding says the rank, the period in steps and seconds (regular when the gaps' spread
is within ``stall_period_cv`` of their median), each stall's length, the cost per step and,
from the rank's stack samples in its stall windows, the line it blocks at.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median
from typing import Any

import numpy as np

from ...schemas.causes import CAUSES, Cause
from ...schemas.records import FunctionComparison, RankWindow
from ...schemas.vocabulary import Kind
from .cpu_evidence import frame_location
from .decisions import Clearance
from .findings import Finding
from .policy import DetectionPolicy


@dataclass(frozen=True)
class Stall:
    """One stall of a collective group, as one window saw it."""

    window_id: int
    group: str
    rank: int
    host: str
    gpu: int
    seq: int
    wait_ms: float
    seqs_per_step: float
    pace_ms: float  # the window's length over the job's median steps in it (stalls included)
    location: Mapping[str, Any]  # the rank's sampled frame of that window (frame_location), {} if none


@dataclass
class StallHistory:
    """The stalls of one job's last windows (bounded by ``horizon`` windows)."""

    horizon: int
    windows: deque[tuple[int, tuple[Stall, ...]]]

    @classmethod
    def for_policy(cls, policy: DetectionPolicy) -> StallHistory:
        return cls(policy.stall_horizon_windows, deque(maxlen=policy.stall_horizon_windows))

    def note(self, window_id: int, comparisons: Iterable[FunctionComparison],
             rank_windows: Mapping[int, RankWindow], policy: DetectionPolicy) -> None:
        """Keep window ``window_id``'s stalls (a window seen again replaces its earlier entry)."""
        located: dict[int, Mapping[str, Any]] = {}
        steps = float(np.median([int(rw.get("steps", 0)) for rw in rank_windows.values()])) if rank_windows else 0.0
        pace = policy.window_ms / steps if steps > 0 else 0.0

        def where(rank: int) -> Mapping[str, Any]:
            if rank not in located:
                located[rank] = frame_location(rank, rank_windows, policy)
            return located[rank]

        comparisons = [c for c in comparisons if c.get("stalls")]
        held = _held_up(comparisons)
        stalls = tuple(Stall(window_id, str(c["function"]), int(s["rank"]), str(s["host"]), int(s["gpu"]),
                             int(s["seq"]), float(s["wait_ms"]), float(s["seqs_per_step"]), pace, where(int(s["rank"])))
                       for c in comparisons for s in c["stalls"] if int(s["rank"]) not in held)
        kept = [w for w in self.windows if w[0] != window_id and w[0] > window_id - self.horizon]
        self.windows = deque(kept + [(window_id, stalls)], maxlen=self.horizon)

    def stalls(self) -> list[Stall]:
        return [s for _, stalls in self.windows for s in stalls]


def _held_up(comparisons: list[FunctionComparison]) -> set[int]:
    """Ranks whose stalls this window are propagated: a rank that itself waited, in groups it
    is a member of, for other ranks' stalls at least as long as its own stalls kept others
    waiting (its peer stalled, it waited there, and came late to the next collective; the
    wait passed on is never longer than the wait that caused it, so of two ranks stalling
    each other's groups the one that caused more is kept)."""
    own: dict[int, float] = {}
    suffered: dict[int, float] = {}
    for c in comparisons:
        members = {int(m) for m in c.get("members") or []}
        for s in c["stalls"]:
            rank, wait = int(s["rank"]), float(s["wait_ms"])
            own[rank] = own.get(rank, 0.0) + wait
            for m in members - {rank}:
                suffered[m] = suffered.get(m, 0.0) + wait
    return {r for r, w in own.items() if suffered.get(r, 0.0) >= w}


def periodic_stalls(history: StallHistory, window_id: int, job_step_ms: float, named: Iterable[int],
                    policy: DetectionPolicy) -> list[Finding]:
    """The ranks whose stalls over the horizon make a periodic stall (module docstring)."""
    return periodic_stalls_traced(history, window_id, job_step_ms, named, policy)[0]


def periodic_stalls_traced(history: StallHistory, window_id: int, job_step_ms: float, named: Iterable[int],
                           policy: DetectionPolicy) -> tuple[list[Finding], list[Clearance]]:
    """:func:`periodic_stalls`, and each other rank with stalls over the horizon, with why it is
    no periodic stall."""
    if job_step_ms <= 0:
        return [], []
    by_group: dict[str, list[Stall]] = {}
    for s in history.stalls():
        by_group.setdefault(s.group, []).append(s)
    best: dict[int, Finding] = {}
    why: dict[int, Clearance] = {}
    taken = set(named)
    for group, stalls in by_group.items():
        for rank in {s.rank for s in stalls} - taken:
            f = _finding(rank, group, stalls, window_id, job_step_ms, policy)
            if isinstance(f, str):
                why.setdefault(rank, Clearance(rank, "", f"its stalls in {group} are no periodic stall: {f}",
                                               {"group": group, "stalls": sum(s.rank == rank for s in stalls)}))
            elif rank not in best or f.impact_ms > best[rank].impact_ms:
                best[rank] = f
    return list(best.values()), [c for r, c in why.items() if r not in best]


def _finding(rank: int, group: str, stalls: list[Stall], window_id: int, job_step_ms: float,
             policy: DetectionPolicy) -> Finding | str:
    """The rank's periodic stall in ``group``, or why there is none (words)."""
    mine = sorted((s for s in stalls if s.rank == rank), key=lambda s: s.seq)
    if len(mine) < policy.stall_min_count or len(mine) <= policy.stall_rank_share * len(stalls):
        return f"{len(mine)} of the group's {len(stalls)} stalls, too few or too small a share"
    per_step = median(s.seqs_per_step for s in mine)
    if per_step <= 0:
        return "no steps to place them in"
    gaps = np.diff([s.seq for s in mine]) / per_step
    if gaps.sum() <= 0:
        return "no steps between them"
    period_steps = float(np.median(gaps))
    wait = [s.wait_ms for s in mine]
    period_s = period_steps * median(s.pace_ms for s in mine) / 1e3
    recent = policy.stall_recent_periods * max(1.0, period_s * 1e3 / policy.window_ms)
    if window_id - mine[-1].window_id > recent:
        return "its last stall is no longer recent"
    cost = sum(wait[1:]) / float(gaps.sum())  # each stall after the first over the steps since the one before
    if cost < max(policy.min_cost_ms_per_step, policy.stall_step_share * job_step_ms):
        return f"they cost {cost:.1f} ms per step, under the cost floor"
    regular = float(np.std(gaps)) <= policy.stall_period_cv * period_steps
    where = next((dict(s.location) for s in reversed(mine) if s.location), {})
    last = mine[-1]
    when = (f"every ~{period_steps:.0f} steps (~{period_s:.1f} s)" if regular
            else f"{len(mine)} times, ~{period_steps:.0f} steps apart (irregularly)")
    at = f"; its stack samples put it at {where['frame']}" if where else \
        "; no stack samples say where (enable them to name the line)"
    summary = (f"rank {rank} on {last.host} stalls {when}: {len(mine)} times in the last "
               f"{(window_id - mine[0].window_id + 1) * policy.window_s:.0f} s its peers waited "
               f"~{median(wait):.0f} ms for it in {group} ({cost:.1f} ms per step on average, "
               f"{cost / job_step_ms:.0%} of the step){at} - {CAUSES[Cause.SLOW_FUNCTION].reason}")
    evidence = {"stalls": len(mine), "group_stalls": len(stalls), "stall_ms": [round(w, 1) for w in wait],
                "period_steps": round(period_steps, 1), "period_s": round(period_s, 2), "regular": regular,
                "seqs": [s.seq for s in mine], "cost_ms_per_step": round(cost, 3), "location": where}
    return Finding(kind=Kind.STRAGGLER, cause=Cause.SLOW_FUNCTION, identity=f"stall|{rank}",
                   ranks=(rank,), hosts=(last.host,), gpus=(last.gpu,),
                   function=group, score=float(len(mine)), impact_ms=cost,
                   summary=summary, evidence=evidence)
