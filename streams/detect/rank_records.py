"""A rank's closed window as records: the FunctionPattern and RankWindow fields, the signature.

The patterns of many windows are made together by :mod:`.window_close`. Each function's
pattern carries exact p50/p90/p99 from the kept durations plus the mergeable log histogram
(collectives: their per-seq durations first); ``kind:<name>`` aggregates make every rank
report GC, data loading, forward, backward and optimizer time, even when it is zero. The
RankWindow carries the window's steps, the rank's progress and health, and the hardware
samples reduced (means; max for temperature, errors and clock limit; min for PCIe generation
and width).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import repeat

from ...schemas.records import (
    FunctionPattern,
    RankWindow,
    RankWindowHeader,
)
from ...schemas.vocabulary import (
    RANK_WINDOW_VERSION,
    SpanKind,
)
from .accumulate import FunctionAcc, RankHealth, RankMeta, RankProgress, WindowAcc
from .device_evidence import DEVICE_AGGREGATES, DEVICE_PREFIX
from .model import COMM_PREFIX, KIND_PREFIX, STRUCTURAL, comm_op, kind_function
from .window_evidence import cpu_fields, hardware_fields, net_fields

ALWAYS_AGGREGATED = (SpanKind.DATALOADER, SpanKind.OPTIMIZER, SpanKind.FORWARD,
                     SpanKind.BACKWARD, SpanKind.GC)
ALWAYS_AGGREGATED_FUNCTIONS = frozenset(kind_function(k) for k in ALWAYS_AGGREGATED)  # their pattern names
DEVICE_AGGREGATE_FUNCTIONS = frozenset(DEVICE_AGGREGATES.values())


@dataclass(frozen=True)
class Closing:
    """One closed window of one rank, waiting for its records (:func:`.window_close.close_windows`). ``ended``:
    the rank's last window (its collector's final batch came): the RankWindow says so."""

    meta: RankMeta
    window_id: int
    window_s: float
    w: WindowAcc
    progress: RankProgress
    health: RankHealth
    batches: int
    ended: bool = False


Routed = tuple[str, FunctionPattern | RankWindow]


def pattern_functions(rw: RankWindow) -> set[str]:
    """Names of the FunctionPatterns :func:`.window_close.close_windows` sent before ``rw`` (same window, same
    rank): its functions, plus the per-kind aggregates when it had any function or step."""
    names = set(map(str, rw.get("functions", [])))
    if any(map(str.startswith, names, repeat(DEVICE_PREFIX))):
        names |= DEVICE_AGGREGATE_FUNCTIONS
    if names or int(rw.get("steps", 0)) > 0:
        names |= ALWAYS_AGGREGATED_FUNCTIONS
    return names


# Barriers carry no data and every rank calls them at the same points (start-up, the end,
# around checkpoints): synchronization, not what a rank does. In the signature they split
# replicas whenever a window edge falls between ranks' entries (decisions table,
# docs/detection.md: "barriers are not structure").
UNSTRUCTURAL_OPS = frozenset({"barrier", "monitored_barrier"})


def signature_of(functions: dict[str, FunctionAcc]) -> str:
    """Hash of the structural function set: dataloader/optimizer/forward/backward span names
    and collective op names (group ids left out, so data-parallel replicas match; barriers
    left out, see :data:`UNSTRUCTURAL_OPS`)."""
    names = {t for name, acc in functions.items() if (t := signature_token(name, acc.kind))}
    return hashlib.sha1("\n".join(sorted(names)).encode()).hexdigest()[:12]


def signature_token(name: str, kind: int) -> str:
    """What a function of ``name`` and ``kind`` adds to the window's signature ('' nothing)."""
    if name.startswith(COMM_PREFIX):
        return "" if comm_op(name) in UNSTRUCTURAL_OPS else COMM_PREFIX + comm_op(name)
    return name if kind in STRUCTURAL and not name.startswith(KIND_PREFIX) else ""


def window_fields(version: int, meta: RankMeta, window_id: int, window_s: float,
                   signature: str) -> RankWindowHeader:
    """The fields every record of a rank's window starts with."""
    return RankWindowHeader(
        schema_version=version, job=meta.job, window_id=int(window_id),
        window_start_ms=int(window_id * round(window_s * 1000)), window_s=float(window_s),
        rank=meta.rank, world_size=meta.world_size, host=meta.host, gpu=meta.gpu, signature=signature)


def rank_window_record(meta: RankMeta, window_id: int, window_s: float, signature: str, w: WindowAcc,
                       progress: RankProgress, health: RankHealth, functions: list[str], batches: int = 0,
                       ended: bool = False) -> RankWindow:
    """RankWindow for one closed window. ``functions``: the names of its functions' patterns,
    sorted (the per-kind aggregates left out); ``batches``: batches that arrived since the
    previous window closed (sign of life); ``ended``: the rank's last window (clean exit)."""
    return RankWindow(
        **window_fields(RANK_WINDOW_VERSION, meta, window_id, window_s, signature),
        functions=functions,
        # the window's own last step (the sink numbers step_time_ns back from it); sticky when idle
        steps=len(w.steps), last_step=int(max(w.steps) if w.steps else progress.last_step),
        step_time_ns=[int(x) for x in w.step_ns],
        last_event_ms=int(progress.last_event_ms), last_function=progress.last_function,
        pending_group=progress.pending_group, pending_seq=int(progress.pending_seq),
        pending_in_flight=bool(progress.pending_in_flight),
        dropped_events=int(health.dropped_events), lost_batches=int(health.lost_batches),
        bytes_received=int(health.bytes_received),
        **hardware_fields(w),
        batches=int(batches),
        **cpu_fields(w.cpu, len(w.steps)),
        ended_cleanly=bool(ended), restarts=int(health.restarts),
        mesh_coords={str(k): int(v) for k, v in meta.mesh_coords.items()}, gpu_uuid=meta.gpu_uuid,
        # the latest entries while a collective is pending: what the recorder said of the hang
        flight_records_json=json.dumps(meta.flight_records) if progress.pending_in_flight and meta.flight_records else "",
        **net_fields(w.net))
