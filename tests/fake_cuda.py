"""A fake CUDA runtime (``torch.cuda``'s surface the collectors use) and an NCCL-like group, for CI.

CI has no GPU, yet the collectors' GPU branches (:mod:`perftracker_ml.collectors.cuda_timing`,
the CUDA paths of :mod:`perftracker_ml.collectors.comm`) must run there. This fake behaves as
the real runtime does, awkward parts included, and ``tests/unit/collectors/test_cuda_contract.py``
runs the same assertions against it and, on a GPU (``python -m benchmarks.gpu_check``),
against the real one, so the two cannot drift apart:

* work queued on a stream runs after the work before it, in wall time: the host call
  returns at once (``_sleep(cycles)`` queues a spin of ``cycles / CLOCK_HZ`` seconds);
* an event recorded on a stream completes when the work queued before it has run;
  ``query()`` of an event never recorded is True (cudaEventQuery's answer);
* ``elapsed_time`` needs both events created with ``enable_timing=True`` and recorded, else
  it raises ``ValueError`` (torch 2.11 on an H200), and completed, else ``RuntimeError``
  ("device not ready");
* ``stream.wait_event`` / ``wait_stream`` make later work on a stream wait, not the host;
* :class:`FakeNcclGroup`: a collective is enqueued on the group's own stream after the
  caller's current stream, ends once every member has arrived plus its transfer time, and
  its Work's future is **completed at enqueue** (ProcessGroupNCCL marks it so: callbacks
  run at once, with the current stream made to wait for the collective); ``wait()`` only
  makes the current stream wait. ``is_completed()`` here is the end event's answer; a real
  one-member NCCL group answered True at once even behind queued work (torch 2.11, NCCL
  2.28.9), so nothing of ours reads it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

CLOCK_HZ = 1.5e9  # the fake GPU's clock for _sleep(cycles)
INF = float("inf")


class FakeStream:
    def __init__(self, cuda: FakeCuda):
        self._cuda = cuda
        self.tail = 0.0  # when the work queued so far has run (the fake's clock, seconds)
        cuda.streams.append(self)

    def enqueue(self, seconds: float, not_before: float = 0.0) -> float:
        """Queue ``seconds`` of work that may not start before ``not_before``; returns its end."""
        start = max(self._cuda.now(), self.tail, not_before)
        self.tail = start + seconds
        return self.tail

    def wait_event(self, event: FakeEvent) -> None:
        if event.at is not None:
            self.tail = max(self.tail, event.at)

    def wait_stream(self, stream: FakeStream) -> None:
        self.tail = max(self.tail, stream.tail)

    def query(self) -> bool:
        return self._cuda.now() >= self.tail

    def synchronize(self) -> None:
        self._cuda.sleep_until(self.tail)

    def record_event(self, event: FakeEvent | None = None) -> FakeEvent:
        event = event or FakeEvent(self._cuda)
        event.record(self)
        return event


class FakeEvent:
    def __init__(self, cuda: FakeCuda | None = None, enable_timing: bool = False, **_: Any):
        self._cuda = cuda or DEFAULT
        self.enable_timing = enable_timing
        self.at: float | None = None  # when it completes; None: never recorded

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream or self._cuda.current_stream()
        self.at = max(self._cuda.now(), stream.tail)

    def query(self) -> bool:
        return self.at is None or self._cuda.now() >= self.at

    def synchronize(self) -> None:
        if self.at is not None:
            self._cuda.sleep_until(self.at)

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.enable_timing and end.enable_timing):  # torch 2.11 raises ValueError for these two
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self.at is None or end.at is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")
        return (end.at - self.at) * 1e3


class FakeCuda:
    """``torch.cuda`` as the collectors use it, on a fake device that runs in wall time."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.now = clock
        self.streams: list[FakeStream] = []  # every stream made (synchronize waits for all)
        self._default = FakeStream(self)
        self._current = self._default
        self._initialized = False

    # torch.cuda's module functions
    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self._initialized

    def init(self) -> None:
        self._initialized = True

    def Event(self, enable_timing: bool = False, **kw: Any) -> FakeEvent:  # noqa: N802 - torch's name
        return FakeEvent(self, enable_timing=enable_timing, **kw)

    def Stream(self, **_: Any) -> FakeStream:  # noqa: N802 - torch's name
        return FakeStream(self)

    def current_stream(self) -> FakeStream:
        return self._current

    @contextlib.contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        before, self._current = self._current, s
        try:
            yield
        finally:
            self._current = before

    def synchronize(self) -> None:
        """The whole device: every stream's queued work (a hung collective's raises)."""
        self.sleep_until(max(s.tail for s in self.streams))

    def _sleep(self, cycles: int) -> None:
        self._initialized = True
        self._current.enqueue(cycles / CLOCK_HZ)

    def sleep_until(self, at: float) -> None:
        delay = at - self.now()
        if delay == INF:
            raise RuntimeError("fake CUDA: waiting for work that never ends (a hung collective)")
        if delay > 0:
            time.sleep(delay)


