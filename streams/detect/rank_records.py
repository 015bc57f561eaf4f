"""Closing a rank's window into records: FunctionPattern per function, one RankWindow.

Each function's pattern carries exact p50/p90/p99 from the kept durations plus the
mergeable log histogram (collectives: their per-seq durations first). Before closing,
``kind:<name>`` aggregates are added so every rank reports GC, data loading, forward,
backward and optimizer time, even when it is zero. The RankWindow carries the window's
steps, the rank's progress and health, and the hardware samples reduced (means; max for
temperature, errors and clock limit; min for PCIe generation and width).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...schemas.records import (
    FunctionPattern,
    RankWindow,
    RankWindowHeader,
)
from ...schemas.vocabulary import (
    FUNCTION_PATTERN,
    FUNCTION_PATTERN_VERSION,
    RANK_WINDOW,
    RANK_WINDOW_VERSION,
    SpanKind,
)
from .accumulate import FunctionAcc, RankHealth, RankMeta, RankProgress, WindowAcc
from .device_evidence import DEVICE_AGGREGATES, DEVICE_PREFIX, device_phase
from .histogram import grouped_histograms
from .model import COMM_PREFIX, KIND_PREFIX, STRUCTURAL, comm_op, kind_function
from .quantiles import grouped_percentiles
from .step_gating import recorded_steps
from .window_evidence import cpu_fields, hardware_fields, net_fields

ALWAYS_AGGREGATED = (SpanKind.DATALOADER, SpanKind.OPTIMIZER, SpanKind.FORWARD,
                     SpanKind.BACKWARD, SpanKind.GC)


@dataclass(frozen=True)
class Closing:
    """One closed window of one rank, waiting for its records (:func:`close_windows`). ``ended``:
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


def close_windows(closing: Sequence[Closing]) -> list[Routed]:
    """Each closed window's records, in order: [("FunctionPattern", rec), ..., ("RankWindow", rec)],
    its functions sorted, with the patterns of every window computed together
    (:func:`pattern_records`): a timer tick closes one window of each of a job's ranks, and the
    numpy calls then run once for all of them instead of once per rank."""
    parts: list[PatternSource] = []
    signatures: list[str] = []
    for c in closing:
        w = c.w
        sig = signature_of(w.functions)
        if w.functions or w.steps:
            add_kind_aggregates(w)
        # a rank gated to one step in n (step_gating) has its functions' times of the recorded steps only
        per = recorded_steps(w.steps, c.meta.functional_steps)
        parts.append(PatternSource(c.meta, c.window_id, c.window_s, sig, sorted(w.functions.items()), per))
        signatures.append(sig)
    out: list[Routed] = []
    for c, sig, patterns in zip(closing, signatures, pattern_records(parts), strict=True):
        out += [(FUNCTION_PATTERN, p) for p in patterns]
        out.append((RANK_WINDOW, rank_window_record(c.meta, c.window_id, c.window_s, sig, c.w, c.progress,
                                                     c.health, batches=c.batches, ended=c.ended)))
    return out


def pattern_functions(rw: RankWindow) -> set[str]:
    """Names of the FunctionPatterns :func:`close_windows` sent before ``rw`` (same window, same
    rank): its functions, plus the per-kind aggregates when it had any function or step."""
    names = {str(n) for n in rw.get("functions", [])}
    if names or int(rw.get("steps", 0)) > 0:
        names.update(kind_function(k) for k in ALWAYS_AGGREGATED)
    if any(n.startswith(DEVICE_PREFIX) for n in names):
        names.update(DEVICE_AGGREGATES.values())
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
    names = set()
    for name, acc in functions.items():
        if name.startswith(COMM_PREFIX):
            if comm_op(name) not in UNSTRUCTURAL_OPS:
                names.add(COMM_PREFIX + comm_op(name))
        elif acc.kind in STRUCTURAL and not name.startswith(KIND_PREFIX):
            names.add(name)
    return hashlib.sha1("\n".join(sorted(names)).encode()).hexdigest()[:12]


