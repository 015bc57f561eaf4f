"""Builds the columnar EventBatch record from drained event tuples (off the hot path).

A process group whose members are equally spaced is written as a range (EventBatch v9) when
the builder is told the readers take it (``compact_groups``). The record's columns are lists;
the sender thread's ``Codec.encode`` writes EventBatch v8 and later,
packing each numeric column into little-endian bytes with one ``array.array`` conversion
(:mod:`perftracker_ml.schemas.columns`), so the training thread never pays for it and a
value that cannot be packed fails that encode (the batch's events counted as lost)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..schemas.records import group_entry
from .events import COMM, ITER, SPAN, GroupRef, OpSummary
from .identity import RankIdentity


class _Names:
    """Per-batch dictionary of strings."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        idx = self.index.get(name)
        if idx is None:
            idx = self.index[name] = len(self.index)
        return idx


StackRow = tuple[str, int, int, int, str]  # (file function, line, kind, count, source text)


def _columns(*names: str) -> dict[str, list]:
    return {n: [] for n in names}


class BatchBuilder:
    """Turns event tuples into one EventBatch dict; numbers batches per (job, rank, pid)."""

    def __init__(self, identity: RankIdentity, compact_groups: bool = False):
        self.identity = identity
        self.seq = 0
        # EventBatch v9: a group whose members are equally spaced sends them as a range (a DP
        # group of a 100k-rank job has thousands); False writes the list every reader knows
        self.compact_groups = compact_groups
        self._group_entries: dict[GroupRef, dict[str, Any]] = {}  # built once, never mutated
        self.mesh_coords: dict[str, int] = {}  # replaced whole, never mutated (read by the sender)
        self.functional_steps = 1  # functional collectives recorded one step in this many (EventBatch v8)

    def build(self, events: Iterable[tuple], dropped: int, kernels: Sequence[OpSummary] = (),
              cpu: Sequence[dict] = (), stacks: Sequence[StackRow] = ()) -> dict[str, Any]:
        """``cpu``: CpuSample records; ``stacks``: ``(file function, line, kind, count, code)`` rows."""
        names = _Names()
        index = names.index
        name_id = index.setdefault  # (name, len(index)): the name's id, a new one if unseen
        groups: dict[GroupRef, int] = {}
        iters = _columns("step", "start_ns", "dur_ns")
        spans = _columns("kind", "name", "path", "step", "start_ns", "dur_ns")
        comms = _columns("op", "group", "seq", "bytes", "step", "start_ns", "dur_ns")
        # one bound append per column: this loop runs for every event the rank records
        s_kind, s_name, s_step, s_start, s_dur = (spans[c].append for c in
                                                  ("kind", "name", "step", "start_ns", "dur_ns"))
        c_op, c_group, c_seq, c_bytes, c_step, c_start, c_dur = (comms[c].append for c in comms)
        i_step, i_start, i_dur = (iters[c].append for c in iters)
        for ev in events:
            tag = ev[0]
            if tag == SPAN:
                _, kind, name, step, start, dur = ev
                s_kind(kind)
                s_name(name_id(name, len(index)))
                s_step(step)
                s_start(start)
                s_dur(dur)
            elif tag == COMM:
                _, op, group, seq, nbytes, step, start, dur = ev
                c_op(name_id(op, len(index)))
                c_group(groups.setdefault(group, len(groups)))
                c_seq(seq)
                c_bytes(nbytes)
                c_step(step)
                c_start(start)
                c_dur(dur)
            elif tag == ITER:
                i_step(ev[1])
                i_start(ev[2])
                i_dur(ev[3])
        spans["path"] = [-1] * len(spans["kind"])
        record = self._header(dropped)
        record.update(
            groups=[self._group_entry(g) for g in groups],
            iterations=iters, spans=spans, comms=comms,
            kernels=[_kernel(k, names) for k in kernels], cpu=list(cpu),
            stacks={"frame": [names(r[0]) for r in stacks], "line": [r[1] for r in stacks],
                    "kind": [r[2] for r in stacks], "count": [r[3] for r in stacks],
                    "code": [names(r[4]) if r[4] else -1 for r in stacks]},
        )
        record["names"] = list(index)
        self.seq += 1
        return record

    def _group_entry(self, g: GroupRef) -> dict[str, Any]:
        """The batch's entry of group ``g`` (shared by every batch that names it: read only)."""
        entry = self._group_entries.get(g)
        if entry is None:
            entry = self._group_entries[g] = group_entry(g.group_id, g.ranks, self.compact_groups)
        return entry

    def _header(self, dropped: int) -> dict[str, Any]:
        ident = self.identity
        return {
            "job": ident.job, "rank": ident.rank, "local_rank": ident.local_rank,
            "world_size": ident.world_size, "host": ident.host, "gpu": ident.gpu,
            "gpu_uuid": ident.gpu_uuid, "pid": ident.pid, "seq": self.seq,
            "dropped_events": dropped, "wall_ns": time.time_ns(), "mono_ns": time.perf_counter_ns(),
            "mesh_coords": self.mesh_coords, "functional_steps": self.functional_steps,
        }


def _kernel(k: OpSummary, names: _Names) -> dict[str, Any]:
    return {"kind": int(k.kind), "name": names(k.name), "profile_id": k.profile_id,
            "count": k.count, "total_ns": k.total_ns, "p50_ns": k.p50_ns, "p99_ns": k.p99_ns,
            "max_ns": k.max_ns, "bytes": k.nbytes}


def event_count(record: dict[str, Any]) -> int:
    """Number of events a built record carries."""
    return (len(record["iterations"]["step"]) + len(record["spans"]["kind"])
            + len(record["comms"]["op"]))
