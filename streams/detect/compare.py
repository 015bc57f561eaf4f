"""Stage 2: one function's FunctionPatterns from every rank -> FunctionComparison per window.

A window is evaluated as soon as every rank expected in it has sent its pattern (the
collective's ``group_ranks``, else the job's ``world_size``), or else once ``grace`` has
passed on the caller's clock since its first pattern arrived (a missing rank, or a
function only some ranks run, gets that long) and no pattern came for half a grace (a worker
near its capacity reads one window's patterns over seconds; decisions table,
docs/detection.md: "quiet, not first") while the job's :class:`.job_clock.JobClock`
lets the caller's clock decide, or once the job's patterns show its data a grace and a
margin past the window's close (a backlog: patterns read long after they were made, a
window's spread over many seconds of reading); at most ``max_open_windows`` wait
(the oldest is evicted, counted), and a pattern for a window already evaluated is
late (counted). Evaluation keeps the patterns with steps and sane numbers, then
scores non-collectives against their peers (:mod:`.peers`, time per completed step)
and collectives by late arrival on the seqs every member reported
(:mod:`.late_arrival`). Either needs a finding to cost at least
:func:`min_cost_ms` per step. A peer outlier resting on a few calls must also stand over the
function's recent windows (:mod:`.rare`: one full garbage collection falls in one window or
the next). Skipped patterns are counted in the record's
``skipped`` map and in ``self.skipped``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...schemas.records import FunctionComparison, FunctionPattern, group_size
from ...schemas.vocabulary import FUNCTION_COMPARISON_VERSION, SpanKind
from .job_clock import DUE_NOW, Due, JobClock
from .late_arrival import score_collective
from .layout import coords_of, layout_peer_map
from .model import finite_nonneg, to_ms
from .peers import PeerTable, score_peers
from .policy import DetectionPolicy
from .rare import RareHorizon, rare

MAX_EVALUATED_REMEMBERED = 32  # evaluated window ids kept to recognise late patterns


class FunctionComparator:
    """Per (job, function) window buffer and evaluator."""

    def __init__(self, job: str, function: str, policy: DetectionPolicy | None = None,
                 clock: JobClock | None = None):
        self.job, self.function = job, function
        self.policy = policy or DetectionPolicy()
        # shared by the job's comparators: its data time is the latest window close its patterns show
        self.clock = clock if clock is not None else JobClock(self.policy, caught_up_ms(self.policy))
        self.peer_map = self.policy.peer_group_map()
        self.coords: dict[int, dict[str, int]] = {}  # rank -> mesh coordinates its patterns carried
        self.skipped: Counter[str] = Counter()
        self.pending: dict[int, dict[int, FunctionPattern]] = {}  # window -> rank -> pattern
        self.first_seen: dict[int, int | None] = {}  # window -> caller ms of its first pattern
        self.last_seen: dict[int, int] = {}  # window -> caller ms of its latest pattern
        self.expected: dict[int, int] = {}  # window -> ranks its patterns say report this function
        self.evaluated: list[int] = []
        self.oldest_evaluated = 0  # min(evaluated), kept as it changes
        self.last_now = 0
        self.last_input_ms = 0  # caller clock of the latest pattern (idle counts from it)
        self.rare = RareHorizon.for_policy(self.policy)  # the function's recent windows while it is rare (.rare)

    def add(self, pattern: FunctionPattern, now_wall_ms: int | None = None) -> None:
        """Buffer one FunctionPattern (a re-delivered one replaces the earlier copy)."""
        try:
            wid, rank = int(pattern["window_id"]), int(pattern["rank"])
        except (KeyError, TypeError, ValueError):
            self.skipped["bad_pattern"] += 1
            return
        if pattern.get("function") != self.function or pattern.get("job") != self.job:
            self.skipped["wrong_function_or_job"] += 1
            return
        if wid in self.evaluated or (self.evaluated and wid < self.oldest_evaluated):
            self.skipped["late_pattern"] += 1
            return
        if wid not in self.pending and len(self.pending) >= self.policy.max_open_windows:
            oldest = min(self.pending)
            self.skipped["window_evicted"] += len(self.pending.pop(oldest))
            self.first_seen.pop(oldest, None)
            self.last_seen.pop(oldest, None)
            self.expected.pop(oldest, None)
        self.pending.setdefault(wid, {})[rank] = pattern
        coords = coords_of(pattern)
        if coords:
            self.coords[rank] = coords
        self.clock.note(closed_at_ms(self.policy, wid), now_wall_ms, rank, int(pattern.get("world_size", 0) or 0))
        known = self.expected.get(wid, 0)
        group = pattern.get("group_ranks")
        stated = (len(group) if isinstance(group, list) else 0) + int(pattern.get("group_ranks_count") or 0)
        # a collective's group no longer than the ranks already expected changes nothing (the set
        # of a long group is the costly part of a pattern's buffering)
        if not (0 < stated <= known and pattern.get("kind") == SpanKind.COLLECTIVE):
            self.expected[wid] = max(known, expected_ranks(pattern))
        if self.first_seen.get(wid) is None:
            self.first_seen[wid] = now_wall_ms
        if now_wall_ms is not None:
            self.last_seen[wid] = int(now_wall_ms)
        self.last_now = max(self.last_now, now_wall_ms or 0)
        self.last_input_ms = max(self.last_input_ms, now_wall_ms or 0)

    def poll(self, now_wall_ms: int) -> list[FunctionComparison]:
        """FunctionComparison records of every window that is complete or whose grace has
        passed, oldest first."""
        out = []
        self.last_now = max(self.last_now, now_wall_ms)
        for wid in sorted(self.pending):
            if self.first_seen.get(wid) is None:
                self.first_seen[wid] = now_wall_ms
            if not self.complete(wid) and not self._waited(wid, now_wall_ms):
                continue
            patterns = self.pending.pop(wid)
            self.first_seen.pop(wid, None)
            self.last_seen.pop(wid, None)
            self.expected.pop(wid, None)
            self.evaluated = (self.evaluated + [wid])[-MAX_EVALUATED_REMEMBERED:]
            self.oldest_evaluated = min(self.evaluated)
            out.append(self.evaluate(wid, list(patterns.values())))
        return out

    def _waited(self, wid: int, now_wall_ms: int) -> bool:
        """Window ``wid`` waited its grace for missing patterns (see the module docstring)."""
        first = self.first_seen.get(wid)
        if first is None or (now_wall_ms > self._wall_due(wid, first) and self.clock.by_wall(now_wall_ms)):
            return True
        return self.clock.data_past(closed_at_ms(self.policy, wid))

    def due(self) -> Due:
        """When :meth:`poll` may next evaluate a window without new input (job_clock.Due): the
        earliest of the pending windows' grace on the caller's clock and close on data time.
        With nothing pending: when it turns idle (``idle_after_s`` after its last pattern)."""
        wall: int | None = None
        data: int | None = None
        if not self.pending:
            return Due(at=self.last_input_ms + int(self.policy.idle_after_s * 1000) + 1)
        for wid in self.pending:
            first = self.first_seen.get(wid)
            if first is None or self.complete(wid):
                return DUE_NOW
            w, d = self._wall_due(wid, first) + 1, closed_at_ms(self.policy, wid)
            wall, data = (w, d) if wall is None or data is None else (min(wall, w), min(data, d))
        return Due(wall=wall, data=data)

    def _wall_due(self, wid: int, first: int) -> int:
        """Caller time past which window ``wid`` is evaluated without its missing patterns: a grace
        after its first pattern, and half a grace after its latest (patterns still coming are
        waited for; see the module docstring)."""
        return max(first + self.policy.grace_ms, self.last_seen.get(wid, first) + self.policy.grace_ms // 2)

    def complete(self, wid: int) -> bool:
        """Every rank expected in window ``wid`` has sent its pattern."""
        expected = self.expected.get(wid, 0)
        return 0 < expected <= len(self.pending.get(wid, {}))

    def idle(self, now_wall_ms: int) -> bool:
        """Nothing pending and no pattern for ``idle_after_s`` (the caller drops it; a later
        pattern of the function starts a new comparator)."""
        return not self.pending and now_wall_ms - self.last_input_ms > self.policy.idle_after_s * 1000

    # ---- evaluation ---------------------------------------------------------------------
    def evaluate(self, window_id: int, patterns: list[FunctionPattern]) -> FunctionComparison:
        """Compare one window's patterns: a function of them, the policy and, for a function a
        rank calls only a few times a window, the function's recent windows (:mod:`.rare`)."""
        skipped: Counter[str] = Counter()
        good = [p for p in patterns if self._valid(p, skipped)]
        rec = _empty_record(self.job, self.function, window_id, patterns)
        if good:
            rec["kind"] = int(good[0].get("kind", 0))
            rec["window_start_ms"] = to_ms(good[0].get("window_start_ms", rec["window_start_ms"]))
        rec["ranks_seen"] = len(good)
        if rec["kind"] == SpanKind.COLLECTIVE:
            score_collective(rec, good, self.policy, min_cost_ms(self.policy, good), skipped)
        elif good:
            min_cost = min_cost_ms(self.policy, good)
            table = score_peers(rec, good, self.peers(), self.policy, min_cost, skipped)
            self._judge_rare(window_id, rec, good, table, min_cost, skipped)
        rec["skipped"] = dict(skipped)
        self.skipped.update(skipped)
        return rec

    def _judge_rare(self, window_id: int, rec: FunctionComparison, good: list[FunctionPattern],
                    table: PeerTable, min_cost: float, skipped: Counter[str]) -> None:
        """Keep an outlier resting on a few calls only if the horizon of the function's recent
        windows shows it too (:mod:`.rare`); the others are counted as ``rare_in_phase``. A
        function not rare in this window only clears the horizon (no per-rank rows built)."""
        if not rare((int(p["count"]) for p in good), self.policy.rare_max_calls):  # then every outlier of the window rests on a few calls
            self.rare.windows.clear()
            return
        keys = table.keys[table.peer]  # each pattern's peer key, as scored
        self.rare.note(window_id, ((int(p["rank"]), str(k), int(p["count"]), float(p["total_ns"]), int(p["steps"]))
                                   for p, k in zip(good, keys, strict=True)))
        kept = []
        for o in rec["outliers"]:
            if not self.rare.stands(int(o["rank"]), str(o["peer_group"]), self.policy.min_peers,
                                    self.policy.min_excess, min_cost):
                skipped["rare_in_phase"] += 1
                continue
            kept.append(o)
        rec["outliers"] = kept

    def peers(self) -> dict[int, str]:
        """{rank: peer key}: the configured ``peer_groups``, else the parallel layout of the ranks
        whose mesh coordinates are known (:func:`.layout.layout_peer_map`), else empty (every
        rank's structural signature is its key)."""
        return self.peer_map or layout_peer_map(self.coords, self.policy.min_peers)

    def _valid(self, p: FunctionPattern, skipped: Counter[str]) -> bool:
        try:
            steps, total, count = int(p["steps"]), p["total_ns"], p["count"]
        except (KeyError, TypeError, ValueError):
            skipped["bad_pattern"] += 1
            return False
        if steps <= 0:
            skipped["no_steps"] += 1
            return False
        if not (finite_nonneg(total) and finite_nonneg(count)):
            skipped["bad_duration"] += 1
            return False
        if total / steps > self.policy.max_duration_s * 1e9:
            skipped["absurd_duration"] += 1
            return False
        return True


