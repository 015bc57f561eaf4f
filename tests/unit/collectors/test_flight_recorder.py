"""torch's Flight Recorder read on a suspected hang: a real two-process gloo job whose rank 0
issues a collective rank 1 never joins, and the rules around the read (when, how often)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from perftracker_ml.collectors.events import COMM, GroupRef
from perftracker_ml.collectors.flight_recorder import (
    FlightRecorder,
    buffer_enabled,
    pending_entries,
)
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.deploy.tansu import free_port

HANG = textwrap.dedent("""
    import os, sys, time
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"
    import torch, torch.distributed as dist
    from perftracker_ml.collectors.events import COMM, GroupRef
    from perftracker_ml.collectors.flight_recorder import FlightRecorder
    from perftracker_ml.collectors.safety import ErrorBudget
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x = torch.ones(4)
    dist.all_reduce(x)                      # completed on both ranks
    from perftracker_ml.collectors.flight_recorder import pending_entries
    dump = torch._C._distributed_c10d._dump_fr_trace_json
    deadline = time.monotonic() + 60        # gloo marks the entry completed on its own thread,
    while pending_entries(dump(True, True), time.time_ns()) and time.monotonic() < deadline:
        time.sleep(0.05)                    # after the caller's wait returns: let it catch up
    if rank == 1:
        time.sleep(6)                       # never joins the second one
        os._exit(0)
    work = dist.all_reduce(x, async_op=True)  # pending: rank 1 is not coming
    reader = FlightRecorder.from_torch(ErrorBudget(), os.environ)
    assert reader is not None
    issued = time.perf_counter_ns() - 11 * 10**9  # an entry marker older than after_s
    marker = (COMM, "all_reduce", GroupRef("pg0-2-x", (0, 1)), 1, 16, 1, issued, -1)
    print("ENTRIES", __import__("json").dumps(reader.read([marker], time.perf_counter_ns())), flush=True)
    os._exit(0)
""")


def test_a_real_gloo_hang_is_read_from_the_flight_recorder(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    peer = subprocess.Popen([sys.executable, str(script), "1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        out = subprocess.run([sys.executable, str(script), "0"], env=env, capture_output=True, text=True,
                             timeout=120)
    finally:
        peer.kill()
        peer.wait()
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("ENTRIES"))
    (entry,) = json.loads(line.split(" ", 1)[1])
    assert entry["op"] == "gloo:all_reduce" and entry["seq"] == 2 and entry["pg_desc"] == "default_pg"
    assert entry["state"] == "scheduled" and entry["last_completed_seq"] == 1 and entry["last_enqueued_seq"] == 2
    assert 0 <= entry["age_ms"] < 60_000 and entry["timeout_ms"] > 0


def test_off_unless_the_buffer_is_on():
    assert not buffer_enabled({}) and not buffer_enabled({"TORCH_FR_BUFFER_SIZE": "0"})
    assert buffer_enabled({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    assert not buffer_enabled({"TORCH_FR_BUFFER_SIZE": "lots"})
    assert FlightRecorder.from_torch(ErrorBudget(), {}) is None


DUMP = json.dumps({"entries": [
    {"collective_seq_id": 7, "process_group": ["3", "mesh_tp"], "pg_id": 3, "profiling_name": "nccl:all_gather",
     "state": "started", "retired": False, "time_created_ns": 1_000_000_000, "timeout_ms": 600000},
    {"collective_seq_id": 6, "process_group": ["3", "mesh_tp"], "pg_id": 3, "profiling_name": "nccl:all_gather",
     "state": "completed", "retired": True, "time_created_ns": 900_000_000}],
    "pg_status": {"3": {"last_completed_collective": "6", "last_enqueued_collective": "7"}}})


def test_only_pending_entries_oldest_first_and_at_most_so_many():
    (e,) = pending_entries(DUMP, 3_000_000_000)
    assert e == {"process_group": "3", "pg_desc": "mesh_tp", "seq": 7, "op": "nccl:all_gather", "state": "started",
                 "age_ms": 2000, "timeout_ms": 600000, "last_completed_seq": 6, "last_enqueued_seq": 7}
    assert pending_entries(DUMP, 3_000_000_000, limit=0) == []


def test_read_only_for_an_old_marker_and_at_most_every_so_often():
    calls = []
    reader = FlightRecorder(lambda: calls.append(1) or DUMP, ErrorBudget(), after_s=10.0, every_s=60.0)
    now = time.perf_counter_ns()

    def marker(age_s):
        return (COMM, "all_gather", GroupRef("g", (0, 1)), 6, 4, 1, now - int(age_s * 1e9), -1)

    assert reader.read([], now) == [] and reader.read([marker(2)], now) == [] and not calls
    assert len(reader.read([marker(2), marker(12)], now)) == 1 and len(calls) == 1
    assert reader.read([marker(12)], now) == [] and len(calls) == 1  # within every_s


def test_a_failing_dump_is_counted_never_raised():
    def broken():
        raise RuntimeError("c10d: flight recorder buffer is being reset")

    errors = ErrorBudget()
    reader = FlightRecorder(broken, errors, after_s=0.0)
    assert reader.read([(COMM, "x", GroupRef("g", (0,)), 0, 0, 0, 0, -1)], time.perf_counter_ns()) == []
    assert errors.count == 1
