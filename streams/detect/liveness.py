"""Job-level detectors over RankWindows: iteration regression and hang.

Regression: two series kept for ``history_windows``: the job's step time per window
(median over ranks of each rank's 25th-percentile step: one-off checkpoint steps and
spikes covering part of a window do not move it, a sustained slowdown does) and its pace
(wall ms per completed iteration of the median rank, windows where a rank starts or ends
left out: code after the optimizer step is in no iteration, only the pace shows it).
Recent = median of the last persist_windows + 1 windows (one odd window does not
move it); best = 25th percentile of the windows before them (the minimum would be
biased low by noise). Regression when recent > best * (1 + regression_pct %)
and the difference is at least min_cost_ms_per_step, the series' own noise before
(mad_threshold x 1.4826 x MAD of its first differences / sqrt 2: a slow trend is no noise)
and, for the pace, its resolution (1/n per window of n iterations, at both ends); for the
pace, recent is the minimum of those windows (every one must show it: a window's pace has no
robustness to a one-off stall, the step time has its p25). The step time is checked first.
A regression also says whether CPUs explain it: the median rank's CPU ms and run-queue wait per
step over the same windows, recent against before (:func:`.cpu_evidence.job_cpu_note`).

Hang: consecutive windows in which no rank completed an iteration while the
collectors still send batches (heartbeats, at least every ``HEARTBEAT_S``): a job whose
ranks went silent has finished or died, it is not hung. A hang when they span max(hang_factor x
typical step, hang_floor_s) and batches kept arriving through the stall and recently. The ranks named
(:mod:`.hang`) are those that never entered the collective the others wait in, stalled or dead,
never the waiting ranks; if every rank is outside collectives the finding says so and names none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...schemas.causes import Cause
from ...schemas.records import FunctionComparison, RankWindow
from ...schemas.vocabulary import HEARTBEAT_S, Kind
from .columnar import MAD_TO_SIGMA
from .cpu_evidence import job_cpu_note
from .findings import Finding
from .hang import HangState, HangVerdict, RankSeen, Wait, verdict
from .model import COMM_PREFIX
from .policy import DetectionPolicy


@dataclass
class LivenessState:
    """Plain, bounded state (serializable)."""

    history: list[tuple[int, float]] = field(default_factory=list)  # (window, step ms)
    periods: list[tuple[int, float, float]] = field(default_factory=list)  # (window, wall ms per iteration, 1/iterations)
    cpu: list[tuple[int, float, float]] = field(default_factory=list)  # (window, run-queue wait, CPU ms per step)
    idle_windows: int = 0
    alive_windows: int = 0  # idle windows after the first one that brought a batch
    idle_since_alive: int = 0  # idle windows since the last one that brought a batch
    max_last_step: int = -1
    hang: HangState = field(default_factory=HangState)  # each rank's state, groups' members and seqs


def note_collectives(state: LivenessState, comparisons: list[FunctionComparison]) -> None:
    """Remember, per collective group, its members and each member's highest seq (hang culprits)."""
    state.hang.note_collectives(comparisons)


def regression(state: LivenessState, window_id: int, step_ms: float,
               policy: DetectionPolicy, period_ms: float = 0.0, period_steps: int = 0,
               cpu_per_step: tuple[float, float] = (-1.0, -1.0)) -> Finding | None:
    """The job's regression this window, if any, on either measure (see the module docstring):
    ``step_ms`` (the iteration's own time) or ``period_ms`` (wall time per completed iteration,
    ``period_steps`` iterations in the window; 0 for a window that is partial). ``cpu_per_step``:
    the window's median (run-queue wait, CPU) ms per step (:func:`.cpu_evidence.job_cpu_per_step`),
    compared before and recently to say whether CPUs explain a regression."""
    if step_ms > 0:
        state.history = (state.history + [(window_id, step_ms)])[-policy.history_windows:]
    if period_ms > 0 and period_steps > 0:
        state.periods = (state.periods + [(window_id, period_ms, 1.0 / period_steps)])[-policy.history_windows:]
    if cpu_per_step[0] >= 0:
        state.cpu = (state.cpu + [(window_id, *cpu_per_step)])[-policy.history_windows:]
    if step_ms > 0:
        found = _regressed([v for _, v in state.history], [0.0] * len(state.history), policy)
        if found is not None:
            return _regression_finding(*found, policy, "recent steps take", _cpu_change(state, [w for w, _ in state.history], found, policy))
    if period_ms > 0 and period_steps > 0:
        found = _regressed([v for _, v, _ in state.periods], [q for _, _, q in state.periods], policy,
                           every_window=True)
        if found is not None:
            return _regression_finding(*found, policy, "each iteration (the time between iterations included: "
                                       "code after the optimizer step, logging, syncs) takes",
                                       _cpu_change(state, [w for w, _, _ in state.periods], found, policy))
    return None


