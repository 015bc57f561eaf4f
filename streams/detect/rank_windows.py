"""Window bookkeeping of one rank: which windows are open, and when each one closes.

An event at wall time ``wall_ms`` (the rank's own host clock) belongs to window
``floor(wall_ms / window_ms)``. Windows close strictly in order from ``next_window``
(the lowest one not yet closed): when this rank's data has moved ``close_lag_ms``
past a window's end, or, once the rank has gone quiet, a grace past its end: quiet on the
caller's clock (no input for a grace) while the job's :class:`.job_clock.JobClock` lets the
caller's clock close windows (the stage keeps up with the job, or the job's input
stopped), or quiet on the job's data time (the other ranks' data a grace and a margin
past this rank's and past the window's end) -- so a backlog read long after it was
produced closes exactly the windows the same data closes live. A quiet rank so
keeps closing empty windows (liveness and hang detection need them) until it has been
silent for ``idle_after_s``. An event is implausible, counted and dropped, when it lies
outside [batch wall time - max_duration_s, batch wall time + future_slack_ms]: a
corrupt timestamp must not open far-away windows or close the current ones early.
At most ``max_open_windows`` are open; events for more are counted and dropped. One poll
closes at most ``MAX_CLOSED_PER_POLL`` windows (the rest at the next tick): a drained backlog
of a job that went silent would otherwise close minutes of empty windows of every rank in
one timer tick, and the diagnoser, which holds ``max_open_windows`` windows, would evict the
job's last window with data before every rank's copy of it came.
``dropped`` counts the well-formed events dropped for want of an open window (late or
too many open): the RankWindow reports them with the collector's own drops.
"""

from __future__ import annotations

import math
from collections import Counter

from .accumulate import WindowAcc
from .job_clock import DUE_NOW, Due, JobClock
from .policy import DetectionPolicy

MAX_CLOSED_PER_POLL = 4  # live, a rank's windows close one per window length; half the diagnoser's max_open_windows


