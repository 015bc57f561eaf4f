"""The CUDA semantics the collectors rely on, checked on the fake (CI) and on a real GPU.

The same assertions run against :mod:`tests.fake_cuda` everywhere and against
``torch.cuda`` and a real NCCL group where a GPU exists (``python -m benchmarks.gpu_check``
runs this file there), so the fake the CI tests use cannot drift from the runtime.
"""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.gpu_check import spin_clock_hz
from tests.fake_cuda import CLOCK_HZ, FakeCuda, FakeCudaTensor, FakeNcclGroup

torch = pytest.importorskip("torch")
HAS_GPU = torch.cuda.is_available()
SPIN_MS = 60.0  # device work the host never waits for: long enough to be seen pending


class Runtime:
    """What a contract test needs of a CUDA runtime: the module, a tensor, a spin, an NCCL group."""

    def __init__(self, name: str):
        self.name = name
        if name == "fake":
            self.cuda = FakeCuda()
            self.cuda.init()
            self.hz = CLOCK_HZ
        else:
            self.cuda = torch.cuda
            self.hz = spin_clock_hz(torch.cuda, 20_000_000)
        self._group = None

    def tensor(self, n: int = 1024):
        if self.name == "fake":
            return FakeCudaTensor(4 * n)
        return torch.ones(n, device="cuda")

    def spin(self, ms: float) -> None:
        self.cuda._sleep(int(ms * 1e-3 * self.hz))

    def nccl(self):
        """A one-member NCCL group (real) or the fake with no late peers."""
        if self.name == "fake":
            return FakeNcclGroup(self.cuda, ranks=(0,))
        import torch.distributed as dist
        from perftracker_ml.deploy.tansu import free_port

        if not dist.is_initialized():
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
            self._group = dist
            warm = torch.ones(1, device="cuda")
            dist.all_reduce(warm)  # the communicator's first use blocks the host while it sets up
            torch.cuda.synchronize()
        return dist.distributed_c10d._get_default_group()

    def close(self) -> None:
        self.cuda.synchronize()
        if self._group is not None:
            self._group.destroy_process_group()


@pytest.fixture(params=["fake", pytest.param("real", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")])])
def rt(request):
    runtime = Runtime(request.param)
    yield runtime
    runtime.close()


def test_an_event_never_recorded_queries_complete(rt):
    ev = rt.cuda.Event(enable_timing=True)
    assert ev.query() is True  # cudaEventQuery on an unrecorded event: success
    other = rt.cuda.Event(enable_timing=True)
    other.record()
    other.synchronize()
    with pytest.raises(ValueError):  # torch 2.11 checks this before asking the runtime
        ev.elapsed_time(other)


def test_elapsed_time_needs_timing_enabled(rt):
    a, b = rt.cuda.Event(), rt.cuda.Event()
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises(ValueError):
        a.elapsed_time(b)


def test_queued_work_keeps_a_later_event_pending_and_elapsed_time_refuses_it(rt):
    start, stop = rt.cuda.Event(enable_timing=True), rt.cuda.Event(enable_timing=True)
    host0 = time.perf_counter()
    start.record()
    rt.spin(SPIN_MS)
    stop.record()
    host_s = time.perf_counter() - host0
    assert stop.query() is False, "the host must not wait for queued work"
    with pytest.raises(RuntimeError):
        start.elapsed_time(stop)
    stop.synchronize()
    assert stop.query() is True
    device_ms = start.elapsed_time(stop)
    assert 0.7 * SPIN_MS <= device_ms <= 3 * SPIN_MS
    assert host_s * 1e3 < device_ms / 2


def test_a_side_stream_runs_beside_the_queued_work_unless_it_waits(rt):
    side = rt.cuda.Stream()
    rt.spin(SPIN_MS)
    free, waiting = rt.cuda.Event(), rt.cuda.Event()
    with rt.cuda.stream(side):
        free.record()
    marker = rt.cuda.Event()
    marker.record()
    side.wait_event(marker)
    with rt.cuda.stream(side):
        waiting.record()
    free.synchronize()
    assert free.query() and not waiting.query()
    waiting.synchronize()
    assert waiting.query()


def test_an_nccl_collectives_future_completes_at_enqueue_while_it_is_still_pending(rt):
    group = rt.nccl()
    rt.spin(SPIN_MS)  # queued before the collective: its start on the device comes after
    work = group.allreduce([rt.tensor()])
    fut = work.get_future()
    assert fut.done(), "NCCL marks the future completed as soon as the collective is enqueued"
    assert not work.is_completed(), "the collective itself is still queued behind the spin"
    seen = []

    def callback(f):  # runs now, on a stream made to wait for the collective's end
        ev = rt.cuda.Event()
        ev.record()
        seen.append(ev)
        return f.value()

    fut.then(callback)
    assert len(seen) == 1 and not seen[0].query(), "the callback ran at enqueue, its stream waiting"
    work.wait()  # NCCL's wait makes the current stream wait, not the host
    after = rt.cuda.Event()
    after.record()
    assert not after.query(), "the host did not wait: the current stream still runs the spin"
    rt.cuda.synchronize()
    assert work.is_completed() and seen[0].query() and after.query()
