"""Parse one Kineto trace once into a compact per-rank event table (HTA style).

Only complete events (``ph == "X"``) are kept, as numpy columns: category code,
name index into a symbol table, thread index, start and duration in ns on the
trace's clock, and the CUDA correlation id. The few ``args`` later analyses need
are kept sparsely by row: those of kernels, memcpys and memsets (collective metadata,
device, bytes) and of CPU-side collective annotations (``nccl:all_reduce``,
``record_param_comms``: op, group, sizes); every other row's ``args`` is never decoded
beyond its correlation id. Events that cannot be used (no numeric ts/dur, negative or
absurd duration) are counted by reason, never raised.

Cost (the importer's hot loop): one pass over the events, a few dict lookups per event
(names, categories and threads are interned), columns grown as ``array.array`` (8 bytes
or less per value, not a Python int each).

Clock: Kineto writes ``ts``/``dur`` in microseconds (floats in newer versions);
GPU timestamps are already mapped to the host CPU clock, so CPU and GPU events
of one trace share a timeline. When the trace carries ``baseTimeNanoseconds``
and its ``ts`` values are small (relative), the base is added back.
"""

from __future__ import annotations

import math
import re
from array import array
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgspec
import numpy as np

MAX_EVENT_DURATION_NS = 3600 * 10**9  # a single event longer than an hour is absurd input
ARGS_KEPT = ("Collective name", "Process Group Name", "Process Group Ranks", "Process Group Description",
             "In msg nelems", "Out msg nelems", "In msg size", "dtype", "Group size", "Seq", "seq",
             "Input Dims", "Input type", "bytes", "correlation", "device")
# CPU-side collective annotations: ``<backend>:<op>`` blocks and c10d's ``record_param_comms``
COLLECTIVE_ANNOTATION = re.compile(r"^(nccl|gloo|ucc|mpi|xccl):([A-Za-z_]+)")
PARAM_COMMS = "record_param_comms"


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
_ARG_CATS = frozenset({int(Cat.KERNEL), int(Cat.MEMCPY), int(Cat.MEMSET)})  # args always kept
_ANNOTATION_CATS = frozenset({int(Cat.USER_ANNOTATION), int(Cat.CPU_OP)})  # kept for collective annotations


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


# the args the analyses read, as one struct (keys absent stay UNSET); every other key is skipped unread
KeptArgs = msgspec.defstruct("KeptArgs", [(f"a{i}", Any, msgspec.field(default=msgspec.UNSET, name=key))
                                          for i, key in enumerate(ARGS_KEPT)])
_CORRELATION_FIELD = f"a{ARGS_KEPT.index('correlation')}"
_EXACT = 1 << 53  # ints below this convert to float exactly


class KinetoEvent(msgspec.Struct):
    """The fields of one trace event the table reads; every other key is skipped unread."""

    ph: Any = None
    cat: Any = ""
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = 0
    args: KeptArgs | None = None  # type: ignore[valid-type]  # None also when args is not an object


class _AnyArgsEvent(KinetoEvent):
    args: Any = None  # an event whose args is not an object (read, then treated as no args)


_EVENT = msgspec.json.Decoder(KinetoEvent)
_ANY_ARGS_EVENT = msgspec.json.Decoder(_AnyArgsEvent)


def event_from_dict(e: dict) -> KinetoEvent:
    """A plain-dict event (a trace decoded by the caller) as the loader would have decoded it."""
    a = e.get("args")
    return KinetoEvent(e.get("ph"), e.get("cat", ""), e.get("name", ""), e.get("pid"), e.get("tid"),
                       e.get("ts"), e.get("dur", 0), msgspec.convert(a, KeptArgs) if isinstance(a, dict) else None)


def as_event(item: object) -> KinetoEvent | None:
    """One element of ``traceEvents`` as a :class:`KinetoEvent`: decoded from the raw JSON
    the loader keeps per event, converted from a dict, or None when it is not an object."""
    if type(item) is msgspec.Raw:
        try:
            return _EVENT.decode(item)
        except msgspec.ValidationError:
            pass
        try:
            e = _ANY_ARGS_EVENT.decode(item)
        except msgspec.ValidationError:
            return None
        e.args = None
        return e
    if isinstance(item, KinetoEvent):
        return item
    return event_from_dict(item) if isinstance(item, dict) else None


