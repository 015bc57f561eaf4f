"""The training thread's CPU evidence, read from ``/proc`` off the training thread (Linux).

Once per flush interval the sender thread reads, for the training thread ``tid``:

* ``/proc/self/task/<tid>/schedstat``: time on a CPU and time waiting in the run queue
  (ns; the kernel's own accounting, absent without ``CONFIG_SCHEDSTATS``/``schedstat``);
* ``/proc/self/task/<tid>/stat``: utime + stime (clock ticks; the CPU time when there
  is no schedstat) and major page faults;
* ``/proc/self/task/<tid>/status``: voluntary / involuntary context switches;
* ``/proc/loadavg`` (1-minute load) and ``/proc/stat`` (the host's steal share).

:class:`CpuReader` turns successive readings into deltas (one :class:`CpuSample` per
read). A file that cannot be read or parsed is counted in ``errors`` and its values
are -1 (unknown); nothing raises. The root is a parameter so tests use a fake ``/proc``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
UNKNOWN = -1


@dataclass(frozen=True)
class ThreadTotals:
    """Cumulative counters of one thread and its host at one instant (-1 unknown)."""

    mono_ns: int
    cpu_ns: int = UNKNOWN
    runqueue_ns: int = UNKNOWN
    voluntary: int = UNKNOWN
    involuntary: int = UNKNOWN
    major_faults: int = UNKNOWN
    load1: float = -1.0
    steal_ticks: int = UNKNOWN
    host_ticks: int = UNKNOWN


@dataclass(frozen=True)
class CpuSample:
    """What changed between two readings (-1: unknown on either side)."""

    interval_ns: int
    thread_cpu_ns: int
    runqueue_wait_ns: int
    voluntary_switches: int
    involuntary_switches: int
    major_faults: int
    load1: float
    steal_pct: float

    def as_record(self) -> dict:
        return {"interval_ns": self.interval_ns, "thread_cpu_ns": self.thread_cpu_ns,
                "runqueue_wait_ns": self.runqueue_wait_ns, "voluntary_switches": self.voluntary_switches,
                "involuntary_switches": self.involuntary_switches, "major_faults": self.major_faults,
                "load1": self.load1, "steal_pct": self.steal_pct, "cpus": os.cpu_count() or -1}


def counter_delta(new: int, old: int) -> int:
    """``new - old`` of a cumulative counter; -1 (unknown) when either is unknown or it went back."""
    return new - old if new >= 0 and old >= 0 and new >= old else UNKNOWN


class CpuReader:
    """Reads one thread's totals and hands out deltas; counts what it could not read."""

    def __init__(self, tid: int, root: Path = PROC):
        self.root = root
        self.task = root / "self" / "task" / str(tid)
        self.errors = 0  # files unreadable or unparsable so far
        self._last: ThreadTotals | None = None

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_text(errors="replace")
        except OSError:  # missing (no schedstat, the thread exited), unreadable
            self.errors += 1
            return None

    def totals(self) -> ThreadTotals:
        now = time.monotonic_ns()
        values: dict[str, int | float] = {}
        for parse in (self._schedstat, self._stat, self._status, self._loadavg, self._host_stat):
            try:
                values.update(parse())
            except (ValueError, IndexError):
                self.errors += 1
        return ThreadTotals(mono_ns=now, **values)  # type: ignore[arg-type]

    def sample(self) -> CpuSample | None:
        """The deltas since the previous call; None at the first call (nothing to compare)."""
        cur, prev = self.totals(), self._last
        self._last = cur
        if prev is None:
            return None
        steal = counter_delta(cur.steal_ticks, prev.steal_ticks)
        ticks = counter_delta(cur.host_ticks, prev.host_ticks)
        return CpuSample(
            interval_ns=cur.mono_ns - prev.mono_ns, thread_cpu_ns=counter_delta(cur.cpu_ns, prev.cpu_ns),
            runqueue_wait_ns=counter_delta(cur.runqueue_ns, prev.runqueue_ns),
            voluntary_switches=counter_delta(cur.voluntary, prev.voluntary),
            involuntary_switches=counter_delta(cur.involuntary, prev.involuntary),
            major_faults=counter_delta(cur.major_faults, prev.major_faults), load1=cur.load1,
            steal_pct=round(100.0 * steal / ticks, 3) if steal >= 0 and ticks > 0 else -1.0)

    def _schedstat(self) -> dict[str, int]:
        text = self._read(self.task / "schedstat")
        if text is None:
            return {}
        run_ns, wait_ns = text.split()[:2]
        return {"cpu_ns": int(run_ns), "runqueue_ns": int(wait_ns)}

    def _stat(self) -> dict[str, int]:
        text = self._read(self.task / "stat")
        if text is None:
            return {}
        fields = text[text.rindex(")") + 2:].split()  # the name may hold spaces and ')'
        out = {"major_faults": int(fields[9])}  # proc(5) field 12
        if not (self.task / "schedstat").exists():  # fall back to tick-resolution CPU time
            out["cpu_ns"] = (int(fields[11]) + int(fields[12])) * _TICK_NS  # fields 14, 15
        return out

    def _status(self) -> dict[str, int]:
        text = self._read(self.task / "status")
        if text is None:
            return {}
        out = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key == "voluntary_ctxt_switches":
                out["voluntary"] = int(value)
            elif key == "nonvoluntary_ctxt_switches":
                out["involuntary"] = int(value)
        if len(out) < 2:
            raise ValueError("no context switch counts")
        return out

    def _loadavg(self) -> dict[str, float]:
        text = self._read(self.root / "loadavg")
        return {} if text is None else {"load1": float(text.split()[0])}

    def _host_stat(self) -> dict[str, int]:
        text = self._read(self.root / "stat")
        if text is None:
            return {}
        first = text.split("\n", 1)[0].split()
        if not first or first[0] != "cpu":
            raise ValueError("no cpu line")
        ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
        return {"steal_ticks": ticks[7] if len(ticks) == 8 else UNKNOWN, "host_ticks": sum(ticks)}
