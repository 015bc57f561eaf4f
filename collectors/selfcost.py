"""The CPU time the collector's own threads have used, read from ``/proc`` (Linux).

The collector's background work (building and encoding batches, librdkafka's
threads, the control follower, NVML sampling) runs off the training thread but
still competes for cores and the GIL. Counting it lets a rank report its own
cost next to the bytes it sends, with no clock on the hot path.

Threads counted: Python threads named ``perftracker-*`` and librdkafka's
``rdk:*`` threads (a training script that runs its own librdkafka clients
would have those counted too). Resolution is the kernel's clock tick (10 ms).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

TASKS = Path("/proc/self/task")
THREAD_PREFIX = "perftracker-"
LIBRDKAFKA_PREFIX = "rdk:"
_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def thread_cpu_s(stat_line: str) -> float:
    """utime + stime of one ``/proc/.../stat`` line, in seconds (the name may hold spaces)."""
    fields = stat_line[stat_line.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # fields 14 and 15 of proc(5)


def background_cpu_by_thread(tasks: Path = TASKS) -> dict[str, float] | None:
    """CPU seconds so far of the collector's live threads by name (librdkafka's summed
    under ``librdkafka``); None where ``/proc`` is missing."""
    ours = {t.native_id: t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)}
    try:
        entries = list(tasks.iterdir())
    except OSError:
        return None
    by_name: dict[str, float] = {}
    for entry in entries:
        try:
            name = ours.get(int(entry.name))
            if name is None:
                if not (entry / "comm").read_text().startswith(LIBRDKAFKA_PREFIX):
                    continue
                name = "librdkafka"
            by_name[name] = by_name.get(name, 0.0) + thread_cpu_s((entry / "stat").read_text())
        except (OSError, ValueError):
            continue  # the thread ended while we looked
    return by_name

