"""Per-window accumulators of one rank, and the rank's state that outlives a window.

A window holds, per function, the durations seen (ns, already net of the
collective time nested inside the span, measured on the rank's own clock), per
collective the (seq, time inside the call) pairs, the iterations that ended in
it, and the hardware samples taken in it. :mod:`.rank_records` closes it into
records. :class:`RankProgress` (where the rank last was) and :class:`RankHealth`
(what the transport lost) carry over from window to window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...schemas.vocabulary import SpanKind

if TYPE_CHECKING:
    from .window_columns import PendingCols

MAX_DURATIONS_PER_FUNCTION = 200_000
# HardwareBatch columns kept per window (RankWindow aggregates them)
HW_FIELDS = ("sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "power_w", "util_gpu_pct",
             "pcie_gen", "pcie_width", "nvlink_errors", "ecc_uncorrected", "xid")
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


CPU_SUMS = ("interval_ns", "thread_cpu_ns", "runqueue_wait_ns", "voluntary_switches",
            "involuntary_switches", "major_faults")


@dataclass
class KnownSums:
    """Per-field sums of samples' counters that keep only known (>= 0) values; ``known``
    counts, per field, the samples that had one."""

    sums: dict[str, int] = field(default_factory=dict)
    known: dict[str, int] = field(default_factory=dict)

    def add_known(self, s: dict, keys: tuple[str, ...]) -> None:
        for k in keys:
            v = int(s.get(k, -1))
            if v >= 0:
                self.sums[k] = self.sums.get(k, 0) + v
                self.known[k] = self.known.get(k, 0) + 1

    def total(self, k: str) -> int:
        """Sum of field ``k`` over the samples that knew it; -1 when none did."""
        return self.sums.get(k, 0) if self.known.get(k) else -1


@dataclass
class CpuAcc(KnownSums):
    """The training thread's CPU samples (EventBatch v3 ``cpu``) and stack rows of one window."""

    samples: int = 0
    load1: float = -1.0
    steal: list[float] = field(default_factory=list)
    stack_samples: int = 0
    stack_hz: float = 0.0
    frames: dict[tuple[str, int], int] = field(default_factory=dict)  # (frame text, kind) -> samples

    def add_sample(self, s: dict) -> None:
        self.samples += 1
        self.add_known(s, CPU_SUMS)
        self.load1 = max(self.load1, float(s.get("load1", -1.0)))
        if float(s.get("steal_pct", -1.0)) >= 0:
            self.steal.append(float(s["steal_pct"]))
        self.stack_samples += max(0, int(s.get("stack_samples", 0)))
        self.stack_hz = max(self.stack_hz, float(s.get("stack_hz", 0.0)))


NET_SUMS = ("interval_ns", "retrans_segs", "out_segs", "rx_bytes", "tx_bytes", "ib_xmit_wait", "ib_errors")


@dataclass
class NetAcc(KnownSums):
    """The rank's network samples (EventBatch v7 ``net``) of one window: counter sums over the
    samples that knew them, the local address, and per remote address the send-queue sizes
    of the samples that found its connections backlogged."""

    samples: int = 0
    addr: str = ""
    backlog: dict[str, list[int]] = field(default_factory=dict)  # remote -> bytes in each backlogged sample

    def add_sample(self, s: dict) -> None:
        self.samples += 1
        self.add_known(s, NET_SUMS)
        self.addr = str(s.get("local_addr") or "") or self.addr
        for row in s.get("backlog") or ():
            if int(row["bytes"]) > 0:
                self.backlog.setdefault(str(row["remote"]), []).append(int(row["bytes"]))


@dataclass
class WindowAcc:
    """Everything one rank saw in one window. Its functions' events come from the chunk fold as
    column slices (``pending``) and are grouped into ``accs`` by function when read
    (:mod:`.window_columns`)."""

    accs: dict[str, FunctionAcc] = field(default_factory=dict)
    pending: list[PendingCols] = field(default_factory=list)
    pending_events: int = 0
    steps: list[int] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)
    last_event_ms: int = 0
    hw: dict[str, list[float]] = field(default_factory=dict)
    throttle: int = 0
    cpu: CpuAcc = field(default_factory=CpuAcc)
    net: NetAcc = field(default_factory=NetAcc)

    @property
    def functions(self) -> dict[str, FunctionAcc]:
        """Each function's accumulator, the pending columns grouped in first."""
        if self.pending:
            from .window_columns import settle  # it builds FunctionAcc: imported when first needed
            settle([self])
        return self.accs

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

    def add_collective(self, name: str, seq: int, dur_ns: int, group_ranks: list[int], nbytes: float) -> None:
        """``group_ranks``: the group's ranks as ints, shared by the batch's calls (never mutated)."""
        acc = self.fn(name, int(SpanKind.COLLECTIVE))
        acc.seqs.append(seq)
        acc.seq_durs.append(dur_ns)
        acc.group_ranks = group_ranks
        acc.bytes += int(nbytes)

    def add_step(self, step: int, dur_ns: int) -> None:
        self.steps.append(step)
        self.step_ns.append(dur_ns)

    def add_hw_sample(self, hw: dict, i: int) -> None:
        """Sample ``i`` of a decoded HardwareBatch; throttle reasons are OR-ed together."""
        for f in HW_FIELDS:
            self.hw.setdefault(f, []).append(float(hw[f][i]))
        reasons = int(hw["throttle_reasons"][i])
        self.throttle |= reasons if reasons > 0 else 0


@dataclass(frozen=True)
class RankMeta:
    """Identity and sticky state copied into every record of a rank."""

    job: str
    rank: int
    world_size: int
    host: str
    gpu: int
    mesh_coords: dict[str, int] = field(default_factory=dict)  # DeviceMesh coordinates (EventBatch v5)
    gpu_uuid: str = ""  # NVML's name of the rank's GPU (EventBatch gpu_uuid)
    flight_records: list[dict] = field(default_factory=list)  # its latest Flight Recorder entries (EventBatch v6)
    functional_steps: int = 1  # functional collectives recorded one step in this many (EventBatch v8; step_gating)


@dataclass
class RankProgress:
    """Where the rank last was, across windows (for liveness and hang culprits): its latest
    step, its latest event and the function it was in, and the collective it last entered."""

    last_step: int = -1
    last_function: str = ""
    pending_group: str = ""
    pending_seq: int = -1
    pending_in_flight: bool = False  # entered pending_seq and not completed it (hang: a waiting rank)
    last_event_ms: int = 0

    def note_event(self, wall_ms: int, function: str) -> None:
        if wall_ms >= self.last_event_ms:
            self.last_event_ms = wall_ms
            self.last_function = function

    def note_entry(self, group: str, seq: int, wall_ms: int, in_flight: bool = False) -> None:
        """A collective call entered (``in_flight``: an entry marker) or completed: the latest
        one is the pending one; completing the pending call leaves it."""
        if group == self.pending_group and seq == self.pending_seq:
            self.pending_in_flight = in_flight and self.pending_in_flight
            return
        if group != self.pending_group or seq >= self.pending_seq:
            if wall_ms >= self.last_event_ms or seq > self.pending_seq:
                self.pending_group, self.pending_seq = group, seq
                self.pending_in_flight = in_flight

    def note_step(self, step: int) -> None:
        self.last_step = max(self.last_step, step)


@dataclass
class RankHealth:
    """Transport health of one rank: events its collector dropped, batches lost on the way."""

    dropped_events: int = 0
    lost_batches: int = 0
    bytes_received: int = 0
    restarts: int = 0  # new processes (pids) of the rank under the same job id