def add_kind_aggregates(w: WindowAcc) -> None:
    """Add ``kind:<name>`` patterns (sum of that kind's spans) so every rank reports
    GC, data loading, forward, backward and optimizer time, even when it is zero, and, on a
    rank with device spans, their sums per phase (:data:`.device_evidence.DEVICE_AGGREGATES`)."""
    totals: dict[int, list[int]] = {int(k): [] for k in ALWAYS_AGGREGATED}
    device: dict[int, list[int]] | None = None
    for name, acc in w.functions.items():
        if acc.kind in totals and not name.startswith(COMM_PREFIX):
            totals[acc.kind].extend(acc.durations)
        elif acc.kind == SpanKind.DEVICE and name.startswith(DEVICE_PREFIX):
            device = device if device is not None else {k: [] for k in DEVICE_AGGREGATES}
            phase = device_phase(name)
            if phase in device:
                device[phase].extend(acc.durations)
    for kind, durs in totals.items():
        w.functions[kind_function(kind)] = FunctionAcc(kind, durations=durs)
    for phase, durs in (device or {}).items():  # a GPU rank's device time per phase
        w.functions[DEVICE_AGGREGATES[phase]] = FunctionAcc(int(SpanKind.DEVICE), durations=durs)


def _window_fields(version: int, meta: RankMeta, window_id: int, window_s: float,
                   signature: str) -> RankWindowHeader:
    """The fields every record of a rank's window starts with."""
    return RankWindowHeader(
        schema_version=version, job=meta.job, window_id=int(window_id),
        window_start_ms=int(window_id * round(window_s * 1000)), window_s=float(window_s),
        rank=meta.rank, world_size=meta.world_size, host=meta.host, gpu=meta.gpu, signature=signature)


class PatternSource(NamedTuple):
    """What one window's FunctionPatterns are made of: its rank, window, signature, functions
    (sorted) and the steps its per-step figures divide by."""

    meta: RankMeta
    window_id: int
    window_s: float
    signature: str
    functions: list[tuple[str, FunctionAcc]]
    steps: int


def pattern_records(sources: Sequence[PatternSource]) -> list[list[FunctionPattern]]:
    """FunctionPattern of each function of each window (collectives: their per-seq durations
    first), computed together: one sort of every duration of every window by (function, value)
    gives each function's count, total, max and exact p50/p90/p99 (:func:`.quantiles.grouped_percentiles`),
    one bincount its histogram -- the numbers of one ``percentiles``/``histogram`` call per
    function (tests/unit/streams/detect/test_quantiles.py)."""
    values: list[int] = []
    lengths: list[int] = []
    for src in sources:
        for _, acc in src.functions:
            before = len(values)
            if acc.seqs:
                values += acc.seq_durs
            values += acc.durations
            lengths.append(len(values) - before)
    counts = np.asarray(lengths, np.int64)
    d = np.asarray(values, dtype=np.int64)
    group = np.repeat(np.arange(len(lengths)), counts)
    s = d[np.lexsort((d, group))]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(s)])
    totals = (cum[starts + counts] - cum[starts]).tolist()
    maxima = (np.where(counts > 0, s[np.maximum(starts + counts - 1, 0)], 0) if len(s)
              else np.zeros(len(counts), np.int64)).tolist()
    q = grouped_percentiles(s, starts, counts).tolist()
    hists = grouped_histograms(s, starts, counts)
    out: list[list[FunctionPattern]] = []
    k = 0
    for src in sources:
        header = _window_fields(FUNCTION_PATTERN_VERSION, src.meta, src.window_id, src.window_s, src.signature)
        mesh = {str(key): int(v) for key, v in src.meta.mesh_coords.items()}
        steps = int(src.steps)
        z = k + len(src.functions)
        out.append([FunctionPattern(
            **header, function=name, kind=int(acc.kind), steps=steps,
            count=int(n + acc.overflow), total_ns=int(total),
            p50_ns=int(p50), p90_ns=int(p90), p99_ns=int(p99), max_ns=int(top), hist=hist,
            group_ranks=list(acc.group_ranks), bytes=int(acc.bytes),
            seqs=acc.seqs, seq_dur_ns=acc.seq_durs, mesh_coords=dict(mesh))  # the closed window's own lists
            for (name, acc), n, total, p50, p90, p99, top, hist
            in zip(src.functions, lengths[k:z], totals[k:z], q[0][k:z], q[1][k:z], q[2][k:z], maxima[k:z],
                   hists[k:z], strict=True)])
        k = z
    return out


def rank_window_record(meta: RankMeta, window_id: int, window_s: float, signature: str, w: WindowAcc,
                       progress: RankProgress, health: RankHealth, batches: int = 0,
                       ended: bool = False) -> RankWindow:
    """RankWindow for one closed window. ``batches``: batches that arrived since the
    previous window closed (sign of life); ``ended``: the rank's last window (clean exit)."""
    return RankWindow(
        **_window_fields(RANK_WINDOW_VERSION, meta, window_id, window_s, signature),
        functions=sorted(n for n in w.functions if not n.startswith(KIND_PREFIX)),
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
