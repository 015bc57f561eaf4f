"""Closing one rank's window into records: FunctionPattern per function, one RankWindow.

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

import numpy as np

from ...schemas.records import (
    FunctionPattern,
    RankCpu,
    RankHardware,
    RankNet,
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
from .accumulate import CpuAcc, FunctionAcc, NetAcc, RankHealth, RankMeta, RankProgress, WindowAcc
from .device_evidence import DEVICE_AGGREGATES, DEVICE_PREFIX, device_phase
from .histogram import grouped_histograms
from .model import COMM_PREFIX, KIND_PREFIX, STRUCTURAL, comm_op, kind_function
from .quantiles import grouped_percentiles
from .step_gating import recorded_steps

ALWAYS_AGGREGATED = (SpanKind.DATALOADER, SpanKind.OPTIMIZER, SpanKind.FORWARD,
                     SpanKind.BACKWARD, SpanKind.GC)


def close_window(meta: RankMeta, window_id: int, window_s: float, w: WindowAcc, progress: RankProgress,
                 health: RankHealth, batches: int, ended: bool = False) -> list[tuple[str, FunctionPattern | RankWindow]]:
    """One closed window -> [("FunctionPattern", rec), ..., ("RankWindow", rec)], functions sorted.
    ``ended``: the rank's last window (its collector's final batch came): the RankWindow says so."""
    sig = signature_of(w.functions)
    steps = len(w.steps)
    if w.functions or steps:
        add_kind_aggregates(w)
    # a rank gated to one step in n (step_gating) has its functions' times of the recorded steps only
    per = recorded_steps(w.steps, meta.functional_steps)
    out: list[tuple[str, FunctionPattern | RankWindow]] = [
        (FUNCTION_PATTERN, p) for p in pattern_records(meta, window_id, window_s, sig, sorted(w.functions.items()), per)]
    out.append((RANK_WINDOW, rank_window_record(meta, window_id, window_s, sig, w, progress, health,
                                                 batches=batches, ended=ended)))
    return out


def pattern_functions(rw: RankWindow) -> set[str]:
    """Names of the FunctionPatterns :func:`close_window` sent before ``rw`` (same window, same
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


def pattern_records(meta: RankMeta, window_id: int, window_s: float, signature: str,
                    functions: list[tuple[str, FunctionAcc]], steps: int) -> list[FunctionPattern]:
    """FunctionPattern of each function of one closed window (collectives: their per-seq durations
    first), computed together: one sort of every duration of the window by (function, value)
    gives each function's count, total, max and exact p50/p90/p99 (:func:`.quantiles.grouped_percentiles`),
    one bincount its histogram -- the numbers of one ``percentiles``/``histogram`` call per
    function (tests/unit/streams/detect/test_quantiles.py)."""
    values: list[int] = []
    lengths: list[int] = []
    for _, acc in functions:
        before = len(values)
        if acc.seqs:
            values += acc.seq_durs
        values += acc.durations
        lengths.append(len(values) - before)
    counts = np.asarray(lengths, np.int64)
    d = np.asarray(values, dtype=np.int64)
    group = np.repeat(np.arange(len(functions)), counts)
    s = d[np.lexsort((d, group))]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(s)])
    totals = (cum[starts + counts] - cum[starts]).tolist()
    maxima = (np.where(counts > 0, s[np.maximum(starts + counts - 1, 0)], 0) if len(s)
              else np.zeros(len(counts), np.int64)).tolist()
    q = grouped_percentiles(s, starts, counts).tolist()
    hists = grouped_histograms(s, starts, counts)
    header = _window_fields(FUNCTION_PATTERN_VERSION, meta, window_id, window_s, signature)
    mesh = {str(k): int(v) for k, v in meta.mesh_coords.items()}
    return [FunctionPattern(
        **header, function=name, kind=int(acc.kind), steps=int(steps),
        count=int(n + acc.overflow), total_ns=int(total),
        p50_ns=int(p50), p90_ns=int(p90), p99_ns=int(p99), max_ns=int(top), hist=hist,
        group_ranks=list(acc.group_ranks), bytes=int(acc.bytes),
        seqs=acc.seqs, seq_dur_ns=acc.seq_durs, mesh_coords=dict(mesh))  # the closed window's own lists
        for (name, acc), n, total, p50, p90, p99, top, hist
        in zip(functions, lengths, totals, q[0], q[1], q[2], maxima, hists, strict=True)]


def _mean(xs: list[float]) -> float:
    vals = [x for x in xs if x >= 0]
    return float(np.mean(vals)) if vals else -1.0


def _agg(xs: list[float], how: str) -> float:
    vals = [x for x in xs if x >= 0]
    if not vals:
        return -1.0
    return float(max(vals) if how == "max" else min(vals))