def _number(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _base_us(trace: dict, events: list) -> float:
    base = _number(trace.get("baseTimeNanoseconds"))
    if base is None:
        return 0.0
    for item in events[:64]:
        e = as_event(item)
        ts = _number(e.ts) if e is not None else None
        if ts is not None:
            return base / 1000.0 if ts < 1e12 else 0.0  # relative timestamps only
    return 0.0


def _times(e: KinetoEvent, skipped: Counter) -> tuple[float, float] | None:
    """(ts_us, dur_us) of a usable complete event, else None (counted)."""
    ts, dur = _number(e.ts), _number(e.dur)
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


def _correlation(args: Any) -> int:
    """The correlation id in ``args`` (a KeptArgs or None), -1 when none."""
    if args is None:
        return -1
    c = getattr(args, _CORRELATION_FIELD)
    if type(c) is int and -_EXACT < c < _EXACT:  # the common case, as float() would give it
        return c
    n = _number(c)
    return int(n) if n is not None else -1


def _kept(args: Any) -> dict | None:
    """The recorded kept args as a dict, None when there are none."""
    if args is None:
        return None
    return {k: v for k, v in zip(ARGS_KEPT, msgspec.structs.astuple(args), strict=True)
            if v is not msgspec.UNSET} or None


class _Columns:
    """Compact growing columns (``array.array``) and the symbol tables of one trace."""

    def __init__(self) -> None:
        self.times = array("q")  # per row: ts_ns, dur_ns, correlation
        self.codes = array("i")  # per row: category, name index, thread index
        self.names: dict[str, int] = {}
        self.keep_name: list[bool] = []  # per name: a CPU-side collective annotation (args kept)
        self.cats: dict[str, int] = {}
        self.threads: dict[str, int] = {}  # "pid:tid" text -> index
        self.thread_keys: dict[tuple, int] = {}  # (pid, tid) of plain ints/strings -> index

    def __len__(self) -> int:
        return len(self.codes) // 3

    def name_index(self, value: object) -> int:
        key = value if isinstance(value, str) else str(value)
        i = self.names.get(key)
        if i is None:
            i = self.names[key] = len(self.names)
            self.keep_name.append(bool(COLLECTIVE_ANNOTATION.match(key)) or key == PARAM_COMMS)
        return i

    def cat_code(self, value: object) -> int:
        key = value if isinstance(value, str) else str(value)
        code = self.cats.get(key)
        if code is None:
            code = self.cats[key] = int(_CATS.get(key.lower(), Cat.OTHER))
        return code

    def thread_index(self, pid: object, tid: object) -> int:
        """Index of the thread named ``f"{pid}:{tid}"`` (the text decides, as 1 and "1" print alike)."""
        plain = type(pid) in _KEYS and type(tid) in _KEYS
        if plain:
            i = self.thread_keys.get((pid, tid))
            if i is not None:
                return i
        text = f"{pid}:{tid}"
        i = self.threads.get(text)
        if i is None:
            i = self.threads[text] = len(self.threads)
        if plain:
            self.thread_keys[(pid, tid)] = i
        return i


_NUMBERS = frozenset({int, float})
_KEYS = frozenset({int, str})


def build_table(trace: dict) -> EventTable:
    """One trace's ``traceEvents`` -> :class:`EventTable` (see the module docstring).

    Events are raw JSON (as :func:`.load.decode_trace` keeps them: one event is decoded at a
    time, so a trace's events never all exist as objects at once), :class:`KinetoEvent` or plain
    dicts. The loop inlines the common case (numeric times, known name, category and thread);
    anything else takes the checked path that counts what it skips."""
    events = trace.get("traceEvents") or []
    base_us = _base_us(trace, events)
    cols, skipped, args = _Columns(), Counter[str](), {}
    names, cats, threads, decode = cols.names, cols.cats, cols.thread_keys, _EVENT.decode
    for item in events:
        try:  # the loader's raw JSON of one event: the common case
            e = decode(item) if type(item) is msgspec.Raw else as_event(item)
        except msgspec.ValidationError:  # not an object, or its args are not
            e = as_event(item)
        if e is None:
            skipped["not an object"] += 1
            continue
        if e.ph != "X":
            continue
        ts, dur = e.ts, e.dur
        if not (type(ts) in _NUMBERS and type(dur) in _NUMBERS and ts - ts == 0
                and 0 <= dur and dur * 1000 <= MAX_EVENT_DURATION_NS):
            checked = _times(e, skipped)
            if checked is None:
                continue
            ts, dur = checked
        cat = cats.get(e.cat) if type(e.cat) is str else None
        name = names.get(e.name) if type(e.name) is str else None
        tid = threads.get((e.pid, e.tid)) if type(e.pid) in _KEYS and type(e.tid) in _KEYS else None
        cat = cols.cat_code(e.cat) if cat is None else cat
        name = cols.name_index(e.name) if name is None else name
        if cat in _ARG_CATS or (cat in _ANNOTATION_CATS and cols.keep_name[name]):
            kept = _kept(e.args)
            if kept is not None:
                args[len(cols)] = kept
        cols.codes.extend((cat, name, cols.thread_index(e.pid, e.tid) if tid is None else tid))
        cols.times.extend((round((ts + base_us) * 1000), round(dur * 1000), _correlation(e.args)))
    return _sorted_table(cols, args, skipped)


def _sorted_table(cols: _Columns, args: dict[int, dict], skipped: Counter) -> EventTable:
    times = np.frombuffer(cols.times, dtype=np.int64).reshape(-1, 3) if len(cols) else np.zeros((0, 3), np.int64)
    codes = np.frombuffer(cols.codes, dtype=np.int32).reshape(-1, 3) if len(cols) else np.zeros((0, 3), np.int32)
    order = np.argsort(times[:, 0], kind="stable")
    remap = np.empty_like(order)
    remap[order] = np.arange(len(order))
    times, codes = times[order], codes[order]
    return EventTable(
        names=list(cols.names), cat=codes[:, 0].astype(np.int8), name=codes[:, 1].copy(),
        tid=codes[:, 2].copy(), ts_ns=times[:, 0].copy(), dur_ns=times[:, 1].copy(), corr=times[:, 2].copy(),
        args={int(remap[r]): a for r, a in args.items()}, threads=list(cols.threads), skipped=skipped)
