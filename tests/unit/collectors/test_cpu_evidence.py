"""The training thread's CPU evidence: /proc readers on a fake root, the stack sampler."""

from __future__ import annotations

import builtins
import subprocess
import sys
import textwrap
import threading
import time

from perftracker_ml.collectors.cpu_stats import CpuReader
from perftracker_ml.collectors.stack_sampler import (
    INNERMOST,
    MAX_DEPTH,
    WHERE,
    StackCounts,
    StackSampler,
    importing,
    is_library,
    read_frames,
    safe_text,
    thread_chain,
)

STAT = "1234 (python3 (x) y) S 1 2 3 4 5 6 7 8 {majflt} 9 {utime} {stime} 0 0 20 0 1 0\n"
STATUS = "Name:\tpython3\nvoluntary_ctxt_switches:\t{vol}\nnonvoluntary_ctxt_switches:\t{inv}\n"
HOST = "cpu  {user} 0 100 1000 0 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"


def fake_proc(root, *, run=0, wait=0, vol=0, inv=0, majflt=0, utime=0, load=1.5, user=100, steal=0,
              schedstat=True):
    task = root / "self" / "task" / "1234"
    task.mkdir(parents=True, exist_ok=True)
    if schedstat:
        (task / "schedstat").write_text(f"{run} {wait} 7\n")
    (task / "stat").write_text(STAT.format(majflt=majflt, utime=utime, stime=0))
    (task / "status").write_text(STATUS.format(vol=vol, inv=inv))
    (root / "loadavg").write_text(f"{load} 1.0 0.5 2/300 999\n")
    (root / "stat").write_text(HOST.format(user=user, steal=steal))
    return task


def test_deltas_from_schedstat_status_stat_and_host(tmp_path):
    fake_proc(tmp_path)
    reader = CpuReader(1234, tmp_path)
    assert reader.sample() is None  # the first reading is the baseline
    fake_proc(tmp_path, run=9_000_000, wait=2_000_000, vol=3, inv=40, majflt=2, load=4.0, user=1100, steal=100)
    s = reader.sample()
    assert (s.thread_cpu_ns, s.runqueue_wait_ns, s.voluntary_switches, s.involuntary_switches,
            s.major_faults, s.load1) == (9_000_000, 2_000_000, 3, 40, 2, 4.0)
    assert abs(s.steal_pct - 100 * 100 / 1100) < 0.01 and s.interval_ns > 0 and reader.errors == 0


def test_no_schedstat_falls_back_to_ticks_and_wait_is_unknown(tmp_path):
    fake_proc(tmp_path, schedstat=False)
    reader = CpuReader(1234, tmp_path)
    reader.sample()
    fake_proc(tmp_path, schedstat=False, utime=5)
    s = reader.sample()
    assert s.runqueue_wait_ns == -1 and s.thread_cpu_ns > 0 and reader.errors == 2  # counted, skipped


def test_missing_and_garbage_files_are_counted_never_raised(tmp_path):
    reader = CpuReader(1234, tmp_path)  # nothing exists: the thread exited, no /proc
    reader.sample()
    s = reader.sample()
    assert s.thread_cpu_ns == -1 and s.involuntary_switches == -1 and s.load1 == -1 and s.steal_pct == -1
    assert reader.errors >= 10
    task = fake_proc(tmp_path)
    (task / "schedstat").write_text("garbage")
    (task / "stat").write_text("no parenthesis at all")
    (task / "status").write_text("\xff\xfe nonsense")
    (tmp_path / "loadavg").write_text("")
    (tmp_path / "stat").write_text("intr 1 2 3\n")
    before = reader.errors
    s = reader.sample()
    assert reader.errors - before == 5 and s.runqueue_wait_ns == -1 and s.major_faults == -1


def test_unreadable_file_is_counted(tmp_path):
    task = fake_proc(tmp_path)
    (task / "status").unlink()
    (task / "status").mkdir()  # reading a directory raises OSError whatever the user's rights
    reader = CpuReader(1234, tmp_path)
    reader.sample()
    assert reader.errors == 1


