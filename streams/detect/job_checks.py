"""Job-wide checks of one evaluated window: iteration regression and hang.

Both run on :mod:`.liveness` state kept across windows (step-time history, stall
counters, each member's highest collective seq). A regression triggers one
synchronized PROFILE request on ``pt.control`` (start ``profile_request_ahead_steps``
past the latest step seen, ``profile_request_duration_s`` long, at most one per
``profile_request_cooldown_windows``). It is reported as a finding of its own only when
the window's root causes do not explain it: the ``explains_ms`` of the findings that
persist (seen in the previous window too) plus that of still-open incidents not seen in
this window must cover ``regression_explained_share`` of it; otherwise it is folded into
them (as are its first windows after a root cause cleared, while that incident is open).
A regression waits one window longer than other findings (``extra_windows``), so that a
root cause seen for the first time in the same window can open first and explain it, and so
that a job's noise must hold a window more to pass for one. When its excess is at least
``strong_regression`` times what a regression needs (the job's noise, ``regression_pct``,
the min cost) and the window's new candidates could not explain it even once they persist (a
job-wide slowdown with no culprit), there is nothing to wait for and it does not wait; a
weaker excess waits the extra window, which a noisy healthy job's jitter does not survive
(docs/detection.md, decisions: "STRONG_REGRESSION").
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

from ...schemas.causes import SHAPE
from ...schemas.records import Control, FunctionComparison, RankWindow
from ...schemas.vocabulary import CONTROL_VERSION, ControlCommand
from .cpu_evidence import job_cpu_per_step
from .findings import Finding
from .incidents import Track, advice, explained_ms, persisting
from .liveness import LivenessState, hang, note_collectives, regression
from .model import to_ms
from .policy import DetectionPolicy
from .shape import stage_groups
from .window import step_ms


class JobChecks:
    """Regression and hang detectors of one job, with their state; see the module docstring."""

    def __init__(self, job: str, policy: DetectionPolicy):
        self.job, self.policy = job, policy
        self.live = LivenessState()
        self.last_profile_window: int | None = None
        # each stage's work against the other stages' before the steady state: (function, group) -> ratios
        self.early_stages: dict[tuple[str, str], list[float]] = {}

    def observe(self, comparisons: list[FunctionComparison]) -> None:
        """Remember each collective member's highest seq (hang culprits) and, until the job has
        a steady state, how much work each pipeline stage does against the others (:meth:`shape`)."""
        note_collectives(self.live, comparisons)
        if self.steady():
            return
        for c, g, others in stage_groups(comparisons):
            if others > 0:
                self.early_stages.setdefault((c["function"], str(g["key"])), []).append(
                    float(g["median_ms_per_step"]) / others)

    def shape(self, f: Finding) -> bool:
        """``f`` (of a :data:`...schemas.causes.SHAPE` cause) is the job's shape, not a change: seen
        before the job has a steady state, or a stage imbalance whose stage already did clearly
        more work than the others then (its median ratio over those windows above 1 +
        ``min_excess``, the margin a rank's own excess must pass). A pipeline's last stage that
        holds the output layer and the loss does more work from the first step on a GPU and on
        a CPU alike; its ratio wanders around the finding's threshold from window to window, so
        a stage imbalance seen only after the start would come and go as a false incident
        (decisions table, docs/detection.md: "shape is advice, a change is an incident")."""
        if f.cause not in SHAPE:
            return False
        if not self.steady():
            return True
        early = self.early_stages.get((f.function, str(f.evidence.get("group", ""))), [])
        return bool(early) and float(np.median(early)) >= 1 + self.policy.min_excess

    def regression(self, wid: int, now: int, rank_windows: dict[int, RankWindow], findings: list[Finding],
                   tracks: dict[str, Track], partial: bool = False) -> tuple[Finding | None, list[Control]]:
        """(The regression finding unless ``findings`` and open ``tracks`` explain it,
        the PROFILE requests it triggers). ``partial``: a rank started or ended inside this
        window, so its iterations per window say nothing of the job's pace."""
        period, n = (0.0, 0) if partial else iteration_period(rank_windows, self.policy.window_ms)
        reg = regression(self.live, wid, step_ms(rank_windows, quantile=self.policy.regression_step_quantile), self.policy,
                         period_ms=period, period_steps=n,
                         cpu_per_step=job_cpu_per_step(rank_windows, self.policy.window_s * 1000.0))
        if reg is None:
            return None, []
        controls = self._profile(wid, now, reg)
        explained = explained_ms(tracks, findings, reg.identity, self.policy)
        needed = self.policy.regression_explained_share * reg.impact_ms
        if explained >= needed:
            return None, controls
        strong_rest = reg.impact_ms - explained >= self.policy.strong_regression * float(reg.evidence.get("required_ms", math.inf))
        if not strong_rest and rank_cause_open(tracks, findings, self.policy):
            return None, controls  # the open rank-level incident carries the job's slowdown
        coming = sum(float(f.evidence.get("explains_ms", f.impact_ms)) for f in findings
                     if f.identity != reg.identity and not persisting(tracks, f, self.policy))
        strong = reg.impact_ms >= self.policy.strong_regression * float(reg.evidence.get("required_ms", math.inf))
        if strong and explained + coming < needed:  # nothing this window could explain it: no window to wait
            reg = dataclasses.replace(reg, extra_windows=0)
        return reg, controls

    def steady(self) -> bool:
        """The job has a steady state to compare against: as many windows of step times as a
        regression needs (persist_windows + 1 recent ones and two before them)."""
        return len(self.live.history) >= self.policy.persist_windows + 1 + self.policy.regression_min_past

    def hang(self, rank_windows: dict[int, RankWindow]) -> Finding | None:
        return hang(self.live, rank_windows, self.policy)

    def typical_step_ms(self, default: float) -> float:
        """Median step time over the regression history; ``default`` before there is one."""
        return float(np.median([v for _, v in self.live.history])) if self.live.history else default

    def typical_period_ms(self, default: float) -> float:
        """Median pace (wall ms per completed iteration, the time between iterations included)
        over the regression history; :meth:`typical_step_ms` (then ``default``) before there is
        one. A window's usual number of steps is ``window_ms`` / this: the step time alone leaves
        out what runs between iterations (syncs, logging, untimed code)."""
        periods = [p for _, p, _ in self.live.periods]
        return float(np.median(periods)) if periods else self.typical_step_ms(default)

    def _profile(self, wid: int, now: int, reg: Finding) -> list[Control]:
        pol = self.policy
        last = self.last_profile_window
        if last is not None and wid - last < pol.profile_request_cooldown_windows:
            return []
        self.last_profile_window = wid
        rid = hashlib.sha1(f"{self.job}|profile|{wid}".encode()).hexdigest()[:16]
        return [Control(
            schema_version=CONTROL_VERSION, job=self.job, request_id=rid, command=ControlCommand.PROFILE.value,
            start_step=int(max(self.live.max_last_step, 0) + pol.profile_request_ahead_steps),
            duration_s=pol.profile_request_duration_s, reason=reg.summary, issued_ms=int(to_ms(now)))]


def rank_cause_open(tracks: dict[str, Track], findings: list[Finding], policy: DetectionPolicy) -> bool:
    """A rank-level root cause (one naming ranks, not advice) is open, or persists this
    window: the job's slowdown has a culprit, and its incident carries the cost. A second,
    job-wide incident beside it needs an excess that the culprit's share leaves
    ``strong_regression`` times above what a regression needs (decisions table,
    docs/detection.md: "a culprit carries the job's slowdown"). On a GPU/NCCL job a straggler
    stretches every rank's collectives and the job's step by more than its own excess (the
    others' kernels queue behind the late collective), on a CPU job a rank that sleeps or
    computes longer shifts the run queue of a shared host; in both the job-wide rise is the
    culprit's doing, not a second fault."""
    for f in findings:
        if f.ranks and not advice(tracks, f) and persisting(tracks, f, policy):
            return True
    return any(t.open and not t.advice and t.last is not None and t.last.get("ranks") for t in tracks.values())


def iteration_period(rank_windows: dict[int, RankWindow], window_ms: float) -> tuple[float, int]:
    """(Wall ms per completed iteration, iterations) of the window's median rank; (0, 0) when
    a rank completed none (a stall, a rank still starting). An iteration's own time runs from
    its first batch fetch to its last optimizer step: code after the step (logging, metric
    all-reduces, checkpoints, host-side syncs) is in no iteration, and only the pace shows
    it slowing down (decisions table, docs/detection.md: "pace, not iteration time")."""
    steps = [int(rw.get("steps", 0)) for rw in rank_windows.values()]
    if not steps or min(steps) <= 0:
        return 0.0, 0
    n = int(np.median(steps))
    return window_ms / n, n
