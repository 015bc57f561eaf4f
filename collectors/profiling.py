"""Synchronized profiling windows with torch.profiler, summarized per op (never raw traces).

A window starts at an iteration boundary: the ``start_step`` of a ``pt.control``
PROFILE request (identical on every rank, so all ranks profile the same
iterations), or, for the low duty cycle, the first boundary after each multiple
of ``profile_every_s`` of wall time (ranks' clocks agree to well under one
iteration). It stops at the first boundary after ``duration_s``, or after ``max_steps``
iterations (``profile_max_steps``, 10) if that comes first. Starting and stopping run on the
training thread; stopping is *not* cheap: torch.profiler's ``stop()`` processes every op
recorded (tens of microseconds per op on a small host: a long window of small ops takes
longer to stop than it ran, and stalls the rank and with it the whole job; measured in
docs/collectors.md, "Profiling windows and control"). The step limit bounds that to a few steps'
worth of ops (summaries need a few iterations, not thousands). Turning the trace into per-op
summaries (count, total, p50, p99, max) runs on a thread of its own (``perftracker-profile``,
started by the sender when a window has finished), never on the sender thread, whose
batches must keep going out meanwhile.

At exit a window still running is stopped and summarized with any finished one not yet
summarized, on a separate thread given at most ``exit_budget_s``; what is not done by then
is dropped and counted (``profile_windows_dropped``): turning a long window's trace into
summaries takes seconds to a minute of Python, and the training process must end when its
user's code ends (ranks took 30-75 s to exit before). A summary the summary thread is still
working on at exit gets the same budget, then is dropped and counted the same way.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..schemas.vocabulary import OpKind
from .events import OpSummary
from .safety import ErrorBudget

log = logging.getLogger("perftracker_ml.collectors")

MAX_OPS_PER_WINDOW = 200


@dataclass(frozen=True)
class ProfileRequest:
    request_id: str
    start_step: int
    duration_s: float


@dataclass
class _Active:
    profiler: Any
    request_id: str
    stop_at: float
    steps: int = 0  # iteration boundaries passed since the start


class ProfileWindows:
    def __init__(self, torch: Any, emit: Callable[[list[OpSummary]], None], errors: ErrorBudget,
                 every_s: float, duration_s: float,
                 on_change: Callable[[bool], None] = lambda active: None,
                 on_dropped: Callable[[int], None] = lambda n: None, exit_budget_s: float = 1.0,
                 max_steps: int = 0):
        self.torch = torch
        self.emit = emit
        self.errors = errors
        self.every_s = every_s
        self.duration_s = duration_s
        self.on_change = on_change
        self.on_dropped = on_dropped
        self.exit_budget_s = exit_budget_s
        self.max_steps = max_steps  # a window ends after this many iterations at most (0: no limit)
        self._closed = False
        self._parsing = 0  # windows popped and not yet emitted (by the summary thread or the exit one)
        self._parsing_lock = threading.Lock()
        self._summarizer: threading.Thread | None = None  # the summary thread, while it has work
        self._gave_up = False  # the exit budget ran out: the exit thread emits nothing more
        self._requests: deque[ProfileRequest] = deque(maxlen=16)
        self._stop_requested = threading.Event()
        self._active: _Active | None = None
        self._finished: deque[tuple[str, Any]] = deque(maxlen=4)
        self._next_duty = self._next_duty_after(time.time()) if every_s > 0 else math.inf

    def _next_duty_after(self, wall_s: float) -> float:
        return (math.floor(wall_s / self.every_s) + 1) * self.every_s

    # -- any thread -----------------------------------------------------------------------
    def request(self, req: ProfileRequest) -> None:
        self._requests.append(req)

    def request_stop(self) -> None:
        self._stop_requested.set()

    # -- training thread (a step listener) -----------------------------------------------
    def on_step(self, step: int) -> None:
        active = self._active
        if active is not None:
            active.steps += 1
            if (time.monotonic() >= active.stop_at or self._stop_requested.is_set()
                    or (self.max_steps and active.steps >= self.max_steps)):
                self._stop()
            return
        if self._stop_requested.is_set():  # a stop that came with no window running
            self._stop_requested.clear()
        if self._requests and step >= self._requests[0].start_step:
            req = self._requests.popleft()
            self._start(req.request_id, req.duration_s)
        elif time.time() >= self._next_duty:
            period = int(self._next_duty // self.every_s)
            self._next_duty = self._next_duty_after(time.time())
            self._start(f"duty-{period}", self.duration_s)

    def _start(self, request_id: str, duration_s: float) -> None:
        prof = self.torch.profiler
        activities = [prof.ProfilerActivity.CPU]
        if self.torch.cuda.is_available():
            activities.append(prof.ProfilerActivity.CUDA)
        profiler = prof.profile(activities=activities, record_shapes=False, with_stack=False)
        profiler.start()
        self._active = _Active(profiler, request_id, time.monotonic() + duration_s)
        self.on_change(True)

    def _stop(self) -> None:
        active, self._active = self._active, None
        if active is None:
            return
        active.profiler.stop()
        self._finished.append((active.request_id, active.profiler))
        self.on_change(False)

    def close(self) -> None:
        self._closed = True
        try:
            self._stop()
        except Exception as exc:  # noqa: BLE001
            self.errors.caught("profiler stop", exc)

    # -- sender thread --------------------------------------------------------------------
    def summarize_finished(self) -> None:
        """The sender's task: hand finished windows to a summary thread and return at once.
        Summarizing a window's trace takes seconds to a minute of Python on a loaded host;
        run on the sender thread, it would hold every batch back meanwhile, and the pipeline
        would see the steps stop (docs/collectors.md, "Profiling windows and control")."""
        if not self._closed:
            worker = self._summarizer
            if self._finished and (worker is None or not worker.is_alive()):
                self._summarizer = threading.Thread(target=self._summarize_quietly, name="perftracker-profile",
                                                    daemon=True)
                self._summarizer.start()
            return
        background = self._summarizer
        busy = background is not None and background.is_alive()
        if not self._finished and not busy:
            return
        # at exit: within a time budget (see the module's docstring)
        deadline = time.monotonic() + self.exit_budget_s
        worker = threading.Thread(target=self._summarize_quietly, name="perftracker-profile-exit", daemon=True)
        worker.start()
        for thread in (worker, background):
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive() or (background is not None and background.is_alive()):
            self._gave_up = True
            dropped = len(self._finished) + self._parsing
            self._finished.clear()
            self.on_dropped(dropped)
            log.info("perftracker: %d profiling window(s) not summarized within %.1f s at exit",
                     dropped, self.exit_budget_s)

    def wait_summarized(self, timeout_s: float) -> bool:
        """Wait until the summary thread has nothing left (tests); whether it finished."""
        worker = self._summarizer
        if worker is not None:
            worker.join(timeout_s)
        return not self._finished and not self._parsing

    def _summarize_quietly(self) -> None:
        try:
            self._summarize_all()
        except Exception as exc:  # noqa: BLE001 - never raised into the training process
            self.errors.caught("profile summary", exc)

    def _summarize_all(self) -> None:
        while self._finished:
            try:
                request_id, profiler = self._finished.popleft()
            except IndexError:  # taken by another thread, or cleared at exit meanwhile
                return
            with self._parsing_lock:
                self._parsing += 1
            try:
                ops = summarize_events(profiler.events(), request_id)
                if not self._gave_up:
                    self.emit(ops)
            finally:
                with self._parsing_lock:
                    self._parsing -= 1


def classify(name: str, is_device: bool) -> OpKind:
    lowered = name.lower()
    if "nccl" in lowered:
        return OpKind.COMM_KERNEL
    if not is_device:
        return OpKind.CPU_OP
    if "memcpy" in lowered:
        return OpKind.MEMCPY
    if "memset" in lowered:
        return OpKind.MEMSET
    return OpKind.CUDA_KERNEL


def percentile(sorted_values: list[int], q: float) -> int:
    """The q-th percentile of ascending values, linear interpolation (numpy's default),
    in pure Python: the collectors must not need numpy in a training image."""
    pos = q / 100.0 * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return int(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def summarize_events(events: Any, request_id: str) -> list[OpSummary]:
    """Per (kind, name): count, total, p50, p99, max in ns; the costliest ops first."""
    durations: dict[tuple[OpKind, str], list[int]] = {}
    for evt in events:
        is_device = "CUDA" in str(getattr(evt, "device_type", "CPU"))
        dur_ns = int(evt.time_range.elapsed_us() * 1000)
        durations.setdefault((classify(evt.name, is_device), evt.name), []).append(dur_ns)
    out = []
    for (kind, name), durs in durations.items():
        durs.sort()
        out.append(OpSummary(kind, name, request_id, len(durs), sum(durs),
                             percentile(durs, 50), percentile(durs, 99), durs[-1]))
    out.sort(key=lambda s: s.total_ns, reverse=True)
    return out[:MAX_OPS_PER_WINDOW]