DEFAULT = FakeCuda()


class FakeTorch:
    """The ``torch`` argument of the collectors' CUDA classes: only ``.cuda``."""

    def __init__(self, cuda: FakeCuda | None = None):
        self.cuda = cuda or FakeCuda()


class FakeCudaTensor:
    is_cuda = True

    def __init__(self, nbytes: int = 4096, cuda: FakeCuda | None = None):
        self.nbytes = nbytes
        self.cuda = cuda
        self.divided_by: float | None = None

    def div_(self, by: float) -> FakeCudaTensor:
        self.divided_by = by
        return self

    def is_complex(self) -> bool:
        return False


class FakeFuture:
    """A CUDA-aware torch Future completed at enqueue (NCCL's): callbacks run at once, on a
    stream of their own made to wait for the collective's end (``then``/``add_done_callback``)."""

    def __init__(self, value: Any, cuda: FakeCuda, end: FakeEvent):
        self._value = value
        self._cuda = cuda
        self._end = end

    def done(self) -> bool:
        return True

    def value(self) -> Any:
        return self._value

    def wait(self) -> Any:
        self._cuda.current_stream().wait_event(self._end)
        return self._value

    def _run(self, fn: Callable[[FakeFuture], Any]) -> Any:
        side = FakeStream(self._cuda)
        side.wait_event(self._end)
        with self._cuda.stream(side):
            return fn(self)

    def add_done_callback(self, fn: Callable[[FakeFuture], Any]) -> None:
        self._run(fn)

    def then(self, fn: Callable[[FakeFuture], Any]) -> FakeFuture:
        return FakeFuture(self._run(fn), self._cuda, self._end)


class FakeWork:
    def __init__(self, cuda: FakeCuda, end: FakeEvent, value: Any):
        self._cuda = cuda
        self.end = end
        self._future = FakeFuture(value, cuda, end)

    def get_future(self) -> FakeFuture:
        return self._future

    def is_completed(self) -> bool:
        return self.end.query()

    def wait(self, timeout: Any = None) -> bool:
        self._cuda.current_stream().wait_event(self.end)  # the stream waits, not the host
        return True


class FakeNcclGroup:
    """One member's view of an NCCL group whose peers arrive when ``peers_arrive`` says.

    ``peers_arrive(seq)`` -> the fake-clock time the last peer starts collective ``seq``
    (``INF``: never, a hang); ``transfer_s`` the collective's own time once all are in."""

    def __init__(self, cuda: FakeCuda, peers_arrive: Callable[[int], float] | None = None,
                 transfer_s: float = 0.001, group_name: str = "0", ranks: tuple[int, ...] = (0, 1)):
        self.cuda = cuda
        self.peers_arrive = peers_arrive or (lambda seq: 0.0)
        self.transfer_s = transfer_s
        self.group_name = group_name
        self.ranks = ranks
        self.stream = FakeStream(cuda)
        self.seq = 0

    def size(self) -> int:
        return len(self.ranks)

    def allreduce(self, tensors: list[Any], *_: Any, **__: Any) -> FakeWork:
        return self._collective(tensors)

    def _collective(self, value: Any) -> FakeWork:
        caller = self.cuda.current_stream()
        self.stream.wait_stream(caller)  # the collective starts after the caller's queued work
        arrive = max(self.cuda.now(), self.stream.tail)
        last = self.peers_arrive(self.seq)
        self.seq += 1
        self.stream.tail = max(arrive, last) + self.transfer_s
        end = FakeEvent(self.cuda)
        end.record(self.stream)
        return FakeWork(self.cuda, end, value)

    def all_reduce_fn(self) -> Callable[..., Any]:
        """``dist.all_reduce``'s signature on this group: returns the Work if async, else None
        (NCCL returns as soon as the collective is enqueued)."""
        def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
            work = self._collective([tensor])
            if async_op:
                return work
            work.wait()
            return None
        return all_reduce
