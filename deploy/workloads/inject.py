"""The fault-injection library the workloads' training scripts share (standard library only).

A training script decides *when* and *on which rank* a fault of the fault table
(:mod:`.faults`) is on; the mechanics that several faults need are here, written once:

* :func:`pin_with_hogs` — host CPU contention: this process pinned to its last allowed core
  with ``n`` busy processes on the same core (separate interpreters, so nothing of the
  training or its collector runs in them; each exits by itself once the rank is gone);
* :func:`make_cyclic_garbage` — work for the garbage collector (the gc-storm fault);
* :func:`stall` — a rank stuck in plain Python (hangs), its start written to a file;
* :func:`busy` — CPU work of a given wall length on the calling thread (slow code);
* :func:`write_onset` — the fault's start, written atomically as JSON for whoever scores the
  diagnosis (the wall time is the onset the recordings' truth counts from).

Nothing here imports torch or perftracker's collectors: the scripts run under ``perftracker
launch`` like any user's training, and their faults are not perftracker's code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

_HOG = ("import os\nos.sched_setaffinity(0, {{{core}}})\nx = 0\nwhile os.getppid() == {parent}:\n"
        "    for _ in range(200000): x += 1\n")


def pin_with_hogs(n: int) -> list[subprocess.Popen]:
    """Pin this process to its last allowed core and start ``n`` busy processes on it."""
    if n <= 0:
        return []
    core = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {core})
    code = _HOG.format(core=core, parent=os.getpid())
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait(5)


def make_cyclic_garbage(n: int) -> None:
    """``n`` self-referencing lists, left for the cyclic garbage collector."""
    for _ in range(n):
        a: list = []
        a.append(a)


def stall(seconds: float, mark_file: str | None = None) -> None:
    """Sleep ``seconds`` in plain Python; write the stall's start (``time.time()``) to ``mark_file``."""
    if mark_file:
        with open(mark_file, "w") as f:
            f.write(str(time.time()))
    time.sleep(seconds)


def busy(seconds: float) -> int:
    """Spin on the calling thread for ``seconds`` of wall time (CPU work, not a sleep)."""
    end, x = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        for _ in range(1000):
            x += 1
    return x


def write_onset(path: str, fault: str, rank: int, step: int, **extra: Any) -> dict[str, Any]:
    """Write ``{"fault", "rank", "step", "pid", "wall_time", ...}`` to ``path`` atomically."""
    info = {"fault": fault, "rank": rank, "step": step, "pid": os.getpid(), "wall_time": time.time(), **extra}
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, path)
    return info