def closed_at_ms(policy: DetectionPolicy, window_id: int) -> int:
    """Data time at which a rank closes window ``window_id`` by its own data (its end + close lag)."""
    return (int(window_id) + 1) * policy.window_ms + policy.close_lag_ms


def caught_up_ms(policy: DetectionPolicy) -> int:
    """A stage fed with windows (compare, diagnose) keeps up with a job while its latest window
    close is at most this old: live, windows come one window length apart, a flush after they end."""
    return policy.window_ms + policy.grace_ms


def expected_ranks(p: FunctionPattern) -> int:
    """Ranks that report this function in a window, as ``p`` tells: a collective's group
    members, else the job's world size (0: unknown, the grace decides)."""
    try:
        if int(p.get("kind", 0)) == SpanKind.COLLECTIVE and (p.get("group_ranks") or p.get("group_ranks_count")):
            return group_size(p, "group_ranks")  # listed, or a range (v3)
        return max(0, int(p.get("world_size", 0)))
    except (TypeError, ValueError):
        return 0


def min_cost_ms(pol: DetectionPolicy, good: list[FunctionPattern]) -> float:
    """Cost a finding needs (ms per step): the configured floor, or ``min_step_share`` of the
    step time estimated as window length / median completed steps, whichever is larger."""
    steps = float(np.median([p["steps"] for p in good])) if good else 0.0
    step_ms = pol.window_s * 1000 / steps if steps > 0 else 0.0
    return max(pol.min_cost_ms_per_step, pol.min_step_share * step_ms)


def _empty_record(job: str, function: str, window_id: int, patterns: list[FunctionPattern]) -> FunctionComparison:
    return FunctionComparison(
        schema_version=FUNCTION_COMPARISON_VERSION, job=job, window_id=int(window_id),
        window_start_ms=0, window_s=float(patterns[0].get("window_s", 0.0)) if patterns else 0.0,
        function=function, kind=0, ranks_seen=0, ranks_scored=0, peer_groups=0,
        median_ms_per_step=0.0, groups=[], outliers=[], members=[], member_max_seq=[],
        mixed_signatures=False, member_wait_ms_per_step=[], seqs_compared=0, transfer_ms_median=0.0,
        transfer_ms_per_step=0.0, wait_ms_per_step=0.0, bytes_per_call=0.0,
        stragglers=[], skipped={}, minor_outliers=[], stalls=[])
