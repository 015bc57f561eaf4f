"""Collectives of one rank's trace: op, process group, sequence number, bytes, time inside.

Sources, best first:

* **NCCL kernels** (``ncclKernel_*`` / ``ncclDevKernel_*``): the kernel's duration is the
  device time inside the collective (it starts when the stream reaches it and ends when
  every member has exchanged its data), so it includes the wait for late members. Its
  metadata comes from the kernel's own args (newer PyTorch: ``Collective name``,
  ``Process Group Name/Ranks``, ``In msg nelems``, ``dtype``, ``Seq``), else from the CPU
  annotation (``nccl:all_to_all``, ``record_param_comms``) that encloses the kernel's
  launch (the ``cudaLaunchKernel`` with the same correlation id, on the same thread),
  else from the kernel name (``AllReduce`` -> all_reduce, ``SendRecv`` -> send_recv).
* **CPU annotations** ``<backend>:<op>`` (e.g. ``gloo:all_reduce``) when the trace has no
  NCCL kernel at all: the annotation's wall time is the time inside the call.

Process group: ``Process Group Name`` when recorded (group id ``pg:<name>``), else the
default group ``world`` of all ``world_size`` ranks. Sequence number: the recorded
``Seq`` when every collective has one, else assigned here in start order per (group, op)
from 0 -- identical on every member as long as each rank's trace covers the same calls.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

from .table import COLLECTIVE_ANNOTATION, PARAM_COMMS, Cat, EventTable

WORLD_GROUP = "world"
_KERNEL_OPS = (("AllReduce", "all_reduce"), ("AllGather", "all_gather"),
               ("ReduceScatter", "reduce_scatter"), ("Broadcast", "broadcast"),
               ("Reduce", "reduce"), ("SendRecv", "send_recv"), ("Send", "send"), ("Recv", "recv"),
               ("AllToAll", "all_to_all"))
DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "c10::half": 2,
               "float16": 2, "bfloat16": 2, "c10::bfloat16": 2, "long int": 8, "long": 8, "int64": 8,
               "int": 4, "int32": 4, "short int": 2, "int16": 2, "signed char": 1, "int8": 1,
               "unsigned char": 1, "uint8": 1, "bool": 1}


@dataclass(frozen=True)
class Collective:
    """One collective call on one rank (times in ns on the trace clock)."""

    op: str
    group_id: str
    ranks: tuple[int, ...]
    seq: int
    nbytes: int
    start_ns: int
    dur_ns: int
    launch_ns: int  # CPU time the call was issued (for step attribution)


def kernel_op(name: str) -> str:
    body = name.split("(", 1)[0]
    for token, op in _KERNEL_OPS:
        if f"_{token}_" in body or body.endswith(f"_{token}"):
            return op
    return "collective"


def _int_list(value: object) -> tuple[int, ...] | None:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    if isinstance(value, (list, tuple)) and all(isinstance(x, int) for x in value):
        return tuple(int(x) for x in value)
    return None


def _nbytes(args: dict) -> int:
    dtype = str(args.get("dtype") or "").lower()
    nelems = args.get("In msg nelems")
    if not isinstance(nelems, int):
        dims, types = args.get("Input Dims"), args.get("Input type")
        if not (isinstance(dims, list) and dims and isinstance(dims[0], list)):
            return 0
        if not all(isinstance(d, int) for d in dims[0]):
            return 0
        nelems = int(np.prod(dims[0])) if dims[0] else 0
        dtype = str(types[0]).lower() if isinstance(types, list) and types else dtype
    return int(nelems) * DTYPE_BYTES.get(dtype, 1)


def _annotations(t: EventTable) -> np.ndarray:
    """Rows of CPU-side collective annotations (``nccl:op``, ``record_param_comms``)."""
    named = [i for i, n in enumerate(t.names) if COLLECTIVE_ANNOTATION.match(n) or n == PARAM_COMMS]  # per name, not per row
    return np.flatnonzero(((t.cat == Cat.USER_ANNOTATION) | (t.cat == Cat.CPU_OP)) & np.isin(t.name, named))


def _enclosing_args(t: EventTable, ann: np.ndarray, launch: int) -> dict:
    """Merged args + op of the collective annotations enclosing ``launch`` (innermost wins)."""
    ts, end, tid = t.ts_ns[launch], t.ts_ns[launch] + t.dur_ns[launch], t.tid[launch]
    merged: dict = {}
    inside = (t.tid[ann] == tid) & (t.ts_ns[ann] <= ts) & (end <= t.ts_ns[ann] + t.dur_ns[ann])
    for r in ann[inside]:  # sorted by start: later (inner) annotations override
        merged.update(t.args.get(int(r), {}))
        m = COLLECTIVE_ANNOTATION.match(t.name_of(r))
        if m:
            merged["_op"] = m.group(2).lower()
    return merged


def _meta(args: dict, fallback_op: str, world: int) -> tuple[str, str, tuple[int, ...], int | None]:
    op = str(args.get("Collective name") or args.get("_op") or fallback_op).lower()
    group, ranks = WORLD_GROUP, tuple(range(world))
    pg = args.get("Process Group Name")
    if pg not in (None, ""):
        group = f"pg:{pg}"
        ranks = _int_list(args.get("Process Group Ranks")) or ranks
    seq = args.get("Seq", args.get("seq"))
    return op, group, ranks, int(seq) if isinstance(seq, int) and not isinstance(seq, bool) else None


def _raw_collectives(t: EventTable, world: int) -> list[tuple]:
    kernels = [r for r in t.rows(Cat.KERNEL) if t.name_of(r).startswith(("ncclKernel", "ncclDevKernel"))]
    ann = _annotations(t)
    out = []
    if kernels:
        runtime = t.rows(Cat.CUDA_RUNTIME)
        launch_of = {int(t.corr[r]): int(r) for r in runtime if t.corr[r] >= 0}
        for k in kernels:
            launch = launch_of.get(int(t.corr[k]))
            args = dict(_enclosing_args(t, ann, launch)) if launch is not None else {}
            args.update(t.args.get(int(k), {}))
            launch_ns = int(t.ts_ns[launch]) if launch is not None else int(t.ts_ns[k])
            out.append((*_meta(args, kernel_op(t.name_of(k)), world), _nbytes(args),
                        int(t.ts_ns[k]), int(t.dur_ns[k]), launch_ns))
        return out
    for r in ann:
        m = COLLECTIVE_ANNOTATION.match(t.name_of(r))
        if m:
            args = {**t.args.get(int(r), {}), "_op": m.group(2).lower()}
            out.append((*_meta(args, "collective", world), _nbytes(args),
                        int(t.ts_ns[r]), int(t.dur_ns[r]), int(t.ts_ns[r])))
    return out


def collectives(t: EventTable, world_size: int) -> list[Collective]:
    """Every collective of the trace, in start order, with its per-(group, op) seq."""
    raw = sorted(_raw_collectives(t, world_size), key=lambda c: (c[7], c[5]))
    recorded = bool(raw) and all(c[3] is not None for c in raw)
    counters: dict[tuple[str, str], int] = {}
    out = []
    for op, group, ranks, seq, nbytes, start, dur, launch in raw:
        if not recorded:
            seq = counters.get((group, op), 0)
            counters[(group, op)] = seq + 1
        out.append(Collective(op, group, ranks, int(seq), nbytes, start, dur, launch))
    return out
