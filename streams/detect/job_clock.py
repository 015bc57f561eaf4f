"""One job's data time on one stage, and which clock may close its windows.

Windows of a rank close by the rank's own data; a window waits a grace for a rank or a
record that is missing. That grace used to run on the caller's (wall) clock only, which is
right while the stage keeps up with the job (data arrives about when it was produced) and
wrong while it is behind -- a worker restarted behind the live head, a burst: the data
being read is minutes old, every rank looks silent on the wall clock, its windows were
closed empty by the timer and the rank's real data then came "late" and was dropped
(~16 % of the events of a 512-rank backlog), and comparisons were evaluated before most
ranks had reported.

A :class:`JobClock` is shared by the cores of one job on one stage that read the same input
partition (the Faust worker names it; in process, one per job): the job's summarizers of
ranks whose batches share a partition, its comparators of functions that do. Within one
partition the data is read in the order it was sent; across partitions it is not (Faust
reads them round robin, one message each, so a partition holding fewer ranks runs seconds
of data ahead of one holding more), so a rank is only judged silent against the ranks
read in order with it. It keeps the job's data
time (``data_ms``: the latest batch time, or window end, its inputs carried, never ahead
of the caller's clock by more than ``future_slack_ms``) and the caller time of the latest
input. Two rules may then close what waits:

* the caller's clock (``by_wall``) -- only while the stage is caught up with the job (its
  data within ``caught_up_ms`` of now: live) or the job's input stopped for a grace (the
  backlog is drained or the job went silent: nothing more of it is coming). A caller that
  knows its input is not all read (the Faust worker: its consumer's lag on the stage's
  topic and on the topics of the stages upstream, set on every timer tick as
  ``input_pending``) says so: a worker starved of CPU may go longer than a grace between
  two messages of a backlog it has not read yet, and the summarizers reading a backlog of
  events send their patterns and windows in bursts seconds apart, each read at once by the
  stages downstream (which saw their own input stop between two bursts and closed a quarter
  of the windows of tests/integration/faults/test_catch_up.py on the wall clock);
* the data clock (``data_past``) -- once the job's data is a grace plus ``margin_ms`` past
  the point, whatever the caller's clock says. The margin covers the skew between the
  partitions a worker reads (one rank's data may be read a little after another's of the
  same time); live, the caller's clock fires first, so the margin costs nothing there.

* the data clock also waits for the ranks behind -- on a stage fed with windows (compare,
  diagnose), each input says which rank's window it is (``rank``), and a rank's windows come
  in order, so a rank whose latest input is of a later window has sent everything it will
  of the earlier ones. A point closes by data only once every rank the clock has seen is
  past it (the low watermark; a rank of the job's world not seen yet counts as at the
  first data the clock saw), leaving out a rank too far behind the job's latest (one that
  does not run the functions of this input, or stopped): live, half the window buffer
  (``max_open_windows``); behind the job, the buffer less two windows (waiting longer would
  only evict windows). Behind, waiting costs no wall time and the skew between partitions
  grows with the backlog: whole partitions can be read more than half the window buffer after
  the others, their ranks left out and their patterns arriving after their comparison
  (docs/detection.md, decisions: "the job clock"). Live, a rank 20 s behind has stopped. Why: the inputs of
  these stages come from summarizers that read different partitions of the events topic,
  and a worker reads those round robin, one message each -- a partition holding fewer
  ranks runs seconds of data ahead of one holding more, the gap growing with the backlog
  (8 s over a 25 s backlog of 512 ranks on 8 partitions, more than the margin): before
  this rule, a quarter of the patterns of that backlog came after their comparison was
  made ("late") and no incident opened (tests/integration/faults/test_catch_up.py).

All are pure functions of what came in and the caller's clock: a backlog of the same data
closes the same windows with the same contents as the data arriving live.
"""

from __future__ import annotations

from typing import NamedTuple

from .policy import DetectionPolicy


class Due(NamedTuple):
    """When a core's poll may next close or emit something without a new input of its own
    (``due()`` of the stages' cores; the stage polls a core on its timer only then,
    streams/topology.py ``Cores``): at caller time ``at`` whatever its job's clock says, at caller
    time ``wall`` once the clock lets the caller's clock decide (:meth:`JobClock.by_wall`), or
    once the job's data is past ``data`` (:meth:`JobClock.data_past`, monotone in the point).
    None: never by that rule. A poll before all three is a no-op (nothing closes, nothing
    changes), so skipping it changes no verdict."""

    at: int | None = None
    wall: int | None = None
    data: int | None = None


DUE_NOW = Due(at=0)


