"""Device-side duration of collectives from CUDA events, read back without synchronizing.

``begin`` records a start event on the current stream before the call, ``end``
an end event after it; both go into a bounded pending queue. The sender thread
calls :meth:`CudaCommTimer.poll`, which only ``query()``s events (never waits)
and emits comm events for the pairs that completed. Events are pooled.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .counters import DropReason
from .recorder import Recorder

MAX_PENDING = 4096


class CudaCommTimer:
    def __init__(self, torch: Any, rec: Recorder):
        self.torch = torch
        self.rec = rec
        self._pool: deque[Any] = deque()
        self._pending: deque[tuple[Any, Any, tuple]] = deque()

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

    def begin(self, tensor: Any) -> Any:
        """Start event if ``tensor`` lives on a GPU, else None."""
        if not getattr(tensor, "is_cuda", False):
            if isinstance(tensor, (list, tuple)) and tensor and getattr(tensor[0], "is_cuda", False):
                pass
            else:
                return None
        ev = self._event()
        ev.record()
        return ev

    def end(self, start: Any, meta: tuple) -> None:
        if len(self._pending) >= MAX_PENDING:
            self.rec.lost(1, DropReason.CUDA_QUEUE_FULL)
            self._pool.append(start)
            return
        stop = self._event()
        stop.record()
        self._pending.append((start, stop, meta))

    def poll(self) -> int:
        """Emit comm events for completed pairs (sender thread); returns how many."""
        done = 0
        pending = self._pending
        while pending and pending[0][1].query():
            start, stop, (op, ref, seq, nbytes, step, t0) = pending.popleft()
            dur_ns = int(start.elapsed_time(stop) * 1e6)
            self.rec.comm(op, ref, seq, nbytes, step, t0, dur_ns)
            self._pool.append(start)
            self._pool.append(stop)
            done += 1
        return done