def _cpu_change(state: LivenessState, windows: Sequence[int], found: tuple[float, float, float, float],
                policy: DetectionPolicy) -> tuple[str, dict[str, Any]]:
    """:func:`.cpu_evidence.job_cpu_note` over the windows of the regressed series: its last
    persist_windows + 1 (recent) and those before (median of each)."""
    k = policy.persist_windows + 1
    recent_ids = set(windows[-k:])
    cpu = [(w, wait, c) for w, wait, c in state.cpu if w <= windows[-1]]
    recent = [(wait, c) for w, wait, c in cpu if w in recent_ids]
    before = [(wait, c) for w, wait, c in cpu if w < min(recent_ids)]
    if not recent or not before:
        return "", {}

    def median(rows: list[tuple[float, float]]) -> tuple[float, float]:
        cpus = [c for _, c in rows if c > 0]
        return float(np.median([w for w, _ in rows])), (float(np.median(cpus)) if cpus else -1.0)

    return job_cpu_note(median(before), median(recent), found[0] - found[1], policy)


def _regressed(values: list[float], quanta: list[float], policy: DetectionPolicy,
               every_window: bool = False) -> tuple[float, float, float, float] | None:
    """(recent, best, noise, required excess) when the series regressed. Recent = median of the last
    persist_windows + 1 values, best = 25th percentile of the ones before them; the excess
    must pass ``regression_pct`` of best, ``min_cost_ms_per_step``, the series' own
    window-to-window noise before (``mad_threshold`` x 1.4826 x MAD) and its resolution (a
    per-window rate of n iterations moves by 1/n with the window's edges, ``quanta``: the
    largest of the recent windows' plus the largest of the earlier ones'). ``every_window``:
    recent is the minimum of those windows (the pace: see the comment below)."""
    k = policy.persist_windows + 1
    if len(values) < k + policy.regression_min_past:
        return None
    past = np.asarray(values[:-k], dtype=np.float64)
    best = float(np.percentile(past, policy.regression_best_percentile))
    # the pace (window / iterations) has no robustness inside a window (the step time has its
    # p25): a one-off stall of a second spanning a window edge slows two windows, so every
    # recent window must show a pace regression (their minimum), not most (the median)
    recent = float(np.min(values[-k:]) if every_window else np.median(values[-k:]))
    noise = policy.mad_threshold * MAD_TO_SIGMA * _trend_free_mad(past)
    excess = recent - best
    floor = max(policy.min_cost_ms_per_step, noise, best * (max(quanta[-k:]) + max(quanta[:-k])))
    if recent <= best * (1 + policy.regression_pct / 100) or excess < floor:
        return None
    return recent, best, noise, max(floor, best * policy.regression_pct / 100)


def _trend_free_mad(past: np.ndarray) -> float:
    """The series' window-to-window noise as a MAD that a slow trend does not inflate: the MAD of
    its first differences over sqrt(2) (the same value as the MAD of the values for independent
    noise). The MAD of the values themselves counts a creep as noise: in the labelled suite
    (benchmarks/detection.py, creep-32r: +4 % per window) the regression was found in two windows,
    then the creep already in the past windows raised the noise above the excess and it was never
    raised. Fewer than 3 values: the MAD of the values."""
    if len(past) < 3:
        return float(np.median(np.abs(past - np.median(past))))
    d = np.diff(past)
    return float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2.0)


