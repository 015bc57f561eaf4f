"""Pure parser: one Kineto trace (decoded JSON) -> one EventBatch-shaped dict.

The result follows ``schemas/event_batch.v3.avsc`` (it encodes with ``Codec("EventBatch")``)
and is what a rank's collector would have sent for the traced interval:

* ``iterations``: ``ProfilerStep#N`` annotations (step N).
* ``spans``: user annotations (``record_function`` blocks such as ``## forward ##``),
  classified by name (:func:`span_kind`): data loading, optimizer, forward, backward, GC,
  checkpoint, synchronize (waits: ``... wait() ##``, ``wait_for_batch``), else user block.
  A span nested inside another span of the same kind on the same thread is demoted to a
  user block, so per-kind totals (``kind:forward`` ...) do not count time twice.
* ``comms``: collectives (see :mod:`.collectives`); ``dur_ns`` is the time inside the call.
* ``kernels``: per-op summaries (count, total, p50, p99, max, bytes) of CUDA kernels
  (kind 0), memcpy (1), memset (2), CPU ops (3) and NCCL kernels (4).

Times stay on the trace's clock: ``mono_ns`` and ``wall_ns`` are both the trace's end,
so ``wall - mono = 0`` (Kineto's CPU clock is the host's wall clock); the importer may
re-base ``wall_ns``. Nothing here does I/O.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ...schemas.vocabulary import EVENT_BATCH_VERSION, OpKind, SpanKind
from ..detect.quantiles import percentiles
from .collectives import collectives
from .load import TraceError
from .table import Cat, EventTable, build_table

UNKNOWN_HOST = "unknown"  # Kineto traces do not record the host name


_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_COLLECTIVE_ANNOTATION = re.compile(r"^(nccl|gloo|ucc|mpi|xccl):")
# kinds summed into per-kind totals by the core: a nested span of one of these counts once
_AGGREGATED = (SpanKind.DATALOADER, SpanKind.OPTIMIZER, SpanKind.FORWARD, SpanKind.BACKWARD, SpanKind.GC)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    host: str
    gpu: int
    pid: int


def span_kind(name: str) -> SpanKind:
    """Span kind of a user annotation, from its name (see the module docstring)."""
    n = name.strip("# ").lower()
    if "dataloader" in n or "data_loader" in n:
        return SpanKind.DATALOADER
    if "wait" in n or "synchronize" in n or n.startswith("barrier"):
        return SpanKind.SYNCHRONIZE
    if "optimizer" in n or n.endswith("zero_grad") or n.startswith("optim."):
        return SpanKind.OPTIMIZER
    if n in ("gc", "gc.collect") or n.startswith("gc:") or "garbage" in n:
        return SpanKind.GC
    if "checkpoint" in n:
        return SpanKind.CHECKPOINT
    if n == "backward" or n.endswith((".backward", " backward", "_backward")):
        return SpanKind.BACKWARD
    if n == "forward" or n.endswith((".forward", " forward", "_forward")):
        return SpanKind.FORWARD
    return SpanKind.USER


def rank_info(trace: dict, t: EventTable, source: str) -> RankInfo:
    """Rank identity from ``distributedInfo`` (required) and the events (GPU, pid)."""
    info = trace.get("distributedInfo")
    if not isinstance(info, dict) or not isinstance(info.get("rank"), int) or info["rank"] < 0:
        raise TraceError(f"{source}: no distributedInfo.rank (a trace of one rank of a distributed job is needed)")
    world = info.get("world_size")
    if not isinstance(world, int) or world <= info["rank"]:
        raise TraceError(f"{source}: distributedInfo.world_size {world!r} does not cover rank {info['rank']}")
    gpus = [a["device"] for a in t.args.values() if isinstance(a.get("device"), int)]
    host = trace.get("hostname") or trace.get("host_name") or info.get("hostname") or UNKNOWN_HOST
    cpu = t.rows(Cat.CPU_OP)
    pid = 0
    if len(cpu):
        head = t.threads[int(t.tid[cpu[0]])].split(":", 1)[0]
        pid = int(head) if head.isdigit() else 0
    return RankInfo(int(info["rank"]), int(world), str(host), Counter(gpus).most_common(1)[0][0] if gpus else -1, pid)


class _Names:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        return self.index.setdefault(name, len(self.index))

    def list(self) -> list[str]:
        return list(self.index)


def _steps(t: EventTable) -> list[tuple[int, int, int]]:
    """(step, start_ns, dur_ns) of every ProfilerStep#N annotation."""
    out = []
    step_names = [i for i, n in enumerate(t.names) if _STEP.match(n)]  # matched once per name, not per row
    for r in np.flatnonzero(((t.cat == Cat.USER_ANNOTATION) | (t.cat == Cat.CPU_OP)) & np.isin(t.name, step_names)):
        m = _STEP.match(t.name_of(r))
        if m:
            out.append((int(m.group(1)), int(t.ts_ns[r]), int(t.dur_ns[r])))
    return sorted(out, key=lambda s: s[1])


def _step_at(steps: list[tuple[int, int, int]], ts: int) -> int:
    for step, start, dur in steps:
        if start <= ts < start + dur:
            return step
    return -1


