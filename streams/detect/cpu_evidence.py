"""CPU evidence of one rank against its peers, and where its extra time goes in the code.

From the RankWindow v2 fields the collectors fill from ``/proc`` and the stack sampler:

* :func:`cpu_verdict`: did the rank wait for a CPU more than its peers? Yes
  (``contended``) when, against a baseline from the other ranks that report the same value,
    - its run-queue wait per step is higher by >= max(``cpu_wait_min_ms``,
      ``cpu_wait_share`` x the rank's excess step time), or
    - its involuntary context switches per step are >= ``switch_ratio`` x the baseline and
      >= ``switch_min_per_step`` more, or
    - its host's steal share is >= ``steal_excess_pct`` points higher.
  The baseline of wait and switches is the larger of the peers' median per step and what
  the rank's own CPU time per step would get at the peers' median rate per CPU-ms: on a
  busy host every thread waits in proportion to the CPU it asks for, so a rank whose own
  code does more work (a slow optimizer step) waits more per step without anything
  competing for its CPU; contention is waiting more *per unit of work*. CPU ms per step
  = ``cpu_ratio`` x the window / ``steps``.
  **Own work explains the wait**: when the wait or switch test fired (not steal) but the
  rank's own CPU time per step exceeds the peers' median by >= max(``cpu_wait_min_ms``,
  ``cpu_work_share`` x the excess step time), the verdict is ``not_contended``: the rank is
  slow because of CPU work it does itself, and on a host with more runnable threads than
  cores such work waits more than in proportion (the scheduler favours threads that sleep,
  as peers waiting in collectives do, over one that burns its slice), so the linear
  baseline above underestimates it (decisions table, docs/detection.md: "own work explains
  the wait"). A GPU rank's launch thread is judged the same way; its device is not.
  ``not_contended`` when at least one of these was measured on the rank and its peers and
  none fired; ``unavailable`` when none could be (old collectors, no ``/proc``, no peers).
* :func:`job_cpu_per_step` and :func:`job_cpu_note`: for a job-wide regression, whether the
  median rank's CPU time or run-queue wait per step rose with it (its own code does more, or
  its hosts' CPUs are oversubscribed) or neither.
* :func:`frame_location`: the sampled user-code frame where the rank spends the most
  time per step beyond its peers ("rank 2 spends 12 ms/step in train.py:88 step `x.clone()`").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .policy import DetectionPolicy

CONTENDED = "contended"
NOT_CONTENDED = "not_contended"
UNAVAILABLE = "unavailable"
WHERE_KIND = 1  # stack frames: innermost frame in user code
UNAVAILABLE_NOTE = "CPU evidence unavailable (collector without /proc readings)"


@dataclass(frozen=True)
class CpuVerdict:
    verdict: str
    note: str  # plain words for the incident
    evidence: dict[str, Any] = field(default_factory=dict)


def _peer_median(rank: int, rank_windows: Mapping[int, Mapping[str, Any]], key: str) -> float:
    vals = [float(rw.get(key, -1)) for r, rw in rank_windows.items() if r != rank]
    vals = [v for v in vals if v >= 0]
    return float(np.median(vals)) if vals else -1.0


def _cpu_ms_per_step(rw: Mapping[str, Any], window_ms: float) -> float:
    ratio, steps = float(rw.get("cpu_ratio", -1)), int(rw.get("steps", 0))
    return ratio * window_ms / steps if ratio > 0 and steps > 0 else -1.0


def _baseline(rank: int, rank_windows: Mapping[int, Mapping[str, Any]], key: str, peers: float,
              window_ms: float) -> tuple[float, str]:
    """max(peers' median per step, the rank's CPU ms per step x the peers' median per CPU ms)
    and words for the second when it is the larger (see the module docstring)."""
    mine_cpu = _cpu_ms_per_step(rank_windows.get(rank, {}), window_ms)
    rates = []
    for r, rw in rank_windows.items():
        cpu, v = _cpu_ms_per_step(rw, window_ms), float(rw.get(key, -1))
        if r != rank and cpu > 0 and v >= 0:
            rates.append(v / cpu)
    if mine_cpu <= 0 or not rates:
        return peers, ""
    expected = float(np.median(rates)) * mine_cpu
    if expected <= peers:
        return peers, ""
    return expected, f" ({expected:.1f} expected for its {mine_cpu:.1f} ms of CPU/step at its peers' rate)"


def _own_work(rank: int, rank_windows: Mapping[int, Mapping[str, Any]], window_ms: float, excess_ms: float,
              policy: DetectionPolicy) -> dict[str, float]:
    """The rank's and its peers' CPU ms per step when its extra CPU time explains its waiting
    (>= max(cpu_wait_min_ms, cpu_work_share x excess)); {} otherwise or unmeasured."""
    mine = _cpu_ms_per_step(rank_windows.get(rank, {}), window_ms)
    peers = [c for r, rw in rank_windows.items() if r != rank
             for c in (_cpu_ms_per_step(rw, window_ms),) if c > 0]
    if mine <= 0 or not peers:
        return {}
    peer = float(np.median(peers))
    if mine - peer < max(policy.cpu_wait_min_ms, policy.cpu_work_share * excess_ms):
        return {}
    return {"cpu_ms_per_step": round(mine, 3), "peer_cpu_ms_per_step": round(peer, 3)}


def cpu_verdict(rank: int, rank_windows: Mapping[int, Mapping[str, Any]], excess_ms: float,
                policy: DetectionPolicy) -> CpuVerdict:
    """See the module docstring; ``excess_ms``: the rank's excess step time over its peers."""
    rw = rank_windows.get(rank, {})
    ev: dict[str, Any] = {}
    measured, fired = False, []
    window_ms = policy.window_s * 1000.0
    for key in ("runqueue_wait_ms_per_step", "involuntary_switches_per_step", "steal_pct", "cpu_ratio"):
        mine, peers = float(rw.get(key, -1)), _peer_median(rank, rank_windows, key)
        if mine < 0 or peers < 0:
            continue
        ev[key], ev["peer_" + key] = round(mine, 3), round(peers, 3)
        if key == "runqueue_wait_ms_per_step":
            measured = True
            base, why = _baseline(rank, rank_windows, key, peers, window_ms)
            if why:
                ev["expected_" + key] = round(base, 3)
            if mine - base >= max(policy.cpu_wait_min_ms, policy.cpu_wait_share * excess_ms):
                fired.append(f"run-queue wait {mine:.1f} ms/step vs {peers:.1f} ms on its peers{why}")
        elif key == "involuntary_switches_per_step":
            measured = True
            base, why = _baseline(rank, rank_windows, key, peers, window_ms)
            if why:
                ev["expected_" + key] = round(base, 3)
            if mine >= policy.switch_ratio * base and mine - base >= policy.switch_min_per_step:
                fired.append(f"{mine:.0f} involuntary context switches/step vs {peers:.0f} on its peers{why}")
        elif key == "steal_pct":
            measured = True
            if mine - peers >= policy.steal_excess_pct:
                fired.append(f"CPU steal {mine:.0f}% vs {peers:.0f}% on its peers")
    for key in ("major_faults", "load1"):
        if float(rw.get(key, -1)) >= 0:
            ev[key] = rw[key]
    if fired and not any(f.startswith("CPU steal") for f in fired):
        own = _own_work(rank, rank_windows, window_ms, excess_ms, policy)
        if own:
            ev.update(own)
            return CpuVerdict(NOT_CONTENDED, "it waited for a CPU more than its peers (" + "; ".join(fired)
                              + f"), but with work of its own: {own['cpu_ms_per_step']:.1f} ms of CPU/step vs "
                              f"{own['peer_cpu_ms_per_step']:.1f} ms on its peers; its own code is slow, "
                              "not a competitor for its CPU", ev)
    if fired:
        return CpuVerdict(CONTENDED, "it waited for a CPU more than its peers: " + "; ".join(fired), ev)
    if measured:
        expected = ev.get("expected_runqueue_wait_ms_per_step")
        scaled = f", {expected} expected for the CPU time it used" if expected is not None else ""
        return CpuVerdict(NOT_CONTENDED, "no sign it waited for a CPU more than its peers "
                          f"(run-queue wait {ev.get('runqueue_wait_ms_per_step', -1)} vs "
                          f"{ev.get('peer_runqueue_wait_ms_per_step', -1)} ms/step{scaled})", ev)
    return CpuVerdict(UNAVAILABLE, UNAVAILABLE_NOTE, ev)


def _where_per_step(rw: Mapping[str, Any]) -> dict[str, float]:
    """Samples per completed step of each user-code frame of one rank's window."""
    steps = int(rw.get("steps", 0))
    if steps <= 0:
        return {}
    frames = zip(rw.get("top_frames") or [], rw.get("top_frame_samples") or [],
                 rw.get("top_frame_kinds") or [], strict=False)
    return {f: n / steps for f, n, k in frames if k == WHERE_KIND}


def frame_location(rank: int, rank_windows: Mapping[int, Mapping[str, Any]], policy: DetectionPolicy) -> dict[str, Any]:
    """The user-code frame where ``rank`` spends the most extra time per step vs its peers'
    median for the same frame (0 where a peer never sampled it), beyond sampling noise: of
    the frames with an excess >= ``location_min_ms``, the one whose excess is largest after
    subtracting ``location_noise_sigmas`` x its sampling noise (:func:`_sampling_noise`).
    A frame the peers also spend much time in (a collective they all wait in) shows a
    difference of two large sample counts, noisy; a frame only this rank runs (a checkpoint
    save every other step) shows a small count against none, clear. {} when no frame
    qualifies or there are no samples."""
    rw = rank_windows.get(rank, {})
    hz = float(rw.get("stack_hz", 0.0))
    mine = _where_per_step(rw)
    if hz <= 0 or not mine:
        return {}
    peers = [_where_per_step(p) for r, p in rank_windows.items() if r != rank and p.get("stack_hz", 0) > 0]
    ms, steps = 1000.0 / hz, int(rw.get("steps", 0))
    best: dict[str, Any] = {}
    best_score = -np.inf
    for frame, per_step in mine.items():
        peer = float(np.median([p.get(frame, 0.0) for p in peers])) if peers else 0.0
        extra = (per_step - peer) * ms
        if extra < policy.location_min_ms:
            continue
        noise = _sampling_noise(per_step, peer, steps, len(peers)) * ms
        score = extra - policy.location_noise_sigmas * noise
        if score > best_score:
            best_score = score
            best = {"frame": frame, "ms_per_step": round(per_step * ms, 2),
                    "peer_ms_per_step": round(peer * ms, 2), "extra_ms_per_step": round(extra, 2),
                    "noise_ms_per_step": round(noise, 2), "peers_sampled": len(peers)}
    return best


def _sampling_noise(mine: float, peer: float, steps: int, peers: int) -> float:
    """Standard deviation, in samples per step, of (the rank's samples per step - the peers'
    median) for one frame: sample counts are Poisson (variance = count), the rank's over its
    ``steps``; the median of ``peers`` counts at the same rate has about pi/2 / peers times
    one count's variance (peers' windows taken as long as the rank's)."""
    if steps <= 0:
        return 0.0
    var = mine * steps + (math.pi / 2) * peer * steps / max(peers, 1)
    return math.sqrt(var) / steps


def job_cpu_per_step(rank_windows: Mapping[int, Mapping[str, Any]], window_ms: float) -> tuple[float, float]:
    """(The median rank's run-queue wait ms per step, its CPU ms per step) of one window, each
    over the ranks that measured it; -1 where none did (old collectors, no ``/proc``)."""
    waits = [float(rw.get("runqueue_wait_ms_per_step", -1)) for rw in rank_windows.values()]
    cpus = [_cpu_ms_per_step(rw, window_ms) for rw in rank_windows.values()]
    waits, cpus = [w for w in waits if w >= 0], [c for c in cpus if c > 0]
    return (float(np.median(waits)) if waits else -1.0), (float(np.median(cpus)) if cpus else -1.0)


def job_cpu_note(before: tuple[float, float], recent: tuple[float, float], excess_ms: float,
                 policy: DetectionPolicy) -> tuple[str, dict[str, Any]]:
    """Words and evidence on a job-wide slowdown of ``excess_ms`` per step from the median rank's
    (run-queue wait, CPU) ms per step before and recently (:func:`job_cpu_per_step`): its own
    code doing more CPU work per step (>= max(``cpu_wait_min_ms``, ``cpu_work_share`` x the
    excess) more), else its CPUs oversubscribed (run-queue wait up by >= max(``cpu_wait_min_ms``,
    ``cpu_wait_share`` x the excess)), else neither: the time went to something the CPU
    readings do not show (GPU work, I/O, communication, sleeps). ("", {}) when unmeasured."""
    (wait0, cpu0), (wait1, cpu1) = before, recent
    if wait0 < 0 or wait1 < 0:
        return "", {}
    ev: dict[str, Any] = {"runqueue_wait_ms_per_step": round(wait1, 3), "best_runqueue_wait_ms_per_step": round(wait0, 3)}
    if cpu0 > 0 and cpu1 > 0:
        ev.update(cpu_ms_per_step=round(cpu1, 3), best_cpu_ms_per_step=round(cpu0, 3))
        if cpu1 - cpu0 >= max(policy.cpu_wait_min_ms, policy.cpu_work_share * excess_ms):
            ev["cpu_basis"] = "own work"
            return (f"each step does more CPU work of its own ({cpu0:.1f} -> {cpu1:.1f} ms of CPU/step, "
                    "median rank): the job's code does more, not a shortage of CPUs"), ev
    if wait1 - wait0 >= max(policy.cpu_wait_min_ms, policy.cpu_wait_share * excess_ms):
        ev["cpu_basis"] = "oversubscribed"
        return (f"every rank waits longer for a CPU (run-queue wait {wait0:.1f} -> {wait1:.1f} ms/step, "
                "median rank): its hosts' CPUs are oversubscribed (other processes, data-loader workers, "
                "too many threads)"), ev
    ev["cpu_basis"] = "unchanged"
    return (f"its CPU time and run-queue wait per step did not change enough to explain it (wait {wait0:.1f} -> "
            f"{wait1:.1f} ms/step): the time goes to waiting these do not show (GPU work, I/O, communication, "
            "sleeps)"), ev


def top_frames(rw: Mapping[str, Any], n: int = 3) -> list[dict[str, Any]]:
    """The rank's ``n`` most sampled user-code frames with their share of its samples."""
    total = max(1, int(rw.get("stack_samples", 0)))
    frames = zip(rw.get("top_frames") or [], rw.get("top_frame_samples") or [],
                 rw.get("top_frame_kinds") or [], strict=False)
    where = [(f, s) for f, s, k in frames if k == WHERE_KIND]
    return [{"frame": f, "samples": int(s), "share": round(s / total, 3)} for f, s in where[:n]]
