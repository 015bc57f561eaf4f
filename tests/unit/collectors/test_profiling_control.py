import datetime as dt
import threading
import time

import pytest
from perftracker_ml.collectors.control import ControlFollower
from perftracker_ml.collectors.profiling import ProfileRequest, ProfileWindows, classify
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.schemas.vocabulary import OpKind


class SlowProfiler:
    """A finished window whose trace takes long to turn into summaries: until ``release`` is set."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def events(self):
        self.release.wait(30)
        return []


def test_classify():
    assert classify("aten::mm", False) is OpKind.CPU_OP
    assert classify("Memcpy HtoD (Pageable -> Device)", True) is OpKind.MEMCPY
    assert classify("ncclDevKernel_AllReduce", True) is OpKind.COMM_KERNEL
    assert classify("sm90_gemm", True) is OpKind.CUDA_KERNEL


def test_window_starts_on_the_requested_step_and_summarizes_cpu_ops():
    torch = pytest.importorskip("torch")
    emitted = []
    changes = []
    windows = ProfileWindows(torch, emitted.append, ErrorBudget(), every_s=0, duration_s=0.0,
                             on_change=changes.append)
    windows.request(ProfileRequest("req-1", start_step=5, duration_s=0.0))
    windows.on_step(4)
    assert changes == []
    windows.on_step(5)
    assert changes == [True]
    a = torch.randn(64, 64)
    for _ in range(3):
        a = a @ a
    windows.on_step(6)
    assert changes == [True, False]
    windows.summarize_finished()  # hands the window to the summary thread
    assert windows.wait_summarized(30)
    ops = emitted[0]
    mm = [o for o in ops if o.name == "aten::mm"]
    assert mm and mm[0].count == 3 and mm[0].profile_id == "req-1" and mm[0].kind is OpKind.CPU_OP
    assert mm[0].p50_ns <= mm[0].p99_ns <= mm[0].max_ns <= mm[0].total_ns


def test_a_window_running_at_exit_is_summarized_within_the_budget():
    torch = pytest.importorskip("torch")
    emitted, dropped = [], []
    windows = ProfileWindows(torch, emitted.append, ErrorBudget(), every_s=0, duration_s=0.0,
                             on_dropped=dropped.append, exit_budget_s=30.0)
    windows.request(ProfileRequest("req-1", start_step=1, duration_s=3600.0))
    windows.on_step(1)
    a = torch.randn(8, 8)
    a = a @ a
    windows.close()
    windows.summarize_finished()
    assert [o.profile_id for o in emitted[0]][:1] == ["req-1"] and dropped == [] and windows._active is None


def test_a_window_not_summarized_within_the_exit_budget_is_dropped_and_counted():
    torch = pytest.importorskip("torch")
    emitted, dropped = [], []
    release = threading.Event()
    windows = ProfileWindows(torch, emitted.append, ErrorBudget(), every_s=0, duration_s=0.0,
                             on_dropped=dropped.append, exit_budget_s=0.05)
    windows._finished.extend([("a", SlowProfiler(release)), ("b", SlowProfiler(release))])
    windows.close()
    windows.summarize_finished()
    assert dropped == [2]
    release.set()
    time.sleep(0.2)
    assert emitted == []  # given up: nothing emitted after the budget ran out


def test_control_messages_filtered_by_job_age_and_id():
    requests = []

    class Windows:
        def request(self, req):
            requests.append(req)

        def request_stop(self):
            requests.append("stop")

    follower = ControlFollower({}, "pt.control", "j1", Windows(), ErrorBudget())
    now = dt.datetime.now(dt.timezone.utc)
    msg = {"job": "j1", "request_id": "r1", "command": "PROFILE", "start_step": 100,
           "duration_s": 5.0, "reason": "regression", "issued_ms": now}
    follower.handle(msg)
    follower.handle(msg)  # duplicate
    follower.handle({**msg, "request_id": "r2", "job": "other"})
    follower.handle({**msg, "request_id": "r3", "issued_ms": now - dt.timedelta(hours=1)})
    follower.handle({**msg, "request_id": "r4", "command": "STOP_PROFILE"})
    assert requests == [ProfileRequest("r1", 100, 5.0), "stop"]


def test_duty_cycle_window_is_aligned_on_wall_clock():
    torch = pytest.importorskip("torch")
    windows = ProfileWindows(torch, lambda ops: None, ErrorBudget(), every_s=3600, duration_s=1)
    assert windows._next_duty % 3600 == 0 and windows._next_duty > time.time()


def test_the_sender_task_never_waits_for_a_summary():
    """Summarizing a long window takes up to a minute; the sender's task returns at once and
    the summary arrives later from the summary thread (the sender's batches keep going out)."""
    torch = pytest.importorskip("torch")
    emitted = []
    release = threading.Event()
    windows = ProfileWindows(torch, emitted.append, ErrorBudget(), every_s=0, duration_s=0.0)
    windows._finished.append(("slow", SlowProfiler(release)))
    task = threading.Thread(target=windows.summarize_finished)
    task.start()
    task.join(30)  # a guard against a hang, not a timing bound
    assert not task.is_alive(), "the sender's task waited for the summary"
    assert emitted == []  # still being summarized
    release.set()
    assert windows.wait_summarized(30) and emitted == [[]]


def test_a_summary_still_running_at_exit_is_dropped_and_counted():
    torch = pytest.importorskip("torch")
    emitted, dropped = [], []
    release = threading.Event()
    windows = ProfileWindows(torch, emitted.append, ErrorBudget(), every_s=0, duration_s=0.0,
                             on_dropped=dropped.append, exit_budget_s=0.05)
    windows._finished.append(("slow", SlowProfiler(release)))
    windows.summarize_finished()  # the summary thread takes it ...
    windows.close()
    windows.summarize_finished()  # ... and is still at it when the process exits
    assert dropped == [1]
    release.set()
    windows.wait_summarized(30)
    assert emitted == []  # given up: nothing emitted after the budget ran out


def test_a_window_ends_after_max_steps_however_long_it_was_asked_to_run():
    """Stopping torch.profiler costs the training thread ~30 us per op recorded: a requested
    20 s window of a fast job stalled it ~50 s; a window is bounded by iterations too."""
    torch = pytest.importorskip("torch")
    changes = []
    windows = ProfileWindows(torch, lambda ops: None, ErrorBudget(), every_s=0, duration_s=0.0,
                             on_change=changes.append, max_steps=3)
    windows.request(ProfileRequest("req-1", start_step=1, duration_s=3600.0))
    windows.on_step(1)
    assert changes == [True]
    windows.on_step(2)
    windows.on_step(3)
    assert changes == [True]  # two iterations in
    windows.on_step(4)
    assert changes == [True, False] and windows._active is None and len(windows._finished) == 1