def test_real_proc_of_this_thread():
    reader = CpuReader(threading.get_native_id())
    reader.sample()
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < 20_000_000:
        pass
    s = reader.sample()
    if s.thread_cpu_ns >= 0:  # Linux
        assert s.thread_cpu_ns >= 10_000_000 and s.interval_ns >= s.thread_cpu_ns * 0.5


def user_code_loop(stop):
    while not stop.is_set():
        sum(range(100))


def test_stack_counts_name_the_user_frame_and_the_innermost():
    counts = StackCounts()
    counts.add(*read_frames(sys._getframe(), {}))
    rows = counts.rows()
    where = [r for r in rows if r[2] == WHERE]
    inner = [r for r in rows if r[2] == INNERMOST]
    assert where and where[0][0].endswith("test_cpu_evidence.py test_stack_counts_name_the_user_frame_and_the_innermost")
    assert inner and counts.samples == 1


def test_library_frames_are_skipped_for_where():
    assert is_library(threading.__file__)
    assert is_library("/x/site-packages/torch/nn/modules/module.py")
    assert is_library("/x/perftracker_ml/collectors/comm.py") and is_library("<frozen importlib._bootstrap>")
    assert not is_library("/home/me/train.py")
    assert is_library("/x/site-packages/perftracker_ml/deploy/demo/train.py")
    demo = ("/perftracker_ml/deploy/demo/",)  # collector.user_code_paths: the demo stands in for a user
    assert not is_library("/x/site-packages/perftracker_ml/deploy/demo/train.py", user=demo)
    assert is_library("/x/site-packages/perftracker_ml/deploy/cli.py", user=demo)


def test_non_utf8_file_names_are_escaped_and_counted():
    text, escaped = safe_text("/data/\udcff.py step")
    assert escaped and text.encode("utf-8") and "\\udcff" in text
    counts = StackCounts()
    counts.counts[(("/data/\udcff.py", 3, "f"), WHERE)] = 2
    assert counts.rows()[0][1:4] == (3, WHERE, 2) and counts.skipped["non_utf8_name"] == 1


def test_sampler_thread_counts_a_busy_thread_and_a_vanished_one():
    stop = threading.Event()
    worker = threading.Thread(target=user_code_loop, args=(stop,))
    worker.start()
    sampler = StackSampler(worker.ident, hz=200)
    for _ in range(20):
        sampler.sample_once()
    stop.set()
    worker.join()
    sampler.sample_once()  # the thread has exited: counted, skipped
    counts = sampler.take()
    where = {r[0].rsplit(" ", 1)[1]: r[3] for r in counts.rows() if r[2] == WHERE}
    assert where.get("user_code_loop", 0) >= 15 and counts.skipped["thread_gone"] == 1
    assert sampler.take().samples == 0 and sampler.errors == 0


def test_a_thread_that_is_gone_has_no_stack():
    gone = threading.Thread(target=lambda: None)
    gone.start()
    gone.join()
    here = [code.co_name for code, _ in thread_chain(threading.get_ident())]
    assert thread_chain(gone.ident) == [] and "test_a_thread_that_is_gone_has_no_stack" in here


