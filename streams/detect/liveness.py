"""Job-level detectors over RankWindows: iteration regression and hang.

Regression: the job's step time per window (median over ranks of each rank's
25th-percentile step: one-off checkpoint steps and spikes covering part of a window
do not move it, a sustained slowdown does) is kept for ``history_windows``.
Recent = median of the last persist_windows + 1 windows (one odd window does not
move it); best = 25th percentile of the windows before them (the minimum would be
biased low by noise). Regression when recent > best * (1 + regression_pct %)
and the difference is at least min_cost_ms_per_step.

Hang: consecutive windows in which no rank completed an iteration while the
collectors still send batches (heartbeats, at least every ``HEARTBEAT_S``): a job whose
ranks went silent has finished or died, it is not hung. A hang when they span max(hang_factor x
typical step, hang_floor_s) and batches kept arriving through the stall and recently. The ranks named are
those that never reached the pending collective: in the group most ranks are
pending in, the members whose highest seq is below the group's highest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...schemas.causes import Cause
from ...schemas.vocabulary import HEARTBEAT_S, Kind
from .findings import Finding
from .policy import DetectionPolicy


@dataclass
class LivenessState:
    """Plain, bounded state (serializable)."""

    history: list[tuple[int, float]] = field(default_factory=list)  # (window, step ms)
    idle_windows: int = 0
    alive_windows: int = 0  # idle windows after the first one that brought a batch
    idle_since_alive: int = 0  # idle windows since the last one that brought a batch
    max_last_step: int = -1
    group_seq: dict[str, dict[int, int]] = field(default_factory=dict)  # group -> rank -> max seq


def note_collectives(state: LivenessState, comparisons: list[dict]) -> None:
    """Remember, per collective group, each member's highest seq (for hang culprits)."""
    for c in comparisons:
        if c.get("members"):
            group = c["function"].split(":", 2)[-1]
            seqs = state.group_seq.setdefault(group, {})
            for r, s in zip(c["members"], c["member_max_seq"], strict=False):
                seqs[int(r)] = max(int(s), seqs.get(int(r), -1))


def regression(state: LivenessState, window_id: int, step_ms: float,
               policy: DetectionPolicy) -> Finding | None:
    if step_ms > 0:
        state.history = (state.history + [(window_id, step_ms)])[-policy.history_windows:]
    k = policy.persist_windows + 1
    if len(state.history) < k + 2 or step_ms <= 0:
        return None
    best = float(np.percentile([v for _, v in state.history[:-k]], 25))
    recent = float(np.median([v for _, v in state.history[-k:]]))
    excess = recent - best
    if recent <= best * (1 + policy.regression_pct / 100) or excess < policy.min_cost_ms_per_step:
        return None
    summary = (f"iteration time regressed: recent steps take {recent:.1f} ms vs the best {best:.1f} ms "
               f"(+{100 * excess / best:.0f}%) on all ranks with no single culprit; a synchronized profile "
               f"was requested")
    evidence = {"recent_step_ms": round(recent, 3), "best_step_ms": round(best, 3),
                "pct": round(100 * excess / best, 2), "windows": k}
    return Finding(kind=Kind.REGRESSION, cause=Cause.REGRESSION, identity="regression", ranks=(), hosts=(),
                   gpus=(), function="iteration", score=float(recent / best), impact_ms=float(excess),
                   summary=summary, evidence=evidence, extra_windows=1)


def hang(state: LivenessState, rank_windows: dict[int, dict], policy: DetectionPolicy) -> Finding | None:
    steps = sum(int(rw.get("steps", 0)) for rw in rank_windows.values())
    for rw in rank_windows.values():
        state.max_last_step = max(state.max_last_step, int(rw.get("last_step", -1)))
    if steps > 0 or not rank_windows:
        state.idle_windows = state.alive_windows = state.idle_since_alive = 0
        return None
    if not state.history:
        return None  # never saw progress: a job still starting is not hung
    batches = sum(int(rw.get("batches", 0)) for rw in rank_windows.values())
    if state.idle_windows > 0 and batches:  # the first idle window may hold the last flush
        state.alive_windows += 1
    state.idle_since_alive = 0 if batches else state.idle_since_alive + 1
    state.idle_windows += 1
    stalled_s = state.idle_windows * policy.window_s
    if not _still_reporting(state, stalled_s, policy.window_s):
        return None  # the ranks stopped reporting: the job ended (or died), it is not hung
    typical_s = float(np.median([v for _, v in state.history])) / 1000
    if stalled_s < max(policy.hang_factor * typical_s, policy.hang_floor_s):
        return None
    return _hang_finding(state, rank_windows, stalled_s)


def _still_reporting(state: LivenessState, stalled_s: float, window_s: float) -> bool:
    """Heartbeats through the stall (at least half of those expected) and recently: a hung
    job's collectors keep sending; a finished job's last flush, even a late one, is one batch."""
    expected = stalled_s / HEARTBEAT_S
    recent = state.idle_since_alive * window_s <= 1.5 * HEARTBEAT_S
    return recent and state.alive_windows >= max(1.0, expected / 2)


def hang_culprits(state: LivenessState, rank_windows: dict[int, dict]) -> tuple[list[int], str, int]:
    """Ranks behind the front of their own pending group: the front is the highest seq any
    member reached (pending or reported); a rank blocked inside the front call is a victim,
    one whose latest call in that group is older never reached it. (ranks, group, seq)."""
    front: dict[str, int] = {}
    for g, seqs in state.group_seq.items():
        front[g] = max(seqs.values(), default=-1)
    for rw in rank_windows.values():
        g = rw.get("pending_group", "")
        if g:
            front[g] = max(front.get(g, -1), int(rw.get("pending_seq", -1)))
    culprits = sorted(int(r) for r, rw in rank_windows.items() if rw.get("pending_group")
                      and int(rw.get("pending_seq", -1)) < front[rw["pending_group"]])
    if not culprits:
        return [], "", -1
    group = rank_windows[culprits[0]]["pending_group"]
    return culprits, group, front[group]


def _hang_finding(state: LivenessState, rank_windows: dict[int, dict], stalled_s: float) -> Finding:
    culprits, group, top_seq = hang_culprits(state, rank_windows)
    last_fn = {str(r): rank_windows.get(r, {}).get("last_function", "?") for r in culprits}
    hosts = tuple(sorted({rank_windows.get(r, {}).get("host", "?") for r in culprits}))
    who = ", ".join(f"rank {r} (last in {last_fn[str(r)]})" for r in culprits[:8]) or "unknown ranks"
    summary = (f"job hung: no iteration finished for {stalled_s:.0f} s; {who} never reached collective "
               f"seq {top_seq} of group {group or '?'} that the other ranks are waiting in")
    evidence = {"stalled_s": stalled_s, "pending_group": group, "pending_seq": top_seq,
                "last_functions": last_fn, "last_step": state.max_last_step}
    return Finding(kind=Kind.HANG, cause=Cause.HANG, identity="hang", ranks=tuple(culprits), hosts=hosts,
                   gpus=tuple(sorted({int(rank_windows.get(r, {}).get("gpu", -1)) for r in culprits})),
                   function=next(iter(last_fn.values()), ""), score=float(stalled_s),
                   impact_ms=float(stalled_s * 1000), summary=summary, evidence=evidence, immediate=True)
