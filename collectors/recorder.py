"""The hot path: constant-time recording of events into a bounded buffer.

Every method here runs on the training thread (or a communication thread for
async completions). Each one does a few attribute reads, one tuple and one
``deque.append``; the deque has ``maxlen``, so when it is full the oldest event
falls out and the ``overflow`` cell counts it. Nothing formats, encodes or blocks here.

Drops are counted here and nowhere else: the appends (and the one inlined copy
of an append in :mod:`.comm`) add to ``overflow``, lock-free; every other loss
(an undelivered batch, a full CUDA queue) goes through :meth:`Recorder.lost`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..schemas.vocabulary import SpanKind
from .counters import CollectorCounters, DropReason
from .events import COMM, ITER, SPAN, GroupRef
from .iteration import ExplicitSteps, Iteration, IterationDetector, Token
from .safety import ErrorBudget

StepListener = Callable[[int], None]


class Recorder:
    """Bounded event buffer plus the iteration state spans are tagged with."""

    def __init__(self, capacity: int, detector: IterationDetector, errors: ErrorBudget,
                 counters: CollectorCounters | None = None):
        self.capacity = capacity
        self.events: deque[tuple] = deque(maxlen=capacity)
        self.counters = counters if counters is not None else CollectorCounters()
        self.overflow = self.counters.cell(CollectorCounters.events_dropped,
                                           DropReason.BUFFER_FULL.value)
        self.step = -1
        self.detector = detector
        self.explicit: ExplicitSteps | None = None
        self.errors = errors
        self._step_listeners: list[StepListener] = []
        # collectives entered and not completed, as (op, group, seq, bytes, step, t0): the
        # synchronous call the training thread is blocked in, and issued async calls by (group, seq)
        self.blocking: tuple | None = None
        self.in_flight: dict[tuple[GroupRef, int], tuple] = {}
        # more entry markers, (now_ns, min_age_ns) -> marker tuples: collectives still running
        # on a device after the host call returned (:meth:`.cuda_timing.CudaCommTimer.entered`)
        self.marker_sources: list[Callable[[int, int], list[tuple]]] = []

    # -- drops ----------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Events lost so far, for every reason (the count every batch header carries)."""
        return self.counters.events_dropped

    def lost(self, n_events: int, reason: DropReason = DropReason.UNDELIVERED) -> None:
        """Count events lost after they left the buffer, or that never reached it."""
        self.counters.inc(CollectorCounters.events_dropped, reason.value, by=n_events)

    # -- events ---------------------------------------------------------------------------
    def span(self, kind: int, name: str, start_ns: int, dur_ns: int) -> None:
        events = self.events
        if len(events) >= self.capacity:
            self.overflow.value += 1
        events.append((SPAN, kind, name, self.step, start_ns, dur_ns))

    def span_at(self, kind: int, name: str, step: int, start_ns: int, dur_ns: int) -> None:
        """A span of an earlier step (read back later, e.g. a phase's device time)."""
        events = self.events
        if len(events) >= self.capacity:
            self.overflow.value += 1
        events.append((SPAN, kind, name, step, start_ns, dur_ns))

    def comm(self, op: str, group: GroupRef, seq: int, nbytes: int, step: int,
             start_ns: int, dur_ns: int) -> None:
        events = self.events
        if len(events) >= self.capacity:
            self.overflow.value += 1
        events.append((COMM, op, group, seq, nbytes, step, start_ns, dur_ns))

    def _iteration(self, it: Iteration) -> None:
        events = self.events
        if len(events) >= self.capacity:
            self.overflow.value += 1
        events.append((ITER, it.step, it.start_ns, it.dur_ns))

    # -- iteration marks ------------------------------------------------------------------
    def fetch(self, name: str, start_ns: int, end_ns: int) -> None:
        """A data fetch: a dataloader span and a FETCH token for iteration detection."""
        self._mark(SpanKind.DATALOADER, Token.FETCH, name, start_ns, end_ns)

    def optimizer_step(self, name: str, start_ns: int, end_ns: int) -> None:
        self._mark(SpanKind.OPTIMIZER, Token.OPT, name, start_ns, end_ns)

    def _mark(self, kind: int, token: int, name: str, start_ns: int, end_ns: int) -> None:
        """The span, then the token for iteration detection (unless steps are explicit)."""
        self.span(kind, name, start_ns, end_ns - start_ns)
        if self.explicit is not None:
            return
        before = self.step
        for it in self.detector.feed(token, start_ns, end_ns):
            self._iteration(it)
        self.step = self.detector.step
        if self.step != before and self.step >= 0:
            self._notify(self.step)

    def mark_step(self, now_ns: int) -> None:
        """Explicit ``step()``: ends the running iteration, starts the next one."""
        if self.explicit is None:
            self.explicit = ExplicitSteps(max(self.detector.next_step, self.step + 1))
        done = self.explicit.mark(now_ns)
        if done is not None:
            self._iteration(done)
        self.step = self.explicit.step
        self._notify(self.step)

    def add_step_listener(self, listener: StepListener) -> None:
        """Call ``listener(step)`` on the training thread whenever a new iteration starts."""
        self._step_listeners.append(listener)

    def remove_step_listener(self, listener: StepListener) -> None:
        if listener in self._step_listeners:
            self._step_listeners.remove(listener)

    def _notify(self, step: int) -> None:
        for listener in tuple(self._step_listeners):
            try:
                listener(step)
            except Exception as exc:  # noqa: BLE001 - never into the training loop
                self.errors.caught("step listener", exc)

    def in_flight_markers(self, now_ns: int, min_age_ns: int) -> list[tuple]:
        """Entry markers (comm events with ``dur_ns`` -1: entered, still in flight) of the
        collectives entered at least ``min_age_ns`` ago and not completed (sender thread)."""
        calls = list(self.in_flight.values())
        blocking = self.blocking
        if blocking is not None:
            calls.append(blocking)
        markers = [(COMM, op, ref, seq, nbytes, step, t0, -1)
                   for op, ref, seq, nbytes, step, t0 in calls if now_ns - t0 >= min_age_ns]
        if self.marker_sources:
            have = {(m[2], m[3]) for m in markers}
            for source in self.marker_sources:
                markers += [m for m in source(now_ns, min_age_ns) if (m[2], m[3]) not in have]
        return markers

    # -- draining (sender thread) ---------------------------------------------------------
    def drain(self, limit: int) -> list[tuple]:
        """Pop up to ``limit`` events, oldest first (thread-safe: deque pops are atomic)."""
        out = []
        pop = self.events.popleft
        try:
            for _ in range(limit):
                out.append(pop())
        except IndexError:
            pass
        return out

    def silence(self) -> None:
        """In a forked child (e.g. a DataLoader worker): keep recording harmlessly, send nothing."""
        self.capacity = 1
        self.events = deque(maxlen=1)
        self._step_listeners = []
        self.in_flight = {}
        self.marker_sources = []