class RankWindows:
    """Open windows of one rank and the clocks that close them."""

    def __init__(self, policy: DetectionPolicy, skipped: Counter[str], clock: JobClock | None = None):
        self.policy = policy
        self.skipped = skipped  # shared with the summarizer
        self.clock = clock if clock is not None else JobClock(policy)  # the job's (shared by its ranks)
        self.windows: dict[int, WindowAcc] = {}
        self.next_window: int | None = None  # lowest window not yet closed
        self.data_ms = 0  # latest event wall time seen
        self.last_input_ms = 0  # caller clock of the latest input
        self.batch_wall_ms = 0  # wall time of the batch being folded in (plausibility reference)
        self.dropped = 0  # events dropped: late for their window, or too many windows open
        self.ended = False  # every window was closed by the rank's final batch: emit no empty ones

    def in_range(self, wall_ms: int) -> bool:
        """Events happen before their batch is sent, and not hours before."""
        lo, hi = self.range_ms()
        return lo <= wall_ms <= hi

    def range_ms(self) -> tuple[float, float]:
        """The (lowest, highest) plausible event wall time of the batch being folded in
        (everything before the first batch's time is known)."""
        ref = self.batch_wall_ms
        if not ref:
            return -math.inf, math.inf
        return ref - self.policy.max_duration_s * 1000, ref + self.policy.future_slack_ms

    def plausible(self, wall_ms: int) -> bool:
        """:meth:`in_range`, counting the events that are not."""
        if not self.in_range(wall_ms):
            self.skipped["bad_timestamp"] += 1
            return False
        return True

    def note_data(self, wall_ms: int) -> None:
        """The rank's data reached ``wall_ms`` (the first data fixes the first window)."""
        self.data_ms = max(self.data_ms, wall_ms)
        if self.next_window is None:
            self.next_window = wall_ms // self.policy.window_ms

    def slot(self, wall_ms: int) -> WindowAcc | None:
        """The open window holding ``wall_ms``; None (counted) when it cannot be kept."""
        if not self.plausible(wall_ms):
            return None
        return self.open_slot(wall_ms // self.policy.window_ms)

    def open_slot(self, wid: int) -> WindowAcc | None:
        """:meth:`slot` of window ``wid`` for a time already found plausible."""
        if self.next_window is not None and wid < self.next_window:
            self.skipped["late_event"] += 1
            self.dropped += 1
            return None
        if wid not in self.windows:
            if len(self.windows) >= self.policy.max_open_windows:
                self.skipped["too_many_open_windows"] += 1
                self.dropped += 1
                return None
            self.windows[wid] = WindowAcc()
        return self.windows[wid]

    def close_due(self, now_wall_ms: int, flush: bool = False) -> list[tuple[int, WindowAcc]]:
        """Remove and return every finished window, in order; ``flush`` closes all open ones."""
        out: list[tuple[int, WindowAcc]] = []
        if self.next_window is None or (self.ended and not self.windows):
            return out
        wms, lag, grace = self.policy.window_ms, self.policy.close_lag_ms, self.policy.grace_ms
        last_open = max(self.windows) if self.windows else self.next_window - 1
        # by the rank's own data; once the rank went quiet, by the caller's clock while the job's
        # clock allows it (live), else by the job's data time (a backlog: data far behind now)
        clock = self.clock
        quiet_wall = now_wall_ms - self.last_input_ms > grace and clock.by_wall(now_wall_ms)
        quiet_data = clock.data_past(self.data_ms)
        while True:
            wid = self.next_window
            end = (wid + 1) * wms
            done = (self.data_ms >= end + lag or (quiet_wall and now_wall_ms > end + grace)
                    or (quiet_data and clock.data_past(end)))
            if not (done or (flush and wid <= last_open)):
                break
            if wid not in self.windows and self._silent_too_long(end):
                break
            out.append((wid, self.windows.pop(wid, WindowAcc())))
            self.next_window = wid + 1
            if len(out) >= MAX_CLOSED_PER_POLL and not flush:
                break  # bounded work per poll (a drained backlog: minutes of empty windows); the rest next tick
        return out

    def due(self) -> Due:
        """When :meth:`close_due` may next close a window, or :meth:`idle` turn true, with no new
        input (the conditions of :meth:`close_due` for the next window, which closes first)."""
        pol = self.policy
        idle_at = None if self.windows else max(self.last_input_ms, self.data_ms) + int(pol.idle_after_s * 1000) + 1
        if self.next_window is None or (self.ended and not self.windows):
            return Due(at=idle_at)
        end = (self.next_window + 1) * pol.window_ms
        if self.data_ms >= end + pol.close_lag_ms:
            return DUE_NOW  # left by the bound on windows closed per poll
        if self.next_window not in self.windows and self._silent_too_long(end):
            return Due(at=idle_at)
        return Due(at=idle_at, wall=max(self.last_input_ms, end) + pol.grace_ms + 1, data=max(self.data_ms, end))

    def close_all(self) -> list[tuple[int, WindowAcc]]:
        """The rank ended (its final batch came): remove and return every open window up to the
        last one holding data, in order (empty ones between included; at least one, the next,
        so the end is always marked); later data is late."""
        out: list[tuple[int, WindowAcc]] = []
        if self.next_window is None:
            return out
        last = max(self.windows, default=self.next_window)  # none open: the next one, empty
        for wid in range(self.next_window, last + 1):
            out.append((wid, self.windows.pop(wid, WindowAcc())))
        self.next_window = max(self.next_window, last + 1)
        self.ended = True
        return out

    def reopen(self) -> None:
        """A new process of the rank reports after it ended: its windows close by time again."""
        self.ended = False

    def _silent_too_long(self, end_ms: int) -> bool:
        """Stop emitting empty windows once the rank has been silent for idle_after_s."""
        return end_ms - self.data_ms > self.policy.idle_after_s * 1000

    def idle(self, now_wall_ms: int) -> bool:
        """True when nothing is open and no input came for idle_after_s."""
        quiet_ms = self.policy.idle_after_s * 1000
        return not self.windows and now_wall_ms - max(self.last_input_ms, self.data_ms) > quiet_ms
