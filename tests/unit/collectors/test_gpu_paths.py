"""GPU paths: CUDA-event collective timing and NVML sampling. Skipped without a GPU."""

import os
import time

import pytest
from perftracker_ml.collectors.hardware import open_nvml, sample
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget

torch = pytest.importorskip("torch")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_nvml_switches_itself_off_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert open_nvml(0) is None


@pytest.mark.gpu
@needs_gpu
def test_nvml_sample_reads_clocks_and_power():
    nvml = open_nvml(0)
    assert nvml is not None
    nv, handle, _index, uuid = nvml
    row = sample(nv, handle)
    assert uuid and row["sm_clock_max_mhz"] > 0 and row["power_limit_w"] > 0


@pytest.mark.gpu
@needs_gpu
def test_cuda_events_time_device_work_without_synchronizing():
    from perftracker_ml.collectors.cuda_timing import CudaCommTimer
    from perftracker_ml.collectors.events import GroupRef

    rec = Recorder(100, IterationDetector(), ErrorBudget())
    timer = CudaCommTimer(torch, rec)
    x = torch.randn(16, device="cuda")
    torch.cuda._sleep(1000)  # load the kernel before anything is timed
    ref_start, ref_stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    host0 = time.perf_counter_ns()
    ev = timer.begin(x)
    ref_start.record()
    torch.cuda._sleep(50_000_000)  # tens of ms of device work that the host does not wait for
    ref_stop.record()
    timer.end(ev, ("all_reduce", GroupRef("g", (0,)), 0, x.nbytes, 0, 0))
    host_ns = time.perf_counter_ns() - host0
    assert timer.poll() == 0, "the device work cannot have finished yet"
    torch.cuda.synchronize()  # the test (not the collector) waits, then polls
    assert timer.poll() == 1
    event = rec.events[0]
    device_ns = ref_start.elapsed_time(ref_stop) * 1e6
    assert event[1] == "all_reduce" and device_ns > 10 * host_ns
    assert device_ns <= event[7] < device_ns + 5e6  # the device's time, not the host's


def _world_of_one(backend: str) -> None:
    import torch.distributed as dist
    from perftracker_ml.deploy.tansu import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group(backend, rank=0, world_size=1, device_id=torch.device("cuda", 0)
                            if backend == "nccl" else None)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_ddp_hook_and_async_ops_on_cuda_are_timed_by_cuda_events(backend):
    import torch.distributed as dist
    from perftracker_ml.collectors.comm import OP_SPECS, CommTimer
    from perftracker_ml.collectors.cuda_timing import CudaCommTimer
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    _world_of_one(backend)
    try:
        rec = Recorder(1000, IterationDetector(), ErrorBudget())
        cuda = CudaCommTimer(torch, rec)
        timer = CommTimer(dist, rec, cuda)
        torch.manual_seed(0)
        builtin = DDP(nn.Linear(256, 256).cuda())
        torch.manual_seed(0)
        hooked = DDP(nn.Linear(256, 256).cuda())
        hooked.register_comm_hook(hooked.process_group, timer.ddp_allreduce_hook())
        x = torch.randn(64, 256, device="cuda")
        builtin(x).square().sum().backward()
        if backend == "nccl":  # gloo copies CUDA tensors to the host itself
            torch.cuda.set_sync_debug_mode("error")  # a synchronizing call of ours would raise
        hooked(x).square().sum().backward()
        spec = next(s for s in OP_SPECS if s.name == "all_reduce")
        work = timer.wrap(spec, dist.all_reduce)(torch.ones(1024, device="cuda"), async_op=True)
        work.wait()
        timer.wrap(spec, dist.all_reduce)(torch.ones(1024, device="cuda"))
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        assert cuda.poll() == 3 and rec.errors.count == 0
        for a, b in zip(builtin.parameters(), hooked.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad)
        events = rec.drain(100)
        assert [(e[1], e[3]) for e in events] == [("all_reduce", i) for i in range(3)]
        assert events[1][4] == events[2][4] == 4096 and all(e[7] > 0 for e in events)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        dist.destroy_process_group()


