"""Device-side timing from CUDA events, read back without synchronizing.

Two uses, one pending queue:

* **collectives** on CUDA tensors: ``begin`` records a start event on the current stream
  before the call, ``end`` a stop event after it (or in the Work's completion callback,
  whose current stream waits for the collective's kernels). The device time between
  them is the collective as the device ran it, the wait for late peers included: the
  member whose collective starts last on its stream has the shortest time inside, the
  same arrival evidence as the host times of a CPU rank.
* **phases** (forward, backward, optimizer step): ``begin_phase``/``end_phase`` around
  the host's span give its device time (kind ``SpanKind.DEVICE``, named ``cuda:<span
  name>``): the rank's GPU work against its peers', the evidence a slow GPU needs. Only
  once the process has initialized CUDA (``torch.cuda.is_initialized()``): a CPU job on
  a GPU machine gets no CUDA context from us.

The sender thread calls :meth:`CudaCommTimer.poll`, which only ``query()``s stop events
(never waits) and emits an event for every pair that completed, in the order they were
issued. A collective whose stop event has not completed is still running on the device:
with NCCL the host call returns, and its Work's future completes, as soon as the
collective is enqueued, so these pending pairs are the "entered" markers of collectives
(:meth:`entered`, the oldest per group): a hang on the device shows as a collective
pending for seconds. Events are pooled; the queue is bounded (a full one drops the pair
and counts it).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..schemas.vocabulary import SpanKind
from .counters import DropReason
from .events import COMM
from .recorder import Recorder

MAX_PENDING = 4096
DEVICE = int(SpanKind.DEVICE)
DEVICE_PREFIX = "cuda:"  # the name of a phase's device-time span: cuda:<the host span's name>

# pending entries: (start, stop, meta, is_comm); meta (op, group, seq, bytes, step, t0) for a
# collective, (kind, name, step, t0) for a phase
_Pending = tuple[Any, Any, tuple, bool]


class CudaCommTimer:
    def __init__(self, torch: Any, rec: Recorder):
        self.torch = torch
        self.rec = rec
        self._pool: deque[Any] = deque()
        self._pending: deque[_Pending] = deque()
        self._initialized = getattr(torch.cuda, "is_initialized", lambda: True)
        rec.marker_sources.append(self.entered)

    @staticmethod
    def available(torch: Any) -> bool:
        try:
            return bool(torch.cuda.is_available())
        except Exception:  # noqa: BLE001
            return False

    def _event(self) -> Any:
        try:
            return self._pool.pop()
        except IndexError:
            return self.torch.cuda.Event(enable_timing=True)

    # -- collectives --------------------------------------------------------------------
    def begin(self, tensor: Any) -> Any:
        """Start event if ``tensor`` (or the first of a list) lives on a GPU, else None."""
        if not getattr(tensor, "is_cuda", False):
            if not (isinstance(tensor, (list, tuple)) and tensor and getattr(tensor[0], "is_cuda", False)):
                return None
        ev = self._event()
        ev.record()
        return ev

    def end(self, start: Any, meta: tuple) -> None:
        """Stop event of a collective on the current stream; pending until it completes."""
        self._push(start, meta, True)

    # -- phases -------------------------------------------------------------------------
    def begin_phase(self) -> Any:
        """Start event of a phase on the current stream once CUDA is in use, else None."""
        if not self._initialized():
            return None
        ev = self._event()
        ev.record()
        return ev

    def end_phase(self, start: Any, name: str, step: int, t0: int) -> None:
        """Stop event of the phase whose host span is ``name``: a ``SpanKind.DEVICE`` span once done."""
        self._push(start, (DEVICE, DEVICE_PREFIX + name, step, t0), False)

    # -- the sender thread ----------------------------------------------------------------
    def _push(self, start: Any, meta: tuple, is_comm: bool) -> None:
        if len(self._pending) >= MAX_PENDING:
            self.rec.lost(1, DropReason.CUDA_QUEUE_FULL)
            self._pool.append(start)
            return
        stop = self._event()
        stop.record()
        self._pending.append((start, stop, meta, is_comm))

    def poll(self) -> int:
        """Emit events for completed pairs (sender thread); returns how many. Pairs on other
        streams complete out of order: every pending pair is queried, the rest kept in order."""
        pending = self._pending
        if not pending:
            return 0
        done = 0
        keep: list[_Pending] = []
        for _ in range(len(pending)):
            item = pending.popleft()
            start, stop, meta, is_comm = item
            if not stop.query():
                keep.append(item)
                continue
            dur_ns = int(start.elapsed_time(stop) * 1e6)
            if is_comm:
                op, ref, seq, nbytes, step, t0 = meta
                self.rec.comm(op, ref, seq, nbytes, step, t0, dur_ns)
            else:
                kind, name, step, t0 = meta
                self.rec.span_at(kind, name, step, t0, dur_ns)
            self._pool.append(start)
            self._pool.append(stop)
            done += 1
        pending.extendleft(reversed(keep))
        return done

    def entered(self, now_ns: int, min_age_ns: int) -> list[tuple]:
        """Entry markers (``dur_ns`` -1) of the collectives still running on the device, issued
        at least ``min_age_ns`` ago: the oldest per group (the one the others queue behind)."""
        oldest: dict[Any, tuple] = {}
        for _start, _stop, meta, is_comm in list(self._pending):
            if is_comm and now_ns - meta[5] >= min_age_ns and meta[1] not in oldest:
                oldest[meta[1]] = meta
        return [(COMM, op, ref, seq, nbytes, step, t0, -1) for op, ref, seq, nbytes, step, t0 in oldest.values()]

    @property
    def pending(self) -> int:
        return len(self._pending)

