"""The collector's own CPU accounting (threads named perftracker-* and librdkafka's rdk:*)."""

import threading
import time
from pathlib import Path

import pytest
from perftracker_ml.collectors.collector import _background
from perftracker_ml.collectors.selfcost import background_cpu_by_thread, thread_cpu_s


def background_cpu_s(tasks: Path | None = None) -> float:
    """The total the collector reports (-1 without /proc)."""
    by_thread = background_cpu_by_thread() if tasks is None else background_cpu_by_thread(tasks)
    return _background(by_thread)["background_cpu_s"]


def _stat(name: str, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"42 ({name}) S 1 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0\n"


def test_stat_line_with_spaces_and_parentheses_in_the_name():
    assert abs(thread_cpu_s(_stat("rdk:broker (x) 1", 150, 50)) - 2.0) < 1e-9


def test_only_librdkafka_and_perftracker_threads_count(tmp_path: Path):
    for tid, name, ut in ((11, "python", 500), (12, "rdk:main", 100), (13, "rdk:broker1", 30)):
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "comm").write_text(name + "\n")
        (tmp_path / str(tid) / "stat").write_text(_stat(name, ut, 0))
    assert abs(background_cpu_s(tmp_path) - 1.3) < 1e-9
    assert background_cpu_by_thread(tmp_path) == pytest.approx({"librdkafka": 1.3})
    assert background_cpu_s(tmp_path / "missing") == -1.0
    assert background_cpu_by_thread(tmp_path / "missing") is None


def test_a_busy_perftracker_thread_is_seen_in_proc():
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc: background_cpu_s answers -1 (covered above)")
    before = background_cpu_s()
    done = threading.Event()

    def spin() -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        done.wait(5)

    worker = threading.Thread(target=spin, name="perftracker-spin")
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while background_cpu_s() - before < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert background_cpu_s() - before >= 0.25
        assert (background_cpu_by_thread() or {}).get("perftracker-spin", 0.0) >= 0.25
    finally:
        done.set()
        worker.join()