@pytest.mark.gpu
@needs_gpu
def test_profiling_window_summarizes_cuda_kernels():
    from perftracker_ml.collectors.profiling import ProfileRequest, ProfileWindows
    from perftracker_ml.schemas.vocabulary import OpKind

    emitted = []
    windows = ProfileWindows(torch, emitted.append, ErrorBudget(), every_s=0, duration_s=0)
    windows.request(ProfileRequest("r", 1, 0.0))
    windows.on_step(1)
    x = torch.randn(1024, 1024, device="cuda")
    (x @ x).sum().item()
    windows.on_step(2)
    windows.summarize_finished()  # hands the window to the summary thread
    assert windows.wait_summarized(120.0)
    assert any(op.kind is OpKind.CUDA_KERNEL for op in emitted[0])


@pytest.mark.gpu
@needs_gpu
def test_functional_collectives_on_nccl_eager_and_compiled():
    """DTensor's and compiled graphs' collectives on CUDA tensors (NCCL): recorded at their
    wait, the compiled ones too, no synchronizing call of ours."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from perftracker_ml.collectors.cuda_timing import CudaCommTimer
    from perftracker_ml.collectors.functional import FunctionalTimer
    from perftracker_ml.collectors.groups import GroupRegistry

    _world_of_one("nccl")
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    cuda = CudaCommTimer(torch, rec)
    timer = FunctionalTimer(torch, rec, GroupRegistry(dist), cuda)
    timer.install()
    try:
        x = torch.ones(1024, device="cuda")
        torch.cuda.set_sync_debug_mode("error")
        funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))
        torch.cuda.set_sync_debug_mode("default")
        compiled = torch.compile(lambda t: funcol.all_reduce(t * 2, "sum", dist.group.WORLD) + 1)
        compiled(x)
        torch.cuda.synchronize()
        assert cuda.poll() == 2  # the eager collective's and the first compiled call's
        rec.drain(1000)
        assert torch.equal(compiled(x), torch.full((1024,), 3.0, device="cuda"))
        torch.cuda.synchronize()
        assert cuda.poll() == 1 and rec.errors.count == 0
        events = [e for e in rec.drain(1000) if e[0] == 1]
        assert [e[1] for e in events] == ["all_reduce"] and events[0][7] > 0
    finally:
        torch.cuda.set_sync_debug_mode("default")
        timer.remove()
        dist.destroy_process_group()


@pytest.mark.gpu
@needs_gpu
def test_nccl_collective_queued_behind_a_spin_is_pending_then_completed():
    """NCCL returns at enqueue and completes the Work's future then: the collective queued
    behind device work is an entry marker (dur -1) until its stop event completes, then
    one event with its device time; no synchronizing call of ours."""
    import torch.distributed as dist
    from perftracker_ml.collectors.comm import OP_SPECS, CommTimer
    from perftracker_ml.collectors.cuda_timing import CudaCommTimer

    _world_of_one("nccl")
    try:
        rec = Recorder(1000, IterationDetector(), ErrorBudget())
        cuda = CudaCommTimer(torch, rec)
        timer = CommTimer(dist, rec, cuda)
        spec = next(s for s in OP_SPECS if s.name == "all_reduce")
        x = torch.ones(1024, device="cuda")
        dist.all_reduce(x)  # NCCL's communicator is made on the first collective
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        torch.cuda._sleep(2_000_000_000)  # about a second of device work queued first
        host0 = time.perf_counter_ns()
        work = timer.wrap(spec, dist.all_reduce)(x, async_op=True)
        timer.wrap(spec, dist.all_reduce)(x)
        host_ns = time.perf_counter_ns() - host0
        torch.cuda.set_sync_debug_mode("default")
        assert work.get_future().done() and not work.is_completed()
        assert rec.blocking is None and rec.in_flight == {}
        assert cuda.poll() == 0
        markers = rec.in_flight_markers(time.perf_counter_ns() + 10**10, 10**9)
        assert [(m[1], m[3], m[7]) for m in markers] == [("all_reduce", 0, -1)]
        torch.cuda.synchronize()
        assert cuda.poll() == 2 and rec.in_flight_markers(time.perf_counter_ns() + 10**10, 10**9) == []
        events = rec.drain(100)
        assert [(e[1], e[3]) for e in events] == [("all_reduce", 0), ("all_reduce", 1)]
        # the spin was queued before the start event: the time inside the collective is the
        # collective's alone, the rank's own lateness is not in it (its peers' waits show it)
        assert 0 < events[0][7] < 0.1e9 and host_ns < 0.1e9
        assert rec.errors.count == 0
    finally:
        torch.cuda.set_sync_debug_mode("default")
        dist.destroy_process_group()
