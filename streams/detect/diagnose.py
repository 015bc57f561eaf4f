"""Stage 3: one job's RankWindows and FunctionComparisons -> Anomaly lifecycle + Control.

Records wait in :mod:`.job_windows` until their window is ready; windows are evaluated
in order. Each evaluation runs :func:`.window.diagnose_window` (root causes), the
job-wide checks of :mod:`.job_checks` (a regression, folded into the root causes that
explain it, and the PROFILE request it triggers; a hang), then the incident lifecycle
(:func:`.incidents.step`). A regression needs one window more than other findings, so
the root cause it comes from can open first and explain it. A window counts as clean
(toward resolving incidents) only when the job ran most of it: the median rank completed
``full_progress_share`` of the steps a window usually holds (the window length over the
job's median pace: wall time per iteration, the time between iterations included); a job's
first or last, partial windows and stalls are missing data (an incident must not resolve as
a job ends).

A shared inefficiency (an all-rank function taking more of the step than a healthy job's,
:func:`.shape.expectations`) is judged only on windows in which the job ran most of its
usual steps (the clean-window rule above): in a window the job barely ran (its start-up, a
stall), the time between its few steps -- garbage collections of model set-up, DataLoader
workers starting -- divided by those few steps is no share of any step (docs/detection.md,
decisions: "shared inefficiency on clean windows only").

A window holding a rank's last window (``ended_cleanly``) updates open incidents but opens
none (the end of a job, partial and skewed by teardown, is not evidence of a fault; before
final batches these windows were never stored). A window holding a rank's first window with
completed steps is partial too (the rank started inside it) and skewed by start-up (imports,
process-group and DDP set-up, the first garbage collections of all that): its steps do not
count toward ``persist_steps``, so what it shows opens only when the next window shows it
too (``persist_windows``; a one-window analysis such as a trace import, persist_windows 1,
is unchanged). Start-up garbage collections otherwise open job-wide or one-rank GC findings
before any fault (docs/detection.md, decisions: "a rank's first and last windows").

A window of a job larger than ``diagnose_shard_ranks`` (or of ``shards`` given) is diagnosed in
shards of ranks and merged (:mod:`.shards`: the same findings and trace; ``mapper`` runs the
shards, in process or in a pool).

Every evaluation keeps its decision trace (:mod:`.decisions`: which rule flagged, added or
cleared which rank, and why; the periodic-stall rule, the regression and the hang join it):
each finding carries a bounded copy in ``evidence.decisions`` (what ``perftracker diagnose
--explain RANK`` reads), and ``decisions`` counts them per (rule, action) for the worker's
``rule_decisions`` counter.

The job's end ends its incidents: every open one is RESOLVED once, with
``resolved_reason``:

* ``job finished``: every rank of the job (0 .. world_size - 1) has sent its final batch
  (its last RankWindow says ``ended_cleanly``), checked after each evaluated window;
* ``job died``: no rank sent a batch (heartbeats included) for ``idle_after_s`` on the
  caller's clock, no window waits, the last evaluation found no hang in progress, and not
  every rank ended cleanly (ranks killed mid-step, a lost node, SIGKILL/SIGTERM).

A hang in progress never ends the job: hung ranks keep heartbeating. After the end the
tracks are gone, so the resolution is sent once; a restarted job of the same id starts
new incidents.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from ...schemas.records import Anomaly, Control, FunctionComparison, RankWindow
from ...schemas.vocabulary import RESOLVED_JOB_DIED, RESOLVED_JOB_FINISHED, Kind
from .decisions import DecisionTrace, RuleOutcome
from .findings import Finding
from .incidents import Track, end_all, step
from .job_checks import JobChecks
from .job_clock import Due, JobClock
from .job_windows import JobWindows, ReadyWindow
from .policy import DetectionPolicy
from .shards import Mapper, diagnose_sharded, shard_count
from .stalls import StallHistory, periodic_stalls_traced
from .window import diagnose_window_traced, step_ms


class JobDiagnoser:
    """Per-job root-cause engine; see the module docstring."""

    def __init__(self, job: str, policy: DetectionPolicy | None = None, clock: JobClock | None = None,
                 shards: int | None = None, mapper: Mapper = map):
        self.job = job
        self.policy = policy or DetectionPolicy()
        self.shards = shards  # shards per window (None: by the job's size, shards.shard_count)
        self.mapper = mapper  # runs a window's shards: ``map`` (in process) or a process pool's
        self.skipped: Counter[str] = Counter()
        self.windows = JobWindows(job, self.policy, self.skipped, clock)
        self.checks = JobChecks(job, self.policy)
        self.tracks: dict[str, Track] = {}
        self.last_now = 0
        self.last_input_ms = 0  # caller clock of the latest record (idle counts from it)
        self.last_findings: list[Finding] = []
        self.world = 0  # the job's world size (largest seen)
        self.ended: set[int] = set()  # ranks whose final batch came
        self.last_alive_ms: int | None = None  # caller clock of the last window with a batch
        self.end_reason = ""  # set when the job ended ("job finished" / "job died")
        self.ends: Counter[str] = Counter()  # job ends by reason
        self.started: set[int] = set()  # ranks whose first window with data was evaluated
        self.stalls = StallHistory.for_policy(self.policy)  # collective stalls of the last windows
        self.decisions: Counter[tuple[str, str]] = Counter()  # (rule, action) -> decisions, since the start
        self.last_trace = DecisionTrace()  # the last evaluated window's

    def add(self, record_name: str, record: RankWindow | FunctionComparison, now_wall_ms: int | None = None) -> None:
        """Buffer a RankWindow or FunctionComparison of this job."""
        if self.last_alive_ms is None and now_wall_ms is not None:
            self.last_alive_ms = now_wall_ms  # silence counts from the first record
        if now_wall_ms is not None:
            self.last_input_ms = max(self.last_input_ms, int(now_wall_ms))
        self.windows.add(record_name, record, now_wall_ms)

    def poll(self, now_wall_ms: int) -> tuple[list[Anomaly], list[Control]]:
        """Evaluate every ready window in order; (Anomaly records, Control records)."""
        self.last_now = max(self.last_now, now_wall_ms)
        anomalies: list[Anomaly] = []
        controls: list[Control] = []
        for ready in self.windows.take_ready(now_wall_ms):
            a, c = self._evaluate(ready, now_wall_ms)
            anomalies += a
            controls += c
            if self._finished():
                anomalies += self._end(RESOLVED_JOB_FINISHED)
        if self._died(now_wall_ms):
            anomalies += self._end(RESOLVED_JOB_DIED)
        anomalies.sort(key=lambda r: -r["impact_ms_per_step"])
        return anomalies, controls

    def due(self) -> Due:
        """When :meth:`poll` may next evaluate a window or end the job without new input
        (job_clock.Due): the window buffer's next release, or the silence that ends a job."""
        d = self.windows.due()
        if self.windows.empty() and not any(t.open for t in self.tracks.values()):
            idle_at = self.last_input_ms + int(self.policy.idle_after_s * 1000) + 1
            d = d._replace(at=idle_at if d.at is None else min(d.at, idle_at))
        if (self.last_alive_ms is None or not self.windows.empty() or not self.tracks
                or any(f.identity == "hang" for f in self.last_findings)):
            return d
        died = self.last_alive_ms + int(self.policy.idle_after_s * 1000) + 1
        return d._replace(at=died if d.at is None else min(d.at, died))

    def _evaluate(self, ready: ReadyWindow, now: int) -> tuple[list[Anomaly], list[Control]]:
        wid, rws, cmps = ready.window_id, ready.rank_windows, ready.comparisons
        self._count_silent(rws)
        self._note_ends(rws, now)
        self.checks.observe(cmps)
        shards = self.shards if self.shards is not None else shard_count(len(rws), self.policy)
        if shards > 1 or self.shards is not None:  # in shards of ranks, merged (shards.py): the same findings
            merged = diagnose_sharded(rws, cmps, self.policy, shards, self.mapper)
            job_step, findings, trace = merged.job_step_ms, merged.findings, merged.trace
        else:
            job_step = step_ms(rws)
            findings, trace = diagnose_window_traced(rws, cmps, self.policy)
        self.stalls.note(wid, cmps, rws, self.policy)
        stalls, not_stalls = periodic_stalls_traced(self.stalls, wid, job_step, {r for f in findings for r in f.ranks},
                                                    self.policy)
        trace.record("periodic_stalls", RuleOutcome(added=stalls, cleared=not_stalls))
        findings += stalls
        if not self._full_progress(rws, job_step):  # a share of the step says nothing of a job that barely ran
            findings = [f for f in findings if f.kind != Kind.EXPECTATION]
        starting = self._starts(rws)
        partial = starting or any(rw.get("ended_cleanly") for rw in rws.values())
        reg, controls = self.checks.regression(wid, now, rws, findings, self.tracks, partial=partial)
        if reg is not None:
            findings.append(reg)
            trace.add("regression", reg)
        h = self.checks.hang(rws)
        if h is not None:
            findings.append(h)
            trace.add("hang", h)
        self.decisions.update(trace.counts())
        self.last_trace = trace
        findings = [dataclasses.replace(f, evidence={**f.evidence, "decisions": trace.for_finding(f)}) for f in findings]
        self.last_findings = findings
        wms = self.policy.window_ms
        progress = self._full_progress(rws, job_step)
        if any(rw.get("ended_cleanly") for rw in rws.values()):
            findings = self._open_only(findings)
        steps = 0 if starting else int(_median_steps(rws))  # a start-up window counts as one window
        anomalies = step(self.tracks, findings, self.job, wid * wms, (wid + 1) * wms, job_step, self.policy,
                         progress=progress, steps=steps, observed=_observed(rws), unjudged=_unjudged(ready.named, cmps),
                         shape=frozenset(f.identity for f in findings if self.checks.shape(f)))
        return anomalies, controls

    def _full_progress(self, rws: dict[int, RankWindow], job_step_ms: float) -> bool:
        """The job ran most of this window (see the module docstring)."""
        steps = _median_steps(rws)
        # the usual steps per window from the job's pace, not its step time: code between
        # iterations (syncs, logging, metric all-reduces) makes a window hold fewer steps than
        # its length over the step time, and counted that way no window of such a job is clean
        # and an incident whose fault stopped never clears (decisions table, docs/detection.md:
        # "pace, not iteration time")
        typical_ms = self.checks.typical_period_ms(default=job_step_ms)
        if steps <= 0 or typical_ms <= 0:
            return False
        return steps >= self.policy.full_progress_share * self.policy.window_ms / typical_ms

    def _starts(self, rws: dict[int, RankWindow]) -> bool:
        """Whether this window is some rank's first with completed steps (its start-up: partial,
        skewed; windows of heartbeats only, while the script imports and sets up, come before)."""
        new = {int(r) for r, rw in rws.items() if int(rw.get("steps", 0)) > 0 and int(r) not in self.started}
        self.started |= new
        return bool(new)

    def _open_only(self, findings: list[Finding]) -> list[Finding]:
        """A rank's last, partial window (its final batch closed it: ranks stop at different
        instants, the barrier and teardown) updates open incidents but opens none and moves
        no candidate toward opening: before final batches it was never stored at all."""
        return [f for f in findings if f.immediate or (f.identity in self.tracks and self.tracks[f.identity].open)]

    def _note_ends(self, rws: dict[int, RankWindow], now: int) -> None:
        """Which ranks ended cleanly, the world size, and the last sign of life."""
        for rank, rw in rws.items():
            self.world = max(self.world, int(rw.get("world_size", 0)))
            if rw.get("ended_cleanly"):
                self.ended.add(int(rank))
            elif int(rw.get("batches", 0)):
                self.ended.discard(int(rank))  # a restarted process of that rank reports again
            if int(rw.get("batches", 0)):
                self.last_alive_ms = now

    def _finished(self) -> bool:
        """Every rank of the job sent its final batch."""
        return self.world > 0 and self.ended >= set(range(self.world))

    def _died(self, now: int) -> bool:
        """Silent past the idle limit with windows evaluated, nothing waiting, no hang in progress."""
        if self.last_alive_ms is None or not self.windows.empty() or not self.tracks:
            return False
        if any(f.identity == "hang" for f in self.last_findings):
            return False
        return now - self.last_alive_ms > self.policy.idle_after_s * 1000

    def _end(self, reason: str) -> list[Anomaly]:
        """The job ended: resolve every open incident once (see the module docstring)."""
        out = end_all(self.tracks, reason)
        self.end_reason = reason
        self.ends[reason] += 1
        self.ended.clear()
        self.started.clear()
        self.last_findings = []
        self.checks = JobChecks(self.job, self.policy)  # a restart under the same id starts afresh
        return out

    def _count_silent(self, rws: dict[int, RankWindow]) -> None:
        silent = sum(1 for rw in rws.values() if rw.get("steps", 0) == 0)
        if silent and any(rw.get("steps", 0) > 0 for rw in rws.values()):
            self.skipped["silent_rank"] += silent

    def idle(self, now_wall_ms: int) -> bool:
        """No window waits, no incident is open and no record came for ``idle_after_s`` (the
        caller drops it: the job is forgotten; data of it later starts a new diagnoser, and an
        incident found again gets its same id, a hash of job, cause, ranks and function)."""
        return (self.windows.empty() and not any(t.open for t in self.tracks.values())
                and now_wall_ms - self.last_input_ms > self.policy.idle_after_s * 1000)

    def open_incidents(self) -> list[Anomaly]:
        """Last record of every open incident, most costly first (for `diagnose`)."""
        recs = [t.last for t in self.tracks.values() if t.open and t.last is not None]
        return sorted(recs, key=lambda r: -r["impact_ms_per_step"])


def _observed(rws: dict[int, RankWindow]) -> set[int]:
    """The ranks that sent data in a window (a batch; heartbeats of a hung rank count)."""
    return {int(r) for r, rw in rws.items() if int(rw.get("batches", 0) or 0) or int(rw.get("steps", 0) or 0)}


def _unjudged(sent: Counter[str], cmps: list[FunctionComparison]) -> frozenset[str]:
    """Functions some ranks sent patterns of in a window (``sent``: function -> ranks) whose
    comparison is missing or compared fewer ranks than sent them (patterns lost or late:
    incidents.step)."""
    seen = {str(c.get("function", "")): int(c.get("ranks_seen", 0)) for c in cmps}
    return frozenset(f for f, n in sent.items() if seen.get(f, 0) < n)


def _median_steps(rws: dict[int, RankWindow]) -> float:
    """The job's steps in a window: the median rank's."""
    return float(np.median([int(rw.get("steps", 0)) for rw in rws.values()])) if rws else 0.0