def _regression_finding(recent: float, best: float, noise: float, required: float, policy: DetectionPolicy,
                        what: str, cpu: tuple[str, dict[str, Any]] = ("", {})) -> Finding:
    excess = recent - best
    k = policy.persist_windows + 1
    summary = (f"iteration time regressed: {what} {recent:.1f} ms vs the best {best:.1f} ms "
               f"(+{100 * excess / best:.0f}%) on all ranks with no single culprit; "
               + (f"{cpu[0]}; " if cpu[0] else "") + "a synchronized profile was requested")
    evidence = {"recent_step_ms": round(recent, 3), "best_step_ms": round(best, 3),
                "pct": round(100 * excess / best, 2), "windows": k, "noise_ms": round(noise, 3),
                "required_ms": round(required, 3),
                "measure": "step" if what.startswith("recent steps") else "period", **cpu[1]}
    return Finding(kind=Kind.REGRESSION, cause=Cause.REGRESSION, identity="regression", ranks=(), hosts=(),
                   gpus=(), function="iteration", score=float(recent / best), impact_ms=float(excess),
                   summary=summary, evidence=evidence, extra_windows=1)


def hang(state: LivenessState, rank_windows: dict[int, RankWindow], policy: DetectionPolicy) -> Finding | None:
    steps = sum(int(rw.get("steps", 0)) for rw in rank_windows.values())
    state.hang.note_window(rank_windows)
    for rw in rank_windows.values():
        state.max_last_step = max(state.max_last_step, int(rw.get("last_step", -1)))
    if steps > 0 or not rank_windows or _communicated(rank_windows):
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
    if not _still_reporting(state, stalled_s, policy):
        return None  # the ranks stopped reporting: the job ended (or died), it is not hung
    typical_s = float(np.median([v for _, v in state.history])) / 1000
    if stalled_s < max(policy.hang_factor * typical_s, policy.hang_floor_s):
        return None
    return _hang_finding(state, rank_windows, stalled_s, policy)


def _communicated(rank_windows: dict[int, RankWindow]) -> bool:
    """Every rank of the window completed a collective in it: the job moved through its
    communication, so it is not hung there, even without a finished iteration (a stall that
    ended: the waiting ranks' calls completed, and the job went on to its final barrier). A
    hung job cannot show this: the rank the others wait for completes nothing, and they complete
    nothing while they wait. Also an evaluation pass that all-reduces its metrics (no optimizer
    step, so no iteration) is no hang. A GPU rank's collectives complete when their stop events
    do (entry markers until then), a CPU rank's when the call returns (decisions table,
    docs/detection.md: "a stall that ends is no longer a hang")."""
    return all(any(str(f).startswith(COMM_PREFIX) for f in rw.get("functions") or [])
               for rw in rank_windows.values())


def _still_reporting(state: LivenessState, stalled_s: float, policy: DetectionPolicy) -> bool:
    """Heartbeats through the stall (at least ``hang_heartbeat_share``, half, of those expected)
    and recently (within ``hang_recent_heartbeats`` intervals): a hung job's collectors keep
    sending; a finished job's last flush, even a late one, is one batch."""
    expected = stalled_s / HEARTBEAT_S
    recent = state.idle_since_alive * policy.window_s <= policy.hang_recent_heartbeats * HEARTBEAT_S
    return recent and state.alive_windows >= max(1.0, expected * policy.hang_heartbeat_share)


