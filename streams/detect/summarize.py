"""Stage 1: one rank's EventBatches and HardwareBatches -> per-window records.

The summarizer checks each batch (this job and rank, batch seq increasing per
process: a repeat is a duplicate, a gap counts lost batches), then hands it on:
:mod:`.chunk_fold` folds the events into windows (one batch: a chunk of one; wall time
from the rank's own clock, span durations net of nested collective time), hardware samples go to the
window of their wall time, :mod:`.rank_windows` decides when each window closes
(the rank's data past its end by ``close_lag_ms``, or the caller's clock past end +
grace once the rank went quiet, so a silent rank still produces RankWindows with zero
steps), and :mod:`.rank_records` closes it into FunctionPatterns and a RankWindow.
A batch marked ``final`` (EventBatch v4: the collector's exit flush) ends the rank: the
batch closes every open window at once (counted in ``final_closed``; the next poll
emits them), the last one marked ``ended_cleanly``, so the last partial window of a
finished job is stored too.
Batches of the same process after that are late (counted, dropped); a new process of
the same rank (a restart) starts again.
Bad input is skipped and counted in ``skipped``; it never raises.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ...schemas.records import FunctionPattern, RankWindow
from .accumulate import RankHealth, RankMeta, RankProgress, WindowAcc
from .chunk_fold import ERRORS, ChunkResult, fold_chunk
from .job_clock import DUE_NOW, Due, JobClock
from .policy import DetectionPolicy
from .rank_events import RankFold
from .rank_records import Closing
from .rank_windows import RankWindows
from .step_gating import gate_of, recorded_only
from .window_close import close_windows


class RankSummarizer:
    """Per (job, rank) window accumulator; see the module docstring."""

    def __init__(self, job: str, rank: int, policy: DetectionPolicy | None = None, clock: JobClock | None = None):
        self.job, self.rank = job, int(rank)
        self.policy = policy or DetectionPolicy()
        self.skipped: Counter[str] = Counter()
        self.meta = RankMeta(job, self.rank, 0, "", -1)
        self.progress = RankProgress()
        self.health = RankHealth()
        self.clock = clock if clock is not None else JobClock(self.policy)  # shared by the job's ranks
        self.windows = RankWindows(self.policy, self.skipped, self.clock)
        self.events = RankFold(self.windows, self.progress, self.policy, self.skipped)
        self._batch_seq: tuple[int, int] | None = None  # (pid, last seq)
        self.collector_dropped = 0  # the batch header's cumulative count
        self.batches_since_close = 0  # sign of life, heartbeats included
        self.ended = False  # the rank's final batch came: its windows are closed
        self._closed_at_end: list[tuple[int, WindowAcc]] = []  # closed by the final batch, not yet emitted
        self.final_closed = 0  # windows closed because the final batch came (not by time)

    # ---- input -------------------------------------------------------------------------
    def add_events(self, batch: dict, now_wall_ms: int | None = None) -> None:
        """Fold one decoded EventBatch in. Never raises on bad content."""
        if self._open(batch):
            try:
                self._fold_one(recorded_only(batch, gate_of(batch)))
                self._folded(batch, now_wall_ms)
            except ERRORS as exc:
                self._bad(exc)
        self._note_dropped()
        self._note_input(now_wall_ms)

    def _fold_one(self, batch: dict) -> None:
        """Fold one batch's events in: the chunk fold of a chunk of one (raises what rejected it)."""
        error = fold_chunk([(self.events, batch)]).errors.get(0)
        if error is not None:
            raise error

    def _open(self, batch: dict) -> bool:
        """Check a batch's header (job, rank, batch seq) and take its identity; whether to fold it."""
        try:
            if int(batch["rank"]) != self.rank or batch["job"] != self.job:
                self.skipped["wrong_rank_or_job"] += 1
                return False
            if not self._accept_seq(int(batch.get("pid", 0)), int(batch["seq"])):
                return False
            if self.ended:  # a new process of this rank (another pid) after the final batch
                self.ended = False
                self.windows.reopen()
            self.batches_since_close += 1
            self.meta = RankMeta(self.job, self.rank, int(batch["world_size"]),
                                 str(batch["host"]), int(batch["gpu"]),
                                 _mesh_coords(batch.get("mesh_coords")) or self.meta.mesh_coords,
                                 str(batch.get("gpu_uuid") or "") or self.meta.gpu_uuid,
                                 list(batch.get("flight_records") or []) or self.meta.flight_records,
                                 gate_of(batch))
            self.collector_dropped = int(batch.get("dropped_events", 0))
            return True
        except ERRORS as exc:
            self._bad(exc)
            return False

    def _folded(self, batch: dict, now_wall_ms: int | None) -> None:
        """After a batch was folded in: the job's clock moves, a final batch ends the rank."""
        self.clock.note(int(batch["wall_ns"]) // 1_000_000, now_wall_ms)
        if batch.get("final"):
            self.ended = True
            closed = self.windows.close_all()
            self._closed_at_end += closed
            self.final_closed += len(closed)

    def _bad(self, exc: Exception) -> None:
        self.skipped[f"bad_batch:{type(exc).__name__}"] += 1

    def _accept_seq(self, pid: int, seq: int) -> bool:
        prev = self._batch_seq
        if prev is not None and prev[0] == pid:
            if self.ended:
                self.skipped["after_final"] += 1
                return False
            if seq <= prev[1]:
                self.skipped["duplicate_batch"] += 1
                return False
            self.health.lost_batches += max(0, seq - prev[1] - 1)
        elif prev is not None:  # another process of this rank under the same job id: a restart
            self.health.restarts += 1
        self._batch_seq = (pid, seq)
        return True

    def add_hardware(self, hw: dict, now_wall_ms: int | None = None) -> None:
        """Fold one decoded HardwareBatch in (samples bucketed by their wall time)."""
        try:
            if int(hw["rank"]) != self.rank:
                self.skipped["wrong_rank_or_job"] += 1
                return
            if self.ended:  # its windows are closed: samples that came after the final batch
                self.skipped["after_final"] += 1
                return
            for i, wall in enumerate(list(hw["wall_ns"])):
                w = self.windows.slot(int(wall) // 1_000_000)
                if w is not None:
                    w.add_hw_sample(hw, i)
        except ERRORS as exc:
            self.skipped[f"bad_hardware:{type(exc).__name__}"] += 1
        self._note_input(now_wall_ms)

    def _note_dropped(self) -> None:
        """What the collector dropped, and what came too late for its window here (a paused
        pipeline, a stalled consumer): reported together, never silently lost."""
        self.health.dropped_events = self.collector_dropped + self.windows.dropped

    def _note_input(self, now_wall_ms: int | None) -> None:
        if now_wall_ms is not None:
            self.windows.last_input_ms = int(now_wall_ms)

    def closed_at_end_pending(self) -> int:
        """Windows the final batch closed that the next poll emits (for the worker's counters)."""
        return len(self._closed_at_end)

    # ---- output ------------------------------------------------------------------------
    def poll(self, now_wall_ms: int, flush: bool = False) -> list[tuple[str, FunctionPattern | RankWindow]]:
        """Close every finished window, in order; ``flush`` closes all open ones, and so does a
        final batch (the last window closed then says the rank ended cleanly)."""
        return close_windows(self.closing(now_wall_ms, flush))

    def closing(self, now_wall_ms: int, flush: bool = False) -> list[Closing]:
        """The windows :meth:`poll` closes, taken out, their records not made yet
        (:func:`poll_many` makes those of many ranks together)."""
        self._note_dropped()
        due = self.windows.close_due(now_wall_ms, flush)
        final, self._closed_at_end = self._closed_at_end, []
        ending = bool(final)
        windows = due + final
        out = []
        for i, (wid, w) in enumerate(windows):
            out.append(Closing(self.meta, wid, self.policy.window_s, w, self.progress, self.health,
                               batches=self.batches_since_close, ended=ending and i == len(windows) - 1))
            self.batches_since_close = 0
        return out

    def due(self) -> Due:
        """When :meth:`poll` may next emit something without new input (job_clock.Due)."""
        return DUE_NOW if self._closed_at_end else self.windows.due()

    def idle(self, now_wall_ms: int) -> bool:
        """True when nothing is open and no input came for idle_after_s (caller may drop us)."""
        return self.windows.idle(now_wall_ms)


MAX_MESH_DIMS = 16


def _mesh_coords(value: object) -> dict[str, int]:
    """A batch's ``mesh_coords`` (EventBatch v5) as {dim name: coordinate}; {} when absent."""
    if not isinstance(value, dict) or not value:
        return {}
    return {str(k): int(v) for k, v in list(value.items())[:MAX_MESH_DIMS]}


def add_batches(items: Sequence[tuple[RankSummarizer, bool, dict]], now_wall_ms: int | None = None) -> ChunkResult:
    """Feed many decoded batches at once: ``(summarizer, is_hardware, batch)``, each rank's in the
    order they came. The same as :meth:`RankSummarizer.add_events` and
    :meth:`~RankSummarizer.add_hardware` one by one, in order, but the EventBatches are folded
    together (:mod:`.chunk_fold`, which folds a rank's first batch ever before its others): in
    rounds, a rank's batches up to its next HardwareBatch or final batch in one round, so what
    each rank sees comes in its own order."""
    rounds: list[list[tuple[RankSummarizer, bool, dict]]] = []
    level: dict[int, int] = {}  # id(summarizer) -> the round its next batch goes to
    for item in items:
        s, hardware, batch = item
        k = level.get(id(s), 0)
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(item)
        if hardware or (isinstance(batch, dict) and batch.get("final")):
            level[id(s)] = k + 1  # what comes after it waits for the round to be folded
    total = ChunkResult()
    for round_items in rounds:
        opened = [(s, b) for s, hardware, b in round_items if not hardware and s._open(b)]
        result = fold_chunk([(s.events, recorded_only(b, gate_of(b))) for s, b in opened])
        for i, (s, b) in enumerate(opened):
            exc = result.errors.get(i)
            try:
                if exc is None:
                    s._folded(b, now_wall_ms)
                else:
                    s._bad(exc)
            except ERRORS as err:
                s._bad(err)
        for s, hardware, b in round_items:
            if hardware:
                s.add_hardware(b, now_wall_ms)
            else:
                s._note_dropped()
                s._note_input(now_wall_ms)
        total.sequential += result.sequential
        total.folded += result.folded
        total.failure = total.failure or result.failure
    return total


def poll_many(summarizers: Sequence[RankSummarizer], now_wall_ms: int,
              flush: bool = False) -> tuple[list[tuple[str, FunctionPattern | RankWindow]], list[Exception]]:
    """:meth:`RankSummarizer.poll` of each, in order, with the records of every window closed made
    together (:func:`.window_close.close_windows`). Returns (records, what failed): a summarizer
    whose poll raises is left out (its error returned), and should making the records together
    fail, each window's are made alone, the failing ones' errors returned."""
    closing: list[Closing] = []
    failed: list[Exception] = []
    for s in summarizers:
        try:
            closing += s.closing(now_wall_ms, flush)
        except Exception as exc:  # one rank's bad state must not stop the others' windows
            failed.append(exc)
    try:
        return close_windows(closing), failed
    except Exception:
        out: list[tuple[str, FunctionPattern | RankWindow]] = []
        for c in closing:
            try:
                out += close_windows([c])
            except Exception as exc:
                failed.append(exc)
        return out, failed
