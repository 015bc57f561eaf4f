"""GPU paths: CUDA-event collective timing and NVML sampling. Skipped without a GPU."""

import pytest
from perftracker.collectors.hardware import open_nvml, sample
from perftracker.collectors.iteration import IterationDetector
from perftracker.collectors.recorder import Recorder
from perftracker.collectors.safety import ErrorBudget

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
    from perftracker.collectors.cuda_timing import CudaCommTimer
    from perftracker.collectors.events import GroupRef

    rec = Recorder(100, IterationDetector(), ErrorBudget())
    timer = CudaCommTimer(torch, rec)
    x = torch.randn(4096, 4096, device="cuda")
    ev = timer.begin(x)
    y = x @ x
    timer.end(ev, ("all_reduce", GroupRef("g", (0,)), 0, x.nbytes, 0, 0))
    torch.cuda.synchronize()  # the test (not the collector) waits, then polls
    assert timer.poll() == 1
    event = rec.events[0]
    assert event[1] == "all_reduce" and event[7] > 0
    del y


@pytest.mark.gpu
@needs_gpu
def test_profiling_window_summarizes_cuda_kernels():
    from perftracker.collectors.events import OpKind
    from perftracker.collectors.profiling import ProfileRequest, ProfileWindows

    emitted = []
    windows = ProfileWindows(torch, emitted.append, ErrorBudget(), every_s=0, duration_s=0)
    windows.request(ProfileRequest("r", 1, 0.0))
    windows.on_step(1)
    x = torch.randn(1024, 1024, device="cuda")
    (x @ x).sum().item()
    windows.on_step(2)
    windows.summarize_finished()
    assert any(op.kind is OpKind.CUDA_KERNEL for op in emitted[0])