def _hang_finding(state: LivenessState, rank_windows: dict[int, RankWindow], stalled_s: float,
                  policy: DetectionPolicy) -> Finding:
    v = verdict(state.hang, policy.window_s, policy.dead_after_heartbeats)
    seen = state.hang.ranks
    last_fn = {str(r): seen[r].last_function or "?" for r in v.culprits}
    wait = next((w for w in v.waits if w.missing & set(v.culprits)), v.waits[0] if v.waits else None)
    summary = f"job hung: no iteration finished for {stalled_s:.0f} s; " + _hang_words(v, wait, last_fn, state, policy.window_s)
    evidence = {"stalled_s": stalled_s, "pending_group": wait.group if wait else "",
                "pending_seq": wait.seq if wait else -1, "collective": wait.collective if wait else "",
                "waiting_ranks": wait.waiting if wait else [], "last_functions": last_fn,
                "dead_ranks": v.dead, "stalled_ranks": [r for r in v.culprits if r not in v.dead],
                "outside_collectives": v.everyone_outside, "last_step": state.max_last_step}
    shown = sorted(seen) if v.everyone_outside else v.culprits
    evidence["stacks"] = {str(r): seen[r].stack for r in shown if r in seen and seen[r].stack}
    flight = {str(r): s.flight for r, s in sorted(seen.items()) if s.flight}
    if flight:  # torch's Flight Recorder, read by the collectors before any watchdog fired
        evidence["flight_recorder"] = flight
        summary += " " + _flight_words(flight)
    if v.everyone_outside:
        evidence["last_functions"] = {str(r): s.last_function or "?" for r, s in sorted(seen.items())}
    return Finding(kind=Kind.HANG, cause=Cause.HANG, identity="hang", ranks=tuple(v.culprits),
                   hosts=tuple(sorted({seen[r].host for r in v.culprits})),
                   gpus=tuple(sorted({seen[r].gpu for r in v.culprits})),
                   function=next(iter(last_fn.values()), ""), score=float(stalled_s),
                   impact_ms=float(stalled_s * 1000), summary=summary, evidence=evidence, immediate=True)


def _flight_words(flight: dict[str, list[dict]]) -> str:
    """The Flight Recorder's view of the hang, in one bracket: each rank's oldest pending entry."""
    parts = []
    for r, entries in list(flight.items())[:4]:
        e = entries[0]
        timeout = f" of its {e['timeout_ms'] / 1000:.0f} s timeout" if int(e.get("timeout_ms", -1)) > 0 else ""
        parts.append(f"rank {r}: {e['op']} #{e['seq']} on group {e['pg_desc'] or e['process_group']} "
                     f"{e['state']} for {int(e['age_ms']) / 1000:.0f} s{timeout}, the group's last completed #"
                     f"{e['last_completed_seq']}")
    more = f"; {len(flight) - 4} more ranks" if len(flight) > 4 else ""
    return "[Flight Recorder: " + "; ".join(parts) + more + "]"


def _hang_words(v: HangVerdict, wait: Wait | None, last_fn: dict[str, str], state: LivenessState,
                window_s: float) -> str:
    seen = state.hang.ranks
    if v.everyone_outside:
        where = ", ".join(f"rank {r} in {s.last_function or '?'}{_now_at(s)}" for r, s in sorted(seen.items())[:8])
        return f"every rank is stuck outside collectives ({where})"
    if not v.culprits:
        return "every rank is inside a collective and none waits for a rank outside one (mismatched collectives?)"
    waiters = ", ".join(str(r) for r in wait.waiting[:8]) + (" ..." if len(wait.waiting) > 8 else "") if wait else ""
    where = f"{wait.collective} seq {wait.seq} of group {wait.group}" if wait else ""
    parts = []
    stalled = [r for r in v.culprits if r not in v.dead]
    if stalled:
        who = ", ".join(f"rank {r} (stalled in {last_fn[str(r)]}{_now_at(seen[r])})" for r in stalled[:8])
        parts.append(f"{who} never entered {where} that ranks {waiters} wait in" if wait
                     else f"{who} stalled outside collectives")
    if v.dead:
        silent_s = max(seen[r].silent_windows for r in v.dead) * window_s
        who = ", ".join(f"rank {r} (last in {last_fn[str(r)]})" for r in v.dead[:8])
        parts.append(f"{who}: process died / stopped reporting (no batch for {silent_s:.0f} s)")
        if wait and not stalled:
            parts.append(f"ranks {waiters} wait in {where}")
    return "; ".join(parts)


def _now_at(seen: RankSeen) -> str:
    """``'; now at train.py:88 step `time.sleep(60)` (95 % of samples)'`` from the rank's
    latest stack samples; '' when it has none."""
    if not seen.stack:
        return ""
    top = seen.stack[0]
    return f"; now at {top['frame']} ({100 * top['share']:.0f} % of samples)"
