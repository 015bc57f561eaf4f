"""Window buffer of one job's diagnoser: which windows wait, and when each one is ready.

RankWindows and FunctionComparisons are buffered per window. Windows are released
strictly in order. Window W is ready as soon as it is complete: a RankWindow from every
rank of the job (its ``world_size``) and a FunctionComparison for every function those
RankWindows say their ranks sent patterns of (:func:`.rank_records.pattern_functions`)
that the comparators evaluate at once: a collective (its group's members all report it)
or a function every rank reported. Each RankWindow follows its rank's patterns, so
nothing more of W is coming except the comparisons of functions only some ranks ran
(a GC pause here and there): their comparators wait out a grace for the ranks that never
report, and such a comparison arriving after W was evaluated is late (counted, and with
fewer ranks than the job it rarely has peers enough to name anyone). When a rank
or a comparison is missing, the timers stay the fallback: W is ready once its records have
stopped coming for half a grace, a comparison among them (the comparators of all functions
fire within one grace of each other), or two graces + 1 s after its latest RankWindow when no
comparison comes (a hung job produces no patterns). Timed from the latest record, not the
first: a worker near its capacity reads one window's RankWindows and comparisons over
seconds (the ranks' batches come spread over each second and are closed chunk by chunk; a
whole-job function's comparison follows the last rank's pattern), while a small group's
comparison can come with the window's first ranks (decisions table, docs/detection.md:
"quiet, not first"). The caller's clock decides only while the job's
:class:`.job_clock.JobClock` lets it, and, once every rank's RankWindow is in and only
comparisons are missing, only while nothing waits between the stages (``relayed_pending``:
patterns not compared yet, findings not read yet); behind the job (a backlog), a window with a missing record is ready once
records show the job's data a grace and a margin past the window's close -- or, when every
rank's RankWindow is in and only comparisons are missing, past half the window buffer
(``max_open_windows`` / 2 windows) later: behind, the RankWindows of later windows come
straight from the summarizers while a window's comparisons wait for the comparators to
collect every rank's pattern, one more hop; closed on the RankWindows' data time, a 512-rank
backlog's windows were evaluated without their comparisons (all 60 came late) and no
incident opened (tests/integration/faults/test_catch_up.py). Times are the caller's clock; a record added without one is stamped at the
next poll. A record for a window already released is late (counted); at most
``max_open_windows`` wait (the oldest is dropped, counted).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple, cast

from ...schemas.records import FunctionComparison, RankWindow
from ...schemas.vocabulary import FUNCTION_COMPARISON, RANK_WINDOW
from .compare import caught_up_ms, closed_at_ms
from .job_clock import DUE_NOW, Due, JobClock
from .model import COMM_PREFIX
from .policy import DetectionPolicy
from .rank_records import pattern_functions


class ReadyWindow(NamedTuple):
    window_id: int
    rank_windows: dict[int, RankWindow]  # by rank
    comparisons: list[FunctionComparison]  # one per function
    named: Counter[str]  # function -> ranks whose RankWindow names it (patterns they sent)


class JobWindows:
    """Per-job buffer of records by window; see the module docstring."""

    def __init__(self, job: str, policy: DetectionPolicy, skipped: Counter[str], clock: JobClock | None = None):
        self.job, self.policy = job, policy
        self.skipped = skipped  # shared with the diagnoser
        self.rank_windows: dict[int, dict[int, RankWindow]] = {}
        self.comparisons: dict[int, dict[str, FunctionComparison]] = {}
        self.waiting: set[int] = set()  # the windows with a record buffered, not evaluated yet
        self.last_rw: dict[int, int] = {}  # window -> caller ms of its latest RankWindow (-1: none given)
        self.last_in: dict[int, int] = {}  # ... of its latest record, RankWindow or comparison
        self.evaluated_upto: int | None = None
        self.world: dict[int, int] = {}  # window -> largest world_size its RankWindows state
        self.named: dict[int, Counter[str]] = {}  # window -> function -> ranks whose RankWindow names it
        # window -> the functions :meth:`complete` still waits a comparison of, once every rank is in
        # (worked out once, then each comparison that comes strikes its function off; a RankWindow
        # added makes it be worked out again): a 100,000-rank job's window names ~25,000 collective
        # groups, and the diagnoser asks after every chunk of input whether the window is complete
        self._missing: dict[int, set[str]] = {}
        # data time: the latest window close seen
        self.clock = clock if clock is not None else JobClock(policy, caught_up_ms(policy))

    def add(self, record_name: str, record: RankWindow | FunctionComparison, now_wall_ms: int | None = None) -> None:
        """Buffer a RankWindow or FunctionComparison of this job (bad ones counted)."""
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
        if wid not in self.waiting and len(self.waiting) >= self.policy.max_open_windows:
            self._evict_oldest()
        self.waiting.add(wid)
        rank, world, empty = -1, 0, False  # a RankWindow is one rank's: the job clock follows each rank's progress
        if record_name == RANK_WINDOW:
            rw = cast(RankWindow, record)
            rank, world = int(rw.get("rank", -1)), int(rw.get("world_size", 0) or 0)
            empty = not int(rw.get("batches", 0) or 0) and not int(rw.get("steps", 0) or 0)  # a silent rank's
        self.clock.note(closed_at_ms(self.policy, wid), now_wall_ms, rank if rank >= 0 else None, world, empty)
        if record_name == RANK_WINDOW:  # the name says which record it is
            self._add_rank_window(wid, cast(RankWindow, record), now_wall_ms)
        elif record_name == FUNCTION_COMPARISON:
            function = str(record.get("function", ""))
            self.comparisons.setdefault(wid, {})[function] = cast(FunctionComparison, record)
            self.last_in[wid] = now_wall_ms if now_wall_ms is not None else -1
            missing = self._missing.get(wid)
            if missing is not None:
                missing.discard(function)
        else:
            self.skipped["unknown_record"] += 1

    def _add_rank_window(self, wid: int, rw: RankWindow, now_wall_ms: int | None) -> None:
        rank, world = int(rw.get("rank", -1)), int(rw.get("world_size", 0))
        if rank < 0 or (world > 0 and rank >= world):
            self.skipped["unknown_rank"] += 1
            return
        named = self.named.setdefault(wid, Counter())
        self._missing.pop(wid, None)  # the ranks in and the functions named change: worked out again
        earlier = self.rank_windows.setdefault(wid, {}).get(rank)
        if earlier is not None:  # a re-delivered copy replaces the earlier one
            named.subtract(pattern_functions(earlier))
        self.rank_windows[wid][rank] = rw
        named.update(pattern_functions(rw))
        self.world[wid] = max(self.world.get(wid, 0), world)
        self.last_rw[wid] = self.last_in[wid] = now_wall_ms if now_wall_ms is not None else -1

    def _evict_oldest(self) -> None:
        oldest = min(self.waiting)
        self.skipped["window_evicted"] += 1
        self.waiting.discard(oldest)
        for d in (self.rank_windows, self.comparisons, self.world, self.named, self._missing, self.last_rw,
                  self.last_in):
            d.pop(oldest, None)

    def take_ready(self, now_wall_ms: int) -> list[ReadyWindow]:
        """Remove and return the ready windows, in order, up to the first one not ready."""
        out = []
        for wid in sorted(self.waiting):
            for d in (self.last_rw, self.last_in):  # records added without a clock
                if d.get(wid) == -1:
                    d[wid] = now_wall_ms
            if not self._ready(wid, now_wall_ms):
                break
            out.append(self._take(wid))
        return out

    def complete(self, wid: int) -> bool:
        """Every rank's RankWindow of ``wid`` is in, and a comparison of every function they
        name that is a collective or that every rank ran (see the module docstring)."""
        if not self._all_ranks_in(wid):
            return False
        missing = self._missing.get(wid)
        if missing is None:
            ranks = len(self.rank_windows[wid])
            compared = self.comparisons.get(wid, {})
            missing = self._missing[wid] = {f for f, n in self.named.get(wid, {}).items()
                                            if (n >= ranks or f.startswith(COMM_PREFIX)) and f not in compared}
        return not missing

    def _all_ranks_in(self, wid: int) -> bool:
        """Every rank's RankWindow of ``wid`` is in."""
        world, ranks = self.world.get(wid, 0), len(self.rank_windows.get(wid, {}))
        return 0 < world <= ranks

    def _data_point(self, wid: int) -> int:
        """Data time past which ``wid``, not :meth:`complete`, is ready behind the job: its close, or,
        while the comparisons its RankWindows announce are still coming (every rank's RankWindow is
        in), half the window buffer later (see the module docstring)."""
        point = closed_at_ms(self.policy, wid)
        if self._all_ranks_in(wid):
            point += (self.policy.max_open_windows // 2) * self.policy.window_ms
        return point

    def _ready(self, wid: int, now: int) -> bool:
        if self.complete(wid):
            return True
        if self.clock.data_past(self._data_point(wid)):
            return True
        if not self.clock.by_wall(now):
            return False
        if self._all_ranks_in(wid) and self.clock.relayed_pending:
            return False  # only comparisons are missing, and the compare stage may still send them
        grace = self.policy.grace_ms
        last_in, last_rw = self.last_in.get(wid), self.last_rw.get(wid)
        if wid in self.comparisons and last_in is not None and now > last_in + grace // 2:
            return True
        return last_rw is not None and now > last_rw + 2 * grace + self.policy.rank_window_wait_ms

    def due(self) -> Due:
        """When :meth:`take_ready` may next release a window without new input (job_clock.Due):
        the conditions of :meth:`_ready` for the oldest window (released first)."""
        if not self.waiting:
            return Due()
        if any(t == -1 for d in (self.last_rw, self.last_in) for t in d.values()):
            return DUE_NOW  # records added without a clock: stamped at the next poll
        wid = min(self.waiting)
        if self.complete(wid):
            return DUE_NOW
        grace = self.policy.grace_ms
        last_in, last_rw = self.last_in.get(wid), self.last_rw.get(wid)
        walls = ([last_in + grace // 2 + 1] if wid in self.comparisons and last_in is not None else []) + \
            ([last_rw + 2 * grace + self.policy.rank_window_wait_ms + 1] if last_rw is not None else [])
        return Due(wall=min(walls) if walls else None, data=self._data_point(wid))

    def _take(self, wid: int) -> ReadyWindow:
        rws = self.rank_windows.pop(wid, {})
        cmps = list(self.comparisons.pop(wid, {}).values())
        named = self.named.pop(wid, Counter())
        self.waiting.discard(wid)
        for d in (self.world, self._missing, self.last_rw, self.last_in):
            d.pop(wid, None)
        self.evaluated_upto = wid
        return ReadyWindow(wid, rws, cmps, named)

    def empty(self) -> bool:
        return not self.waiting

    def held(self) -> int:
        """Records waiting (RankWindows and comparisons of the windows not evaluated yet): the job's
        diagnosis backlog, what the stage sheds by under overload (``topology.Cores.shed``)."""
        return sum(map(len, self.rank_windows.values())) + sum(map(len, self.comparisons.values()))
