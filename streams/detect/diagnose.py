"""Stage 3: one job's RankWindows and FunctionComparisons -> Anomaly lifecycle + Control.

Windows are evaluated in order. A regression needs one window more than other findings
(so the root cause it comes from can open first and explain it), and only persisting
findings or open incidents explain it. Window W is ready half a grace after its first
FunctionComparison arrived (comparators of all functions fire within one grace of
each other), or two graces after its first RankWindow when no comparison comes
(a hung job produces no patterns). Each evaluation runs :func:`.window.diagnose_window`,
the regression and hang detectors, then the incident lifecycle. A regression that the
window's root causes explain (their impact covers half of it) is folded into them, not
reported twice (as are its first windows after a root cause cleared, while the
incident is still open); it still triggers one synchronized PROFILE request on
``pt.control``.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np

from ...schemas.vocabulary import CONTROL_VERSION, FUNCTION_COMPARISON, RANK_WINDOW
from .findings import Finding
from .incidents import Track, step
from .liveness import LivenessState, hang, note_collectives, regression
from .model import to_ms
from .policy import DetectionPolicy
from .window import diagnose_window, step_ms

PROFILE_AHEAD_STEPS = 5
PROFILE_DURATION_S = 20.0
PROFILE_COOLDOWN_WINDOWS = 12


class JobDiagnoser:
    """Per-job root-cause engine; see the module docstring."""

    def __init__(self, job: str, policy: DetectionPolicy | None = None):
        self.job = job
        self.policy = policy or DetectionPolicy()
        self.skipped: Counter[str] = Counter()
        self.rank_windows: dict[int, dict[int, dict]] = {}
        self.comparisons: dict[int, dict[str, dict]] = {}
        self.first_rw: dict[int, int | None] = {}
        self.first_cmp: dict[int, int | None] = {}
        self.evaluated_upto: int | None = None
        self.tracks: dict[str, Track] = {}
        self.live = LivenessState()
        self.last_profile_window: int | None = None
        self.last_now = 0
        self.last_findings: list[Finding] = []

    def add(self, record_name: str, record: dict, now_wall_ms: int | None = None) -> None:
        """Buffer a RankWindow or FunctionComparison of this job."""
        try:
            wid = int(record["window_id"])
            if record.get("job") != self.job:
                self.skipped["wrong_job"] += 1
                return
        except (KeyError, TypeError, ValueError):
            self.skipped["bad_record"] += 1
            return
        if self.evaluated_upto is not None and wid <= self.evaluated_upto:
            self.skipped["late_record"] += 1
            return
        if wid not in self.first_rw and len(self.first_rw) >= self.policy.max_open_windows:
            self._evict_oldest()
        self.first_rw.setdefault(wid, None)
        self.first_cmp.setdefault(wid, None)
        if record_name == RANK_WINDOW:
            self._add_rank_window(wid, record, now_wall_ms)
        elif record_name == FUNCTION_COMPARISON:
            self.comparisons.setdefault(wid, {})[str(record.get("function", ""))] = record
            if self.first_cmp[wid] is None:
                self.first_cmp[wid] = now_wall_ms if now_wall_ms is not None else -1
        else:
            self.skipped["unknown_record"] += 1

    def _add_rank_window(self, wid: int, rw: dict, now_wall_ms: int | None) -> None:
        rank, world = int(rw.get("rank", -1)), int(rw.get("world_size", 0))
        if rank < 0 or (world > 0 and rank >= world):
            self.skipped["unknown_rank"] += 1
            return
        self.rank_windows.setdefault(wid, {})[rank] = rw
        if self.first_rw[wid] is None:
            self.first_rw[wid] = now_wall_ms if now_wall_ms is not None else -1

    def _evict_oldest(self) -> None:
        oldest = min(self.first_rw)
        self.skipped["window_evicted"] += 1
        for d in (self.first_rw, self.first_cmp, self.rank_windows, self.comparisons):
            d.pop(oldest, None)

    def poll(self, now_wall_ms: int) -> tuple[list[dict], list[dict]]:
        """Evaluate every ready window in order; (Anomaly records, Control records)."""
        self.last_now = max(self.last_now, now_wall_ms)
        anomalies: list[dict] = []
        controls: list[dict] = []
        for wid in sorted(self.first_rw):
            for d in (self.first_rw, self.first_cmp):  # records added without a clock
                if d[wid] == -1:
                    d[wid] = now_wall_ms
            if not self._ready(wid, now_wall_ms):
                break
            a, c = self._evaluate(wid, now_wall_ms)
            anomalies += a
            controls += c
        anomalies.sort(key=lambda r: -r["impact_ms_per_step"])
        return anomalies, controls

    def _ready(self, wid: int, now: int) -> bool:
        grace = self.policy.grace_ms
        cmp_t, rw_t = self.first_cmp.get(wid), self.first_rw.get(wid)
        if cmp_t is not None and now > cmp_t + grace // 2:
            return True
        return rw_t is not None and now > rw_t + 2 * grace + 1000

    def _evaluate(self, wid: int, now: int) -> tuple[list[dict], list[dict]]:
        rws = self.rank_windows.pop(wid, {})
        cmps = list(self.comparisons.pop(wid, {}).values())
        self.first_rw.pop(wid, None)
        self.first_cmp.pop(wid, None)
        self.evaluated_upto = wid
        self._count_silent(rws)
        job_step = step_ms(rws)
        note_collectives(self.live, cmps)
        findings = diagnose_window(rws, cmps, self.policy)
        controls = []
        # a window's typical fast step (p25): transient spikes within it do not move it
        reg = regression(self.live, wid, step_ms(rws, quantile=25.0), self.policy)
        if reg is not None:
            controls = self._profile(wid, now, reg)
            explained = sum(float(f.evidence.get("explains_ms", f.impact_ms)) for f in findings
                            if self._persisting(f))
            explained += sum(t.explains_ms for i, t in self.tracks.items()
                             if t.open and i != reg.identity and i not in {f.identity for f in findings})
            if explained < 0.5 * reg.impact_ms:
                findings.append(reg)
        h = hang(self.live, rws, self.policy)
        if h is not None:
            findings.append(h)
        self.last_findings = findings
        wms = self.policy.window_ms
        progress = self._full_progress(rws, job_step)
        anomalies = step(self.tracks, findings, self.job, wid * wms, (wid + 1) * wms, job_step, self.policy,
                         progress=progress)
        return anomalies, controls

    def _persisting(self, f: Finding) -> bool:
        """Seen in the previous window too (a one-window candidate explains nothing)."""
        t = self.tracks.get(f.identity)
        return t is not None and (t.open or t.streak >= self.policy.persist_windows - 1)

    def _full_progress(self, rws: dict[int, dict], job_step_ms: float) -> bool:
        """The job ran most of this window: its ranks completed at least half the steps a window
        usually holds. Only such a window can count as clean; a job's first or last, partial
        windows and stalls are missing data (an incident must not resolve as a job ends)."""
        steps = float(np.median([int(rw.get("steps", 0)) for rw in rws.values()])) if rws else 0.0
        typical_ms = float(np.median([v for _, v in self.live.history])) if self.live.history else job_step_ms
        if steps <= 0 or typical_ms <= 0:
            return False
        return steps >= 0.5 * self.policy.window_ms / typical_ms

    def _count_silent(self, rws: dict[int, dict]) -> None:
        silent = sum(1 for rw in rws.values() if rw.get("steps", 0) == 0)
        if silent and any(rw.get("steps", 0) > 0 for rw in rws.values()):
            self.skipped["silent_rank"] += silent

    def _profile(self, wid: int, now: int, reg: Finding) -> list[dict]:
        last = self.last_profile_window
        if last is not None and wid - last < PROFILE_COOLDOWN_WINDOWS:
            return []
        self.last_profile_window = wid
        rid = hashlib.sha1(f"{self.job}|profile|{wid}".encode()).hexdigest()[:16]
        return [{
            "schema_version": CONTROL_VERSION, "job": self.job, "request_id": rid, "command": "PROFILE",
            "start_step": int(max(self.live.max_last_step, 0) + PROFILE_AHEAD_STEPS),
            "duration_s": PROFILE_DURATION_S, "reason": reg.summary, "issued_ms": int(to_ms(now)),
        }]

    def idle(self, now_wall_ms: int) -> bool:
        return (not self.first_rw and not any(t.open for t in self.tracks.values())
                and now_wall_ms - self.last_now > self.policy.idle_after_s * 1000)

    def open_incidents(self) -> list[dict]:
        """Last record of every open incident, most costly first (for `diagnose`)."""
        recs = [t.last for t in self.tracks.values() if t.open and t.last]
        return sorted(recs, key=lambda r: -r["impact_ms_per_step"])