def _hardware_fields(w: WindowAcc) -> RankHardware:
    """The window's hardware samples reduced; -1 (or 0 for counters) when none were taken."""
    hw = w.hw
    return RankHardware(
        hw_samples=len(hw.get("sm_clock_mhz", [])),
        sm_clock_mhz=_mean(hw.get("sm_clock_mhz", [])),
        sm_clock_max_mhz=_agg(hw.get("sm_clock_max_mhz", []), "max"),
        temp_c_max=_agg(hw.get("temp_c", []), "max"),
        power_w_mean=_mean(hw.get("power_w", [])),
        util_gpu_pct=_mean(hw.get("util_gpu_pct", [])),
        throttle_reasons=int(w.throttle),
        pcie_gen_min=int(_agg(hw.get("pcie_gen", []), "min")),
        pcie_width_min=int(_agg(hw.get("pcie_width", []), "min")),
        nvlink_errors=int(max(0.0, _agg(hw.get("nvlink_errors", []), "max"))),
        ecc_uncorrected=int(max(0.0, _agg(hw.get("ecc_uncorrected", []), "max"))),
        xid=int(max(0.0, _agg(hw.get("xid", []), "max"))))


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
        **_hardware_fields(w),
        batches=int(batches),
        **cpu_fields(w.cpu, len(w.steps)),
        ended_cleanly=bool(ended), restarts=int(health.restarts),
        mesh_coords={str(k): int(v) for k, v in meta.mesh_coords.items()}, gpu_uuid=meta.gpu_uuid,
        # the latest entries while a collective is pending: what the recorder said of the hang
        flight_records_json=json.dumps(meta.flight_records) if progress.pending_in_flight and meta.flight_records else "",
        **net_fields(w.net))


TOP_FRAMES = 8  # per kind


def _per_step(total: int, steps: int) -> float:
    return round(total / steps, 4) if total >= 0 and steps > 0 else -1.0


def cpu_fields(cpu: CpuAcc, steps: int) -> RankCpu:
    """The window's CPU evidence: ratios and per-step rates (-1 unknown), top frames per kind."""
    wall, busy = cpu.total("interval_ns"), cpu.total("thread_cpu_ns")
    wait = cpu.total("runqueue_wait_ns")
    top = sorted(cpu.frames.items(), key=lambda kv: (-kv[0][1], -kv[1], kv[0][0]))
    frames = [kv for kind in (1, 0) for kv in [x for x in top if x[0][1] == kind][:TOP_FRAMES]]
    return RankCpu(
        cpu_samples=cpu.samples,
        cpu_ratio=round(busy / wall, 4) if busy >= 0 and wall > 0 else -1.0,
        runqueue_wait_ms_per_step=_per_step(wait, steps) / 1e6 if wait >= 0 and steps > 0 else -1.0,
        involuntary_switches_per_step=_per_step(cpu.total("involuntary_switches"), steps),
        voluntary_switches_per_step=_per_step(cpu.total("voluntary_switches"), steps),
        major_faults=cpu.total("major_faults"), load1=cpu.load1,
        steal_pct=round(float(np.mean(cpu.steal)), 3) if cpu.steal else -1.0,
        stack_samples=cpu.stack_samples, stack_hz=cpu.stack_hz,
        top_frames=[k[0] for k, _ in frames], top_frame_samples=[n for _, n in frames],
        top_frame_kinds=[k[1] for k, _ in frames])


def net_fields(net: NetAcc) -> RankNet:
    """The window's network evidence (RankWindow v6 ``net_*``, ``ib_*``; -1 unknown): the host's
    retransmit share and throughput, and per remote address the unsent bytes of each sample
    that found the rank's connections to it non-empty."""
    wall_s = net.total("interval_ns") / 1e9
    sent, retrans = net.total("out_segs"), net.total("retrans_segs")

    def rate(key: str, scale: float) -> float:
        v = net.total(key)
        return round(v / scale / wall_s, 4) if v >= 0 and wall_s > 0 else -1.0

    backlog = dict(sorted(net.backlog.items()))
    return RankNet(net_samples=net.samples, net_addr=net.addr,
                   net_retrans_pct=round(100.0 * retrans / sent, 4) if sent > 0 and retrans >= 0 else -1.0,
                   net_tx_mb_per_s=rate("tx_bytes", 1e6), net_rx_mb_per_s=rate("rx_bytes", 1e6),
                   net_backlog_json=json.dumps(backlog) if backlog else "",
                   ib_xmit_wait_per_s=rate("ib_xmit_wait", 1.0), ib_errors=net.total("ib_errors"))