def test_no_stack_is_read_while_a_module_is_being_imported(tmp_path, monkeypatch):
    """A thread blocked inside a module's import: the sample is skipped and counted as
    ``importing``; once the import is done, samples are read again."""
    (tmp_path / "pt_slow_import.py").write_text("import builtins\nbuiltins._pt_import_gate.wait(10)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    gate = threading.Event()
    monkeypatch.setattr(builtins, "_pt_import_gate", gate, raising=False)
    loader = threading.Thread(target=__import__, args=("pt_slow_import",))
    loader.start()
    deadline = time.monotonic() + 10
    while not importing() and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler = StackSampler(threading.get_ident(), hz=100)
    sampler.sample_once()
    gate.set()
    loader.join()
    during = sampler.take()
    assert during.skipped["importing"] == 1 and during.samples == 0
    assert not importing()
    sampler.sample_once()
    assert sampler.take().samples == 1 and sampler.errors == 0
    sys.modules.pop("pt_slow_import", None)


SAMPLED_WHILE_SWITCHING = textwrap.dedent("""
    import gc, sys, threading, time
    sys.setswitchinterval(1e-6)  # the GIL changes hands at nearly every chance it has
    from perftracker_ml.collectors.stack_sampler import StackSampler

    def batches():
        while True:
            yield [object() for _ in range(50)]  # garbage for the collector, generator frames

    def step(it):
        return len(next(it))

    def train(seconds):
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            it = batches()  # a new generator every few steps: frames come and go
            for _ in range(5):
                n += step(it)
        return n

    sampler = StackSampler(threading.get_ident(), 2000.0)
    sampler.start()
    train(2.0)
    counts = sampler.take()
    print(counts.samples, sampler.errors)
""")


def test_sampling_a_thread_that_keeps_taking_the_gil_back_never_crashes_it():
    """2,000 samples a second of a thread whose generator frames come and go while the GIL
    changes hands at every chance: the process lives and every sample is read."""
    done = subprocess.run([sys.executable, "-c", SAMPLED_WHILE_SWITCHING], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    samples, errors = map(int, done.stdout.split())
    assert samples >= 50 and errors == 0


def test_the_user_frame_is_found_under_a_deep_library_stack_and_depth_is_bounded():
    """The innermost user frame under 30 frames of library code (a frozen import machinery
    name), and none when the user frame is deeper than MAX_DEPTH."""
    namespace: dict = {}
    exec(compile("def lib(n, leaf):\n    return lib(n - 1, leaf) if n else leaf()\n",
                 "<frozen importlib._bootstrap>", "exec"), namespace)
    seen = []
    innermost_line = [0]

    def leaf():
        innermost_line[0] = sys._getframe().f_lineno + 1
        seen.append(read_frames(sys._getframe(), {}))
        return 0

    def user_entry(n):
        return namespace["lib"](n, leaf)

    user_entry(30)
    innermost, where = seen[0]
    assert innermost[2] == "leaf" and innermost[1] == innermost_line[0]
    assert where is not None and where[2] == "leaf"  # leaf is user code (this test file)
    seen.clear()
    namespace["lib"](MAX_DEPTH + 5, lambda: seen.append(read_frames(sys._getframe(1), {})))
    assert seen[0][1] is None and seen[0][0][0] == "<frozen importlib._bootstrap>"


class FakeSender:
    def __init__(self):
        self.got, self.tasks, self.net = [], [], []

    def add_task(self, task):
        self.tasks.append(task)

    def add_cpu(self, record, rows):
        self.got.append((record, rows))

    def add_net(self, record):
        self.net.append(record)


def test_cpu_evidence_hands_one_sample_and_the_stack_rows_to_the_sender():
    from perftracker_ml.collectors.counters import CollectorCounters
    from perftracker_ml.collectors.cpu_evidence import CpuEvidence
    sender, counters = FakeSender(), CollectorCounters()
    ev = CpuEvidence(sender, counters, hz=0)  # sampler thread off: drive it by hand
    ev.stacks = StackSampler(threading.get_ident(), 25)
    ev.start()
    ev.stacks.close()
    for _ in range(3):
        ev.stacks.sample_once()
    sender.tasks[0]()
    ((record, rows),) = sender.got
    assert record["stack_samples"] == 3 and record["interval_ns"] > 0 and rows
    assert counters.stack_samples == 3
    ev.close()


def test_batch_with_cpu_sample_and_stacks_encodes_and_decodes():
    from perftracker_ml.collectors.batch import BatchBuilder
    from perftracker_ml.collectors.cpu_stats import CpuSample
    from perftracker_ml.collectors.identity import RankIdentity
    from perftracker_ml.schemas import Codec
    sample = CpuSample(10**9, 9 * 10**8, 10**6, 1, 2, 0, 1.0, -1.0).as_record()  # no stack fields
    builder = BatchBuilder(RankIdentity("job", 0, 0, 1, "h", -1, "", 1))
    record = builder.build([], 0, (), [sample], [("train.py step", 88, WHERE, 5, "x.clone()")])
    codec = Codec("EventBatch")
    decoded = codec.decode(codec.encode(record))
    assert decoded["cpu"][0]["stack_samples"] == 0 and decoded["cpu"][0]["involuntary_switches"] == 2
    frame = decoded["stacks"]["frame"][0]
    assert decoded["names"][frame] == "train.py step" and decoded["stacks"]["line"] == [88]
    assert decoded["names"][decoded["stacks"]["code"][0]] == "x.clone()"