def _spans(t: EventTable, names: _Names, steps: list) -> dict[str, list[int]]:
    cols: dict[str, list[int]] = {k: [] for k in ("kind", "name", "path", "step", "start_ns", "dur_ns")}
    outer_end: dict[tuple[int, int], int] = {}  # (tid, kind) -> end of the enclosing span
    for r in t.rows(Cat.USER_ANNOTATION):
        name = t.name_of(r)
        if _STEP.match(name) or _COLLECTIVE_ANNOTATION.match(name):
            continue
        kind, start, dur = span_kind(name), int(t.ts_ns[r]), int(t.dur_ns[r])
        key = (int(t.tid[r]), kind)
        if kind in _AGGREGATED and start < outer_end.get(key, -1):
            kind = SpanKind.USER  # nested in a span of the same kind: counted once
        elif kind in _AGGREGATED:
            outer_end[key] = start + dur
        for k, v in (("kind", int(kind)), ("name", names(name)), ("path", -1), ("step", _step_at(steps, start)),
                     ("start_ns", start), ("dur_ns", dur)):
            cols[k].append(v)
    return cols


def _op_kind(t: EventTable, row: int) -> OpKind | None:
    cat = t.cat[row]
    if cat == Cat.KERNEL:
        return OpKind.COMM_KERNEL if t.name_of(row).startswith(("ncclKernel", "ncclDevKernel")) else OpKind.CUDA_KERNEL
    return {int(Cat.MEMCPY): OpKind.MEMCPY, int(Cat.MEMSET): OpKind.MEMSET,
            int(Cat.CPU_OP): OpKind.CPU_OP}.get(int(cat))


def op_summaries(t: EventTable, names: _Names, profile_id: str) -> list[dict]:
    """OpSummary records: one per (op kind, name), durations in ns."""
    groups: dict[tuple[OpKind, str], list[int]] = {}
    ops = np.flatnonzero(np.isin(t.cat, [Cat.KERNEL, Cat.MEMCPY, Cat.MEMSET, Cat.CPU_OP]))
    key = t.cat[ops].astype(np.int64) * max(len(t.names), 1) + t.name[ops]  # one group per (category, name)
    order = np.argsort(key, kind="stable")
    for same in np.split(ops[order], np.flatnonzero(np.diff(key[order])) + 1) if len(ops) else []:
        kind = _op_kind(t, int(same[0]))  # the same for every row of the group
        if kind is not None:
            groups[(kind, t.name_of(same[0]))] = same.tolist()
    out = []
    for (kind, name), rows in sorted(groups.items()):
        d = t.dur_ns[rows]
        p50, _, p99 = percentiles(d)  # np.percentile's numbers, cheaper
        nbytes = sum(int(t.args.get(r, {}).get("bytes", 0) or 0) for r in rows) if kind == OpKind.MEMCPY else 0
        out.append({"kind": int(kind), "name": names(name), "profile_id": profile_id, "count": len(rows),
                    "total_ns": int(d.sum()), "p50_ns": int(p50), "p99_ns": int(p99),
                    "max_ns": int(d.max()), "bytes": nbytes})
    return out


def _comms(t: EventTable, info: RankInfo, names: _Names, steps: list) -> tuple[dict, list[dict]]:
    cols: dict[str, list[int]] = {k: [] for k in ("op", "group", "seq", "bytes", "step", "start_ns", "dur_ns")}
    groups: dict[str, int] = {}
    group_list: list[dict] = []
    for c in collectives(t, info.world_size):
        if c.group_id not in groups:
            groups[c.group_id] = len(group_list)
            group_list.append({"group_id": c.group_id, "ranks": list(c.ranks)})
        for k, v in (("op", names(c.op)), ("group", groups[c.group_id]), ("seq", c.seq),
                     ("bytes", c.nbytes), ("step", _step_at(steps, c.launch_ns)),
                     ("start_ns", c.start_ns), ("dur_ns", c.dur_ns)):
            cols[k].append(v)
    return cols, group_list


def parse_trace(trace: dict, job: str, source: str = "<trace>", profile_id: str = "") -> dict:
    """Decoded Kineto JSON of one rank -> EventBatch dict (see the module docstring).

    Raises :class:`TraceError` naming ``source`` when the trace has no events or no rank.
    Unusable events are left out; their counts are in the result's ``dropped_events``
    and, by reason, in :func:`parse_trace_with_skips`."""
    return parse_trace_with_skips(trace, job, source, profile_id)[0]


def parse_trace_with_skips(trace: dict, job: str, source: str = "<trace>",
                           profile_id: str = "") -> tuple[dict, Counter]:
    """:func:`parse_trace` plus the skipped-event counts by reason."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceError(f"{source}: no traceEvents list (not a PyTorch profiler / Chrome trace)")
    t = build_table(trace)
    info = rank_info(trace, t, source)
    if len(t) == 0:
        raise TraceError(f"{source}: no usable complete events (skipped: {dict(t.skipped) or 'none'})")
    names = _Names()
    steps = _steps(t)
    spans = _spans(t, names, steps)
    comms, groups = _comms(t, info, names, steps)
    kernels = op_summaries(t, names, profile_id or f"import:{job}")
    end_ns = int(t.end_ns().max())
    batch = {
        "schema_version": EVENT_BATCH_VERSION, "job": job, "rank": info.rank,
        "local_rank": max(info.gpu, 0), "world_size": info.world_size, "host": info.host,
        "gpu": info.gpu, "gpu_uuid": "", "pid": info.pid, "seq": 0,
        "dropped_events": int(sum(t.skipped.values())), "wall_ns": end_ns, "mono_ns": end_ns,
        "names": names.list(), "groups": groups,
        "iterations": {"step": [s for s, _, _ in steps], "start_ns": [s for _, s, _ in steps],
                       "dur_ns": [d for _, _, d in steps]},
        "spans": spans, "comms": comms, "kernels": kernels,
    }
    return batch, Counter(t.skipped)
