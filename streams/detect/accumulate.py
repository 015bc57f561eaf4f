"""Per-window accumulators of one rank, and the records they close into.

A window holds, per function, the durations seen (ns, already net of the
collective time nested inside the span, measured on the rank's own clock), per
collective the (seq, time inside the call) pairs, the iterations that ended in
it, and the hardware samples taken in it. Closing turns it into one
FunctionPattern per function (exact p50/p90/p99 from the kept durations, plus the
mergeable log histogram) and one RankWindow.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ...schemas.vocabulary import FUNCTION_PATTERN_VERSION, RANK_WINDOW_VERSION, SpanKind
from .histogram import histogram
from .model import COMM_PREFIX, STRUCTURAL, comm_op, kind_function

ALWAYS_AGGREGATED = (SpanKind.DATALOADER, SpanKind.OPTIMIZER, SpanKind.FORWARD,
                     SpanKind.BACKWARD, SpanKind.GC)
MAX_DURATIONS_PER_FUNCTION = 200_000
# NVML throttle-reason bits that mean heat or power trouble (not the usual SW power cap)
THERMAL_POWER_BITS = 0x8 | 0x20 | 0x40 | 0x80


@dataclass
class FunctionAcc:
    """One function's durations (ns) in one window; collectives also keep seqs."""

    kind: int
    durations: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    seq_durs: list[int] = field(default_factory=list)
    group_ranks: list[int] = field(default_factory=list)
    bytes: int = 0
    overflow: int = 0


@dataclass
class WindowAcc:
    """Everything one rank saw in one window."""

    functions: dict[str, FunctionAcc] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)
    last_event_ms: int = 0
    hw: dict[str, list[float]] = field(default_factory=dict)
    throttle: int = 0

    def fn(self, name: str, kind: int) -> FunctionAcc:
        acc = self.functions.get(name)
        if acc is None:
            acc = self.functions[name] = FunctionAcc(kind)
        return acc

    def add_duration(self, name: str, kind: int, dur_ns: int) -> None:
        acc = self.fn(name, kind)
        if len(acc.durations) < MAX_DURATIONS_PER_FUNCTION:
            acc.durations.append(dur_ns)
        else:
            acc.overflow += 1


