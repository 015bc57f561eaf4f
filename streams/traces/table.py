"""Parse one Kineto trace once into a compact per-rank event table (HTA style).

Only complete events (``ph == "X"``) are kept, as numpy columns: category code,
name index into a symbol table, thread index, start and duration in ns on the
trace's clock, and the CUDA correlation id. The few ``args`` later analyses need
(collective metadata, memcpy bytes) are kept sparsely by row. Events that cannot
be used (no numeric ts/dur, negative or absurd duration) are counted by reason,
never raised.

Clock: Kineto writes ``ts``/``dur`` in microseconds (floats in newer versions);
GPU timestamps are already mapped to the host CPU clock, so CPU and GPU events
of one trace share a timeline. When the trace carries ``baseTimeNanoseconds``
and its ``ts`` values are small (relative), the base is added back.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

MAX_EVENT_DURATION_NS = 3600 * 10**9  # a single event longer than an hour is absurd input
ARGS_KEPT = ("Collective name", "Process Group Name", "Process Group Ranks", "Process Group Description",
             "In msg nelems", "Out msg nelems", "In msg size", "dtype", "Group size", "Seq", "seq",
             "Input Dims", "Input type", "bytes", "correlation", "device")


class Cat(IntEnum):
    """Event categories the analyses distinguish."""

    OTHER = 0
    CPU_OP = 1
    USER_ANNOTATION = 2
    CUDA_RUNTIME = 3
    KERNEL = 4
    MEMCPY = 5
    MEMSET = 6
    GPU_ANNOTATION = 7
    PYTHON = 8


_CATS = {"cpu_op": Cat.CPU_OP, "operator": Cat.CPU_OP, "user_annotation": Cat.USER_ANNOTATION,
         "cuda_runtime": Cat.CUDA_RUNTIME, "cuda_driver": Cat.CUDA_RUNTIME, "kernel": Cat.KERNEL,
         "gpu_memcpy": Cat.MEMCPY, "gpu_memset": Cat.MEMSET, "gpu_user_annotation": Cat.GPU_ANNOTATION,
         "python_function": Cat.PYTHON}


@dataclass
class EventTable:
    """Columns of one rank's complete events, sorted by start time."""

    names: list[str]
    cat: np.ndarray  # int8 (Cat)
    name: np.ndarray  # int32 index into names
    tid: np.ndarray  # int32 index into threads
    ts_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64
    corr: np.ndarray  # int64, -1 when none
    args: dict[int, dict] = field(default_factory=dict)  # row -> kept args (sparse)
    threads: list[str] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.ts_ns)

    def rows(self, cat: Cat) -> np.ndarray:
        return np.flatnonzero(self.cat == cat)

    def name_of(self, row: int | np.integer) -> str:
        return self.names[int(self.name[row])]

    def end_ns(self) -> np.ndarray:
        return self.ts_ns + self.dur_ns


class _Symbols:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.items: list[str] = []

    def __call__(self, value: object) -> int:
        key = str(value)
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.items)
            self.items.append(key)
        return i


def _number(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _base_us(trace: dict, events: list) -> float:
    base = _number(trace.get("baseTimeNanoseconds"))
    if base is None:
        return 0.0
    for e in events[:64]:
        ts = _number(e.get("ts")) if isinstance(e, dict) else None
        if ts is not None:
            return base / 1000.0 if ts < 1e12 else 0.0  # relative timestamps only
    return 0.0


def _check_event(e: object, skipped: Counter) -> tuple[float, float] | None:
    """(ts_us, dur_us) of a usable complete event, else None (counted)."""
    if not isinstance(e, dict):
        skipped["not an object"] += 1
        return None
    if e.get("ph") != "X":
        return None
    ts, dur = _number(e.get("ts")), _number(e.get("dur", 0))
    if ts is None or dur is None:
        skipped["non-numeric ts or dur"] += 1
        return None
    if dur < 0:
        skipped["negative duration"] += 1
        return None
    if dur * 1000 > MAX_EVENT_DURATION_NS:
        skipped["duration over one hour"] += 1
        return None
    return ts, dur


def build_table(trace: dict) -> EventTable:
    """One trace's ``traceEvents`` -> :class:`EventTable` (see the module docstring)."""
    events = trace.get("traceEvents") or []
    base_us = _base_us(trace, events)
    names, threads = _Symbols(), _Symbols()
    skipped: Counter[str] = Counter()
    cols: dict[str, list] = {k: [] for k in ("cat", "name", "tid", "ts", "dur", "corr")}
    args: dict[int, dict] = {}
    for e in events:
        checked = _check_event(e, skipped)
        if checked is None:
            continue
        ts, dur = checked
        cat = _CATS.get(str(e.get("cat", "")).lower(), Cat.OTHER)
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        corr = _number(a.get("correlation"))
        row = len(cols["ts"])
        cols["cat"].append(int(cat))
        cols["name"].append(names(e.get("name", "")))
        cols["tid"].append(threads(f"{e.get('pid')}:{e.get('tid')}"))
        cols["ts"].append(int(round((ts + base_us) * 1000)))
        cols["dur"].append(int(round(dur * 1000)))
        cols["corr"].append(int(corr) if corr is not None else -1)
        kept = {k: a[k] for k in ARGS_KEPT if k in a}
        if kept and cat in (Cat.KERNEL, Cat.USER_ANNOTATION, Cat.CPU_OP, Cat.MEMCPY, Cat.MEMSET):
            args[row] = kept
    order = np.argsort(np.asarray(cols["ts"], dtype=np.int64), kind="stable")
    remap = np.empty_like(order)
    remap[order] = np.arange(len(order))
    return EventTable(
        names=names.items, cat=np.asarray(cols["cat"], np.int8)[order],
        name=np.asarray(cols["name"], np.int32)[order], tid=np.asarray(cols["tid"], np.int32)[order],
        ts_ns=np.asarray(cols["ts"], np.int64)[order], dur_ns=np.asarray(cols["dur"], np.int64)[order],
        corr=np.asarray(cols["corr"], np.int64)[order],
        args={int(remap[r]): a for r, a in args.items()}, threads=threads.items, skipped=skipped)
