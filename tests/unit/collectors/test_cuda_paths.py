"""The collectors' GPU branches on the fake CUDA runtime (tests/fake_cuda.py), in CI.

Device time of collectives and phases, NCCL's future that completes at enqueue (the
collective stays an entry marker until its stop event completes), out-of-order
completion, the bounded queue, and no CUDA context for a job that never used CUDA.
The fake's semantics are checked against a real GPU by test_cuda_contract.py.
"""

from __future__ import annotations

import time

import pytest
from perftracker_ml.collectors.comm import OP_SPECS, CommTimer
from perftracker_ml.collectors.counters import CollectorCounters, DropReason
from perftracker_ml.collectors.cuda_timing import DEVICE_PREFIX, CudaCommTimer
from perftracker_ml.collectors.events import COMM, SPAN, GroupRef
from perftracker_ml.collectors.hooks_python import (
    ForwardTimer,
    OptimizerTimer,
    device_timed_callable,
)
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.schemas.vocabulary import SpanKind

from tests.fake_cuda import CLOCK_HZ, INF, FakeCuda, FakeCudaTensor, FakeNcclGroup, FakeTorch

SPIN_S = 0.05
G = GroupRef("pg0-2-x", (0, 1))


class Dist:
    """torch.distributed as the group registry asks it (two ranks, this one rank 0)."""

    class distributed_c10d:  # noqa: N801
        @staticmethod
        def _get_default_group():
            return "world"

    GradBucket = object

    @staticmethod
    def get_rank():
        return 0

    @staticmethod
    def get_process_group_ranks(group):
        return [0, 1]


def setup(peers_arrive=None, transfer_s=0.001):
    cuda = FakeCuda()
    cuda.init()
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    timer = CudaCommTimer(FakeTorch(cuda), rec)
    group = FakeNcclGroup(cuda, peers_arrive, transfer_s)
    return cuda, rec, timer, group


def spec(name):
    return next(s for s in OP_SPECS if s.name == name)


def comms(rec):
    return [e for e in rec.drain(1000) if e[0] == COMM]


def test_a_collective_is_timed_on_the_device_not_the_host():
    cuda, rec, timer, group = setup(peers_arrive=lambda seq: time.perf_counter() + SPIN_S)
    wrapped = CommTimer(Dist(), rec, timer).wrap(spec("all_reduce"), group.all_reduce_fn())
    host0 = time.perf_counter_ns()
    wrapped(FakeCudaTensor(4096))  # NCCL: returns once enqueued
    host_ns = time.perf_counter_ns() - host0
    assert timer.poll() == 0 and comms(rec) == []
    cuda.synchronize()
    assert timer.poll() == 1
    (event,) = comms(rec)
    assert event[1] == "all_reduce" and event[3] == 0 and event[4] == 4096
    assert event[7] >= 0.8 * SPIN_S * 1e9 > 5 * host_ns  # the wait for the late peer, on the device


def test_a_hung_collective_stays_entered_after_the_host_call_and_its_future_returned():
    """The NCCL trap: the host call returns and the Work's future completes at enqueue; the
    pending stop event is what still says the collective is running."""
    cuda, rec, timer, group = setup(peers_arrive=lambda seq: INF)
    comm = CommTimer(Dist(), rec, timer)
    sync = comm.wrap(spec("all_reduce"), group.all_reduce_fn())
    sync(FakeCudaTensor(64))
    work = sync(FakeCudaTensor(32), async_op=True)
    assert work.get_future().done() and not work.is_completed()
    assert rec.blocking is None and rec.in_flight == {}  # the host thinks both are done
    timer.poll()
    now = time.perf_counter_ns()
    assert rec.in_flight_markers(now, 10**12) == []  # too young
    markers = rec.in_flight_markers(now + 2 * 10**9, 10**9)
    assert [(m[1], m[3], m[7]) for m in markers] == [("all_reduce", 0, -1)]  # the oldest of its group
    assert comms(rec) == []


def test_async_collective_recorded_from_its_callbacks_stop_event():
    cuda, rec, timer, group = setup(peers_arrive=lambda seq: time.perf_counter() + SPIN_S)
    work = CommTimer(Dist(), rec, timer).wrap(spec("all_reduce"), group.all_reduce_fn())(
        FakeCudaTensor(8), async_op=True)
    assert rec.in_flight == {} and timer.pending == 1
    work.wait()
    cuda.synchronize()
    assert timer.poll() == 1
    (event,) = comms(rec)
    assert event[7] >= 0.8 * SPIN_S * 1e9


def test_ddp_bucket_all_reduce_on_the_device():
    cuda, rec, timer, group = setup(peers_arrive=lambda seq: time.perf_counter() + SPIN_S)
    hook = CommTimer(Dist(), rec, timer).ddp_allreduce_hook()

    class Bucket:
        def __init__(self):
            self.tensor = FakeCudaTensor(1024)

        def buffer(self):
            return self.tensor

    bucket = Bucket()
    fut = hook(group, bucket)
    assert fut.done() and bucket.tensor.divided_by == 2
    assert rec.in_flight == {} and rec.in_flight_markers(time.perf_counter_ns() + 2 * 10**9, 10**9)
    cuda.synchronize()
    assert timer.poll() == 1
    (event,) = comms(rec)
    assert event[1] == "all_reduce" and event[4] == 1024 and event[7] >= 0.8 * SPIN_S * 1e9


