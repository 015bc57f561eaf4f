"""Builds the columnar EventBatch record from drained event tuples (off the hot path)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

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


def _columns(*names: str) -> dict[str, list]:
    return {n: [] for n in names}


class BatchBuilder:
    """Turns event tuples into one EventBatch dict; numbers batches per (job, rank, pid)."""

    def __init__(self, identity: RankIdentity):
        self.identity = identity
        self.seq = 0

    def build(self, events: Iterable[tuple], dropped: int,
              kernels: Sequence[OpSummary] = ()) -> dict[str, Any]:
        names = _Names()
        groups: dict[GroupRef, int] = {}
        iters = _columns("step", "start_ns", "dur_ns")
        spans = _columns("kind", "name", "path", "step", "start_ns", "dur_ns")
        comms = _columns("op", "group", "seq", "bytes", "step", "start_ns", "dur_ns")
        for ev in events:
            tag = ev[0]
            if tag == SPAN:
                _append(spans, (ev[1], names(ev[2]), -1, ev[3], ev[4], ev[5]))
            elif tag == COMM:
                gidx = groups.setdefault(ev[2], len(groups))
                _append(comms, (names(ev[1]), gidx, ev[3], ev[4], ev[5], ev[6], ev[7]))
            elif tag == ITER:
                _append(iters, ev[1:])
        record = self._header(dropped)
        record.update(
            groups=[{"group_id": g.group_id, "ranks": list(g.ranks)} for g in groups],
            iterations=iters, spans=spans, comms=comms,
            kernels=[_kernel(k, names) for k in kernels],
        )
        record["names"] = list(names.index)
        self.seq += 1
        return record

    def _header(self, dropped: int) -> dict[str, Any]:
        ident = self.identity
        return {
            "job": ident.job, "rank": ident.rank, "local_rank": ident.local_rank,
            "world_size": ident.world_size, "host": ident.host, "gpu": ident.gpu,
            "gpu_uuid": ident.gpu_uuid, "pid": ident.pid, "seq": self.seq,
            "dropped_events": dropped, "wall_ns": time.time_ns(), "mono_ns": time.perf_counter_ns(),
        }


def _append(columns: dict[str, list], values: Sequence[int]) -> None:
    for col, value in zip(columns.values(), values, strict=True):
        col.append(value)


def _kernel(k: OpSummary, names: _Names) -> dict[str, Any]:
    return {"kind": int(k.kind), "name": names(k.name), "profile_id": k.profile_id,
            "count": k.count, "total_ns": k.total_ns, "p50_ns": k.p50_ns, "p99_ns": k.p99_ns,
            "max_ns": k.max_ns, "bytes": k.nbytes}


def event_count(record: dict[str, Any]) -> int:
    """Number of events a built record carries."""
    return (len(record["iterations"]["step"]) + len(record["spans"]["kind"])
            + len(record["comms"]["op"]))