class JobClock:
    """See the module docstring."""

    __slots__ = ("_watermark", "caught_up_ms", "data_ms", "input_ms", "input_pending", "relayed_pending",
                 "live_ms", "margin_ms",
                 "policy", "first_ms", "ranks", "straggle_ms", "world", "live_straggle_ms",
                 "behind_straggle_ms")

    def __init__(self, policy: DetectionPolicy, caught_up_ms: int | None = None):
        self.policy = policy
        self.caught_up_ms = policy.grace_ms if caught_up_ms is None else int(caught_up_ms)
        self.margin_ms = policy.catch_up_margin_ms
        self.data_ms = 0  # the job's latest data time seen (0: none yet)
        self.live_ms = 0  # ... of the inputs that carried data (not a silent rank's empty window)
        self.input_ms: int | None = None  # caller clock of the latest input
        self.input_pending = False  # the caller knows messages of the stage's input wait unread
        # ... of the topics between stages (not the collectors' raw input), unread or in a stage's
        # hands: what the stages upstream will hand on from data already in is still coming
        self.relayed_pending = False
        self.ranks: dict[int, int] = {}  # rank -> the latest data time of its inputs (stages fed with windows)
        # a rank this far behind the job's latest is left out: live, and behind the job
        self.live_straggle_ms = policy.window_ms * max(1, policy.max_open_windows // 2)
        self.behind_straggle_ms = policy.window_ms * max(1, policy.max_open_windows // 2, policy.max_open_windows - 2)
        self.straggle_ms = self.live_straggle_ms  # the one in force: the latest input's (live or behind)
        self.world = 0  # the job's world size as its inputs state (ranks 0 .. world - 1)
        self.first_ms: int | None = None  # the first data time noted with a rank
        self._watermark: int | None = None  # cached low watermark (None: recompute)

    def note(self, data_ms: int, now_ms: int | None, rank: int | None = None, world: int = 0,
             empty: bool = False) -> None:
        """An input of the job carried data up to ``data_ms`` and came at ``now_ms`` (caller clock;
        None: unknown, only the data time moves); ``rank``: the rank whose window it is (inputs
        of one rank come in data order), None when it is no one rank's; ``world``: the job's
        world size it states (0: unknown); ``empty``: a window in which its rank sent nothing
        (closed on the caller's clock while the rank was silent): it moves the rank and the
        job's data time, not the reference the stragglers are measured from."""
        if now_ms is not None:
            data_ms = min(int(data_ms), int(now_ms) + self.policy.future_slack_ms)  # a clock far ahead
            self.input_ms = now_ms if self.input_ms is None else max(self.input_ms, int(now_ms))
        self.data_ms = max(self.data_ms, int(data_ms))
        if now_ms is not None:
            straggle = self.behind_straggle_ms if self.behind_ms(int(now_ms)) > self.caught_up_ms \
                else self.live_straggle_ms
            if straggle != self.straggle_ms:
                self.straggle_ms, self._watermark = straggle, None
        if not empty and data_ms > self.live_ms:
            self.live_ms = int(data_ms)
            self._watermark = None
        if rank is not None:
            if self.first_ms is None:
                self.first_ms = int(data_ms)
            if world > self.world:
                self.world, self._watermark = int(world), None
            latest = self.ranks.get(rank)
            if latest is None or data_ms > latest:
                self.ranks[rank] = int(data_ms)
                self._watermark = None
        elif self.ranks:
            self._watermark = None  # the job's latest moved: who is left out may change

    def low_watermark(self) -> int | None:
        """The latest data time every rank of the job has reached (one not seen yet: the first
        data time noted), leaving out those more than ``straggle_ms`` (live or behind, as the latest
        input found the job) behind the job's latest
        data -- of windows with data: a silent rank's empty windows, closed on the caller's clock
        minutes of them at a time once a backlog is drained, make no one a straggler
        (None: no rank noted)."""
        if not self.ranks or self.first_ms is None:
            return None
        if self._watermark is None:
            floor = (self.live_ms or self.data_ms) - self.straggle_ms
            low = min((t for t in self.ranks.values() if t >= floor), default=self.data_ms)
            if len(self.ranks) < self.world and self.first_ms >= floor:
                low = min(low, self.first_ms)  # a rank not seen yet may be behind every one seen
            self._watermark = low
        return self._watermark

    def behind_ms(self, now_ms: int) -> int:
        """How far the job's data read so far is behind the caller's clock (0 before any)."""
        return max(0, int(now_ms) - self.data_ms) if self.data_ms else 0

    def by_wall(self, now_ms: int) -> bool:
        """Whether the caller's clock may close the job's windows now (see the module docstring)."""
        if self.input_ms is None or self.behind_ms(now_ms) <= self.caught_up_ms:
            return True
        return not self.input_pending and now_ms - self.input_ms > self.policy.grace_ms

    def data_past(self, point_ms: int) -> bool:
        """The job's data is a grace and the margin past ``point_ms`` (data time), and every
        rank seen (bar stragglers) is past it (see the module docstring)."""
        if self.data_ms <= point_ms + self.policy.grace_ms + self.margin_ms:
            return False
        low = self.low_watermark()
        return low is None or low > point_ms


class JobClocks:
    """The clocks of the jobs one stage of one worker follows, by job and input partition."""

    def __init__(self, policy: DetectionPolicy, caught_up_ms: int | None = None):
        self.policy, self.caught_up_ms = policy, caught_up_ms
        self.by_job: dict[tuple[str, int | None], JobClock] = {}

    def input_pending(self, pending: bool, relayed: bool = False) -> None:
        """The caller's input has unread messages (or none), and ``relayed``: those of the topics
        between stages among them (unread, or in an agent's hands): every job's clock is told
        (``JobClock.input_pending``, ``JobClock.relayed_pending``)."""
        for clock in self.by_job.values():
            clock.input_pending, clock.relayed_pending = pending, relayed

    def of(self, job: str, partition: int | None = None) -> JobClock:
        key = (job, partition)
        clock = self.by_job.get(key)
        if clock is None:
            clock = self.by_job[key] = JobClock(self.policy, self.caught_up_ms)
        return clock