def test_pairs_completing_out_of_order_are_emitted_and_the_rest_kept():
    cuda, rec, timer, _ = setup()
    side = cuda.Stream()
    start = timer.begin(FakeCudaTensor())
    cuda._sleep(int(10 * CLOCK_HZ))  # a long spin on the default stream
    timer.end(start, ("all_reduce", G, 0, 4, 0, 0))
    with cuda.stream(side):
        start = timer.begin([FakeCudaTensor()])
        timer.end(start, ("broadcast", GroupRef("pg1-2-y", (0, 1)), 0, 4, 0, 0))
    assert timer.poll() == 1 and timer.pending == 1
    (event,) = comms(rec)
    assert event[1] == "broadcast"


def test_cpu_tensors_get_no_events_and_a_full_queue_counts_its_drops(monkeypatch):
    cuda, rec, timer, _ = setup()

    class Cpu:
        is_cuda = False

    assert timer.begin(Cpu()) is None and timer.begin([Cpu()]) is None and timer.begin([]) is None
    monkeypatch.setattr("perftracker_ml.collectors.cuda_timing.MAX_PENDING", 2)
    cuda._sleep(int(10 * CLOCK_HZ))
    for seq in range(3):
        timer.end(timer.begin(FakeCudaTensor()), ("all_reduce", G, seq, 4, 0, 0))
    assert timer.pending == 2 and rec.counters.events_dropped == 1
    assert rec.counters.series(CollectorCounters.events_dropped)[(DropReason.CUDA_QUEUE_FULL.value,)] == 1


def test_phases_get_device_spans_once_cuda_is_in_use():
    cuda = FakeCuda()
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    timer = CudaCommTimer(FakeTorch(cuda), rec)
    assert timer.begin_phase() is None  # no CUDA context from us in a job that never used CUDA
    cuda.init()
    rec.step = 7
    ev = timer.begin_phase()
    cuda._sleep(int(SPIN_S * CLOCK_HZ))
    timer.end_phase(ev, "Net.forward", 7, 123)
    cuda.synchronize()
    assert timer.poll() == 1
    (span,) = rec.drain(10)
    assert span[:5] == (SPAN, SpanKind.DEVICE, DEVICE_PREFIX + "Net.forward", 7, 123)
    assert span[5] >= 0.8 * SPIN_S * 1e9


def test_forward_backward_and_optimizer_hooks_time_the_device_too():
    torch = pytest.importorskip("torch")
    cuda = FakeCuda()
    cuda.init()
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    timer = CudaCommTimer(FakeTorch(cuda), rec)
    fwd = ForwardTimer(rec, timer)
    opt = OptimizerTimer(rec, timer)
    model = torch.nn.Linear(2, 2)
    handles = [model.register_forward_pre_hook(fwd._pre), model.register_forward_hook(fwd._post)]

    def backward(loss):
        cuda._sleep(int(0.01 * CLOCK_HZ))
        loss.backward()

    try:
        model(torch.ones(1, 2)).sum()
        device_timed_callable(backward, "torch.autograd.backward", SpanKind.BACKWARD, rec, timer)(
            model(torch.ones(1, 2)).sum())
        opt._pre(None, (), {})
        opt._post(torch.optim.SGD(model.parameters()), (), {})
    finally:
        for h in handles:
            h.remove()
    cuda.synchronize()
    timer.poll()
    device = [e[2] for e in rec.drain(100) if e[0] == SPAN and e[1] == SpanKind.DEVICE]
    assert device.count("cuda:torch.nn.modules.linear.Linear.forward") == 2
    assert "cuda:torch.autograd.backward" in device and "cuda:torch.optim.sgd.SGD.step" in device
    assert rec.errors.count == 0


def test_a_failing_cuda_runtime_never_reaches_training():
    rec = Recorder(100, IterationDetector(), ErrorBudget())

    class Broken:
        def is_initialized(self):
            return True

        def Event(self, **_):  # noqa: N802
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    timer = CudaCommTimer(type("T", (), {"cuda": Broken()})(), rec)
    fn = device_timed_callable(lambda x: x + 1, "f", SpanKind.BACKWARD, rec, timer)
    assert fn(1) == 2 and rec.errors.count == 1


def test_a_collective_without_a_tensor_and_a_failing_event_are_timed_on_the_host():
    cuda, rec, timer, group = setup()
    comm = CommTimer(Dist(), rec, timer)

    def barrier(group=None, async_op=False, device_ids=None):
        return None

    comm.wrap(spec("barrier"), barrier)()
    assert timer.pending == 0 and [e[1] for e in comms(rec)] == ["barrier"]  # no tensor: host time

    def broken_begin(tensor):
        raise RuntimeError("CUDA error: out of memory")

    timer.begin = broken_begin
    comm.wrap(spec("all_reduce"), group.all_reduce_fn())(FakeCudaTensor(8))
    assert rec.errors.count == 1 and [e[1] for e in comms(rec)] == ["all_reduce"]  # still recorded, on the host


def test_an_async_work_without_a_future_is_recorded_at_once():
    cuda, rec, timer, group = setup()

    class NoFuture:
        def get_future(self):
            raise RuntimeError("this backend has no future")

    def all_reduce(tensor, op=None, group=None, async_op=False):
        return NoFuture()

    CommTimer(Dist(), rec, timer).wrap(spec("all_reduce"), all_reduce)(FakeCudaTensor(8), async_op=True)
    cuda.synchronize()
    timer.poll()
    assert [e[1] for e in comms(rec)] == ["all_reduce"] and rec.in_flight == {}


def test_availability_never_raises_and_an_empty_queue_polls_nothing():
    class NoDriver:
        def is_available(self):
            raise RuntimeError("Found no NVIDIA driver on your system")

    assert CudaCommTimer.available(FakeTorch()) is True
    assert CudaCommTimer.available(type("T", (), {"cuda": NoDriver()})()) is False
    _, _, timer, _ = setup()
    assert timer.poll() == 0 and timer.entered(time.perf_counter_ns(), 0) == []