def signature_of(functions: dict[str, FunctionAcc]) -> str:
    """Hash of the structural function set: dataloader/optimizer/forward/backward span names
    and collective op names (group ids left out, so data-parallel replicas match)."""
    names = set()
    for name, acc in functions.items():
        if name.startswith(COMM_PREFIX):
            names.add(COMM_PREFIX + comm_op(name))
        elif acc.kind in STRUCTURAL and not name.startswith("kind:"):
            names.add(name)
    return hashlib.sha1("\n".join(sorted(names)).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class RankMeta:
    """Identity and sticky state copied into every record of a rank."""

    job: str
    rank: int
    world_size: int
    host: str
    gpu: int


def pattern_record(meta: RankMeta, window_id: int, window_s: float, signature: str,
                   name: str, acc: FunctionAcc, steps: int) -> dict:
    """FunctionPattern dict for one function of one closed window."""
    d = np.asarray(acc.durations if not acc.seqs else acc.seq_durs, dtype=np.int64)
    if acc.seqs:
        d = np.concatenate([d, np.asarray(acc.durations, dtype=np.int64)])
    q = np.percentile(d, [50, 90, 99]) if len(d) else np.zeros(3)
    return {
        "schema_version": FUNCTION_PATTERN_VERSION, "job": meta.job, "window_id": int(window_id),
        "window_start_ms": int(window_id * round(window_s * 1000)), "window_s": float(window_s),
        "rank": meta.rank, "world_size": meta.world_size, "host": meta.host, "gpu": meta.gpu,
        "signature": signature, "function": name, "kind": int(acc.kind), "steps": int(steps),
        "count": int(len(d) + acc.overflow), "total_ns": int(d.sum()),
        "p50_ns": int(q[0]), "p90_ns": int(q[1]), "p99_ns": int(q[2]),
        "max_ns": int(d.max()) if len(d) else 0, "hist": histogram(d),
        "group_ranks": list(acc.group_ranks), "bytes": int(acc.bytes),
        "seqs": list(acc.seqs), "seq_dur_ns": list(acc.seq_durs),
    }


def add_kind_aggregates(w: WindowAcc) -> None:
    """Add ``kind:<name>`` patterns (sum of that kind's spans) so every rank reports
    GC, data loading, forward, backward and optimizer time, even when it is zero."""
    totals: dict[int, list[int]] = {int(k): [] for k in ALWAYS_AGGREGATED}
    for name, acc in w.functions.items():
        if acc.kind in totals and not name.startswith(COMM_PREFIX):
            totals[acc.kind].extend(acc.durations)
    for kind, durs in totals.items():
        w.functions[kind_function(kind)] = FunctionAcc(kind, durations=durs)


def _mean(xs: list[float]) -> float:
    vals = [x for x in xs if x >= 0]
    return float(np.mean(vals)) if vals else -1.0


def _agg(xs: list[float], how: str) -> float:
    vals = [x for x in xs if x >= 0]
    if not vals:
        return -1.0
    return float(max(vals) if how == "max" else min(vals))


def rank_window_record(meta: RankMeta, window_id: int, window_s: float, signature: str,
                       w: WindowAcc, sticky: dict, health: dict, batches: int = 0) -> dict:
    """RankWindow dict for one closed window. ``sticky``: last_step, last_function,
    pending_group, pending_seq, last_event_ms; ``health``: dropped/lost/bytes counters;
    ``batches``: batches that arrived since the previous window closed (sign of life)."""
    hw = w.hw
    return {
        "schema_version": RANK_WINDOW_VERSION, "job": meta.job, "window_id": int(window_id),
        "window_start_ms": int(window_id * round(window_s * 1000)), "window_s": float(window_s),
        "rank": meta.rank, "world_size": meta.world_size, "host": meta.host, "gpu": meta.gpu,
        "signature": signature,
        "functions": sorted(n for n in w.functions if not n.startswith("kind:")),
        # the window's own last step (the sink numbers step_time_ns back from it); sticky when idle
        "steps": len(w.steps), "last_step": int(max(w.steps) if w.steps else sticky["last_step"]),
        "step_time_ns": [int(x) for x in w.step_ns],
        "last_event_ms": int(sticky["last_event_ms"]), "last_function": sticky["last_function"],
        "pending_group": sticky["pending_group"], "pending_seq": int(sticky["pending_seq"]),
        "dropped_events": int(health["dropped_events"]), "lost_batches": int(health["lost_batches"]),
        "bytes_received": int(health["bytes_received"]),
        "hw_samples": len(hw.get("sm_clock_mhz", [])),
        "sm_clock_mhz": _mean(hw.get("sm_clock_mhz", [])),
        "sm_clock_max_mhz": _agg(hw.get("sm_clock_max_mhz", []), "max"),
        "temp_c_max": _agg(hw.get("temp_c", []), "max"),
        "power_w_mean": _mean(hw.get("power_w", [])),
        "util_gpu_pct": _mean(hw.get("util_gpu_pct", [])),
        "throttle_reasons": int(w.throttle),
        "pcie_gen_min": int(_agg(hw.get("pcie_gen", []), "min")),
        "pcie_width_min": int(_agg(hw.get("pcie_width", []), "min")),
        "nvlink_errors": int(max(0.0, _agg(hw.get("nvlink_errors", []), "max"))),
        "ecc_uncorrected": int(max(0.0, _agg(hw.get("ecc_uncorrected", []), "max"))),
        "xid": int(max(0.0, _agg(hw.get("xid", []), "max"))),
        "batches": int(batches),
    }
