"""The fault-injection library: hogs share the rank's one core and leave with it; the onset is
written whole."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from perftracker_ml.deploy.workloads import inject

CHILD = """
import json, os, sys
from perftracker_ml.deploy.workloads import inject
hogs = inject.pin_with_hogs(2)
print(json.dumps({"me": sorted(os.sched_getaffinity(0)), "hogs": [h.pid for h in hogs]}), flush=True)
"""


def test_hogs_are_pinned_with_the_rank_and_exit_once_it_is_gone():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    info = json.loads(out.stdout)
    assert len(info["me"]) == 1 and len(info["hogs"]) == 2
    deadline = time.monotonic() + 20
    alive = list(info["hogs"])
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
        time.sleep(0.2)
    assert not alive, f"hogs outlived their rank: {alive}"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_the_onset_is_written_whole_with_its_wall_time(tmp_path: Path):
    path = tmp_path / "onset.json"
    before = time.time()
    info = inject.write_onset(str(path), "slow-dataloader", 2, 300, extra="x")
    written = json.loads(path.read_text())
    assert written == info and written["rank"] == 2 and written["step"] == 300 and written["extra"] == "x"
    assert before <= written["wall_time"] <= time.time() and written["pid"] == os.getpid()
    assert not list(tmp_path.glob("*.tmp"))


def test_cyclic_garbage_is_left_for_the_collector():
    gc.collect()
    gc.disable()
    try:
        inject.make_cyclic_garbage(1000)
        assert gc.collect() >= 1000
    finally:
        gc.enable()


def test_a_stall_marks_its_start(tmp_path: Path):
    mark = tmp_path / "mark"
    t0 = time.time()
    inject.stall(0.05, str(mark))
    assert t0 <= float(mark.read_text()) <= time.time()
