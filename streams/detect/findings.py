"""Findings (frozen) and the rules that turn a rank's abnormal functions into a cause.

Cause rules for a rank whose own (non-collective) functions exceed its peers:
  * more calls per step than peers at the same per-call time, explaining >= explains_share
    of the largest excess                                 -> data_imbalance (work, not a fault)
  * GPU-side evidence (:mod:`.device_evidence`: device time of its phases beyond what its
    host time explains, >= explains_share of any non-compute excess): with NVML heat/power/
    clock evidence -> gpu_throttle, else                   -> slow_gpu
  * only GC spans, or GC excess >= explains_share of the largest other -> gc_pause
  * only data-loader spans                                -> slow_dataloader
  * only Python / user spans                              -> slow_function
  * the rank waited for a CPU more than its peers (``cpu`` = contended, scheduler evidence
    from :mod:`.cpu_evidence`), unless only compute spans are slow on a GPU with throttle
    evidence                                              -> host_cpu_contention
  * compute spans on a GPU with NVML throttle evidence    -> gpu_throttle
  * anything else (several phases, one phase, compute on a GPU with no device timing)
                                                          -> slow_function, naming the evidence
    that would have told more (:func:`missing_evidence`): never slow_gpu from the shape of
    host spans alone, never host_cpu_contention without scheduler evidence
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...schemas.causes import Cause
from ...schemas.vocabulary import Kind, SpanKind
from .accumulate import THERMAL_POWER_BITS
from .cpu_evidence import CONTENDED, UNAVAILABLE
from .device_evidence import gpu_side, is_device
from .facts import Outlier
from .model import KIND_PREFIX
from .peers import INF_RATIO
from .policy import DetectionPolicy

COMPUTE = frozenset({SpanKind.OPTIMIZER, SpanKind.FORWARD, SpanKind.BACKWARD, SpanKind.OP_SUMMARY})
CPU_ONLY = frozenset({SpanKind.PYTHON, SpanKind.DATALOADER, SpanKind.USER})


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One root-cause candidate of one window. ``identity`` keys persistence.
    Built with keywords only: several fields share a type, positions would be easy to swap."""

    kind: Kind
    cause: Cause
    identity: str
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    gpus: tuple[int, ...]
    function: str
    score: float
    impact_ms: float
    summary: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    immediate: bool = False  # raise without waiting for persistence (hang)
    extra_windows: int = 0  # persist this many windows longer (intermittent slowdowns)
    # how the summary is rendered last (:func:`.render.rendered`): the words naming its one rank
    # that open ``summary`` ("rank 3"; "" when it opens otherwise), the rank's mesh coordinates
    # and, for a GPU cause, its GPU ("GPU 1 GPU-... on node-2"; "" when none)
    subject: str = ""
    mesh_coords: Mapping[str, int] = field(default_factory=dict)
    gpu_label: str = ""
    # what the later steps of the rule that wrote ``summary`` know of it, rendered after its words
    # (:func:`words_of`), never appended to them: how the rank's slowdown runs (a key of
    # :data:`ONSET_WORDS`), what its cause rests on (its CPU verdict's note, said in brackets) and
    # the sampled frame its extra time goes to (rank, extra ms/step, frame)
    onset: str = ""
    cpu_note: str = ""
    hot_frame: tuple[int, float, str] | None = None


INTERMITTENT, IN_WINDOW = "intermittent", "in_window"
ONSET_WORDS = {INTERMITTENT: "intermittent: the slow tail, not every call",
               IN_WINDOW: "began inside this window: every step of the rank since is slower"}


def words_of(f: Finding) -> str:
    """The words of ``f``: its rule's ``summary``, then its onset, CPU note and hot frame (where
    it is, its mesh coordinates and GPU, is added last: :mod:`.render`)."""
    text = f.summary + (f" ({ONSET_WORDS[f.onset]})" if f.onset else "") + (f" [{f.cpu_note}]" if f.cpu_note else "")
    if f.hot_frame is not None:
        rank, extra, frame = f.hot_frame
        text += f" - rank {rank} spends {extra:.1f} ms/step more than its peers in {frame}"
    return text


def throttle_evidence(rw: Mapping[str, Any] | None, peer_clock_mhz: float, clock_ratio: float,
                      hot_temp_c: float) -> dict[str, Any]:
    """Hardware readings that show a throttled GPU; empty when there are none."""
    if not rw or rw.get("hw_samples", 0) <= 0:
        return {}
    ev: dict[str, Any] = {}
    clock, cmax = float(rw.get("sm_clock_mhz", -1)), float(rw.get("sm_clock_max_mhz", -1))
    if clock > 0 and cmax > 0 and clock < clock_ratio * cmax:
        ev["sm_clock_mhz"], ev["sm_clock_max_mhz"] = round(clock), round(cmax)
    if clock > 0 and peer_clock_mhz > 0 and clock < clock_ratio * peer_clock_mhz:
        ev["sm_clock_mhz"], ev["peer_sm_clock_mhz"] = round(clock), round(peer_clock_mhz)
    reasons = int(rw.get("throttle_reasons", 0))
    if reasons & THERMAL_POWER_BITS:
        ev["throttle_reasons"] = hex(reasons)
    if float(rw.get("temp_c_max", -1)) >= hot_temp_c:
        ev["temp_c_max"] = float(rw["temp_c_max"])
    if ev:
        ev["power_w_mean"] = float(rw.get("power_w_mean", -1))
    return ev


def fault_evidence(rw: Mapping[str, Any] | None, rank_windows: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """NVML's signs of a failing GPU on this rank: uncorrected ECC errors above its peers' (a
    running count), an Xid error reported; empty when there are none. They say why a GPU is
    slow (a hardware fault to drain the node for), not that it is: the slowness itself needs
    device times (:mod:`.device_evidence`)."""
    if not rw or rw.get("hw_samples", 0) <= 0:
        return {}
    ev: dict[str, Any] = {}
    ecc = int(rw.get("ecc_uncorrected", 0) or 0)
    peers = [int(p.get("ecc_uncorrected", 0) or 0) for p in rank_windows.values() if p is not rw
             and p.get("hw_samples", 0) > 0]
    if ecc > 0 and ecc > (max(peers) if peers else 0):
        ev["ecc_uncorrected"] = ecc
    if int(rw.get("xid", 0) or 0) > 0:
        ev["xid"] = int(rw["xid"])
    return ev


def fault_words(ev: Mapping[str, Any]) -> str:
    """' (NVML: 3 uncorrected ECC errors, Xid 79)' for :func:`fault_evidence`'s readings, else ''."""
    parts = ([f"{ev['ecc_uncorrected']} uncorrected ECC errors"] if "ecc_uncorrected" in ev else []) + \
        ([f"Xid {ev['xid']}"] if "xid" in ev else [])
    return f" (NVML: {', '.join(parts)})" if parts else ""


def classify(outliers: list[Outlier], gpu: int, hw_evidence: Mapping[str, Any], policy: DetectionPolicy,
             cpu: str = UNAVAILABLE) -> Cause:
    """Cause of a rank's outliers (:class:`.facts.Outlier`); ``cpu``: the
    rank's :func:`.cpu_evidence.cpu_verdict` (contended, not_contended, unavailable)."""
    if more_work(outliers, policy.min_excess, policy.explains_share):
        return Cause.DATA_IMBALANCE
    host = [o for o in outliers if not is_device(o)]
    side = gpu_side(outliers, policy.min_cost_ms_per_step, policy.explains_share)
    if side is not None:
        other = max((o.cost_ms_per_step for o in host if o.kind not in COMPUTE), default=0.0)
        if side.device_only_ms >= policy.explains_share * other:
            # its GPU runs its phases longer than its host explains: device evidence
            return Cause.GPU_THROTTLE if hw_evidence else Cause.SLOW_GPU
    kinds = {SpanKind(o.kind) for o in host if o.kind in SpanKind._value2member_map_}
    if not kinds:  # device phases slow alike with the host's: no side to name
        return Cause.SLOW_FUNCTION
    # per kind, the largest excess (a named span and its kind: aggregate are the same time)
    cost = {k: max(o.cost_ms_per_step for o in host if o.kind == k) for k in kinds}
    others = max((c for k, c in cost.items() if k != SpanKind.GC), default=0.0)
    if SpanKind.GC in cost and cost[SpanKind.GC] >= policy.explains_share * others:
        return Cause.GC_PAUSE  # GC pauses nest inside other spans and inflate them
    kinds.discard(SpanKind.GC)
    if kinds <= {SpanKind.DATALOADER}:
        return Cause.SLOW_DATALOADER
    if kinds <= {SpanKind.PYTHON, SpanKind.USER}:
        return Cause.SLOW_FUNCTION
    if cpu == CONTENDED and (gpu < 0 or kinds & CPU_ONLY or not hw_evidence):
        # scheduler evidence: it waited for a CPU more than its peers (on a GPU rank, its launch
        # thread was starved; a throttled GPU's own evidence wins when its spans are all compute)
        return Cause.HOST_CPU_CONTENTION
    if gpu >= 0 and hw_evidence and not kinds & CPU_ONLY:
        return Cause.GPU_THROTTLE  # NVML's clocks, heat or throttle reasons: hardware evidence
    # slow phases with no evidence of where: the code is slow (the finding says what is missing)
    return Cause.SLOW_FUNCTION


def missing_evidence(outliers: list[Outlier], gpu: int, cause: Cause, cpu: str) -> list[str]:
    """What would have told a cause apart, and was not there (said in the finding)."""
    missing = []
    kinds = {int(o.kind) for o in outliers}
    if cause == Cause.SLOW_FUNCTION and gpu >= 0 and kinds & {int(k) for k in COMPUTE} \
            and not any(is_device(o) for o in outliers):
        missing.append("GPU-side timing (CUDA-event or kernel times) to tell its GPU from its host")
    if cause == Cause.SLOW_FUNCTION and cpu == UNAVAILABLE and len(kinds & {int(k) for k in COMPUTE | CPU_ONLY}) >= 2:
        missing.append("scheduler evidence (run-queue wait) to tell a starved CPU from slow code")
    return missing


def more_work(outliers: list[Outlier], min_excess: float, explains_share: float) -> bool:
    """Data/MoE imbalance: a function called more often per step than on peers at the same
    per-call time explains (>= ``explains_share`` of) the rank's largest excess. GC excluded."""
    work = [o for o in outliers if o.kind != SpanKind.GC and finite_ratio(o.calls_ratio)
            and o.calls_ratio >= 1 + min_excess / 2 and o.per_call_ratio < 1 + min_excess]
    if not work:
        return False
    top = max(o.cost_ms_per_step for o in outliers)
    return max(o.cost_ms_per_step for o in work) >= explains_share * top


def finite_ratio(ratio: float) -> bool:
    """False for :data:`.peers.INF_RATIO` (peers make no calls, or spend no time, at all); a
    tenth of it is a safe margin below the sentinel and far above any real ratio."""
    return ratio < INF_RATIO / 10


CAUSE_KINDS = {Cause.GC_PAUSE: SpanKind.GC, Cause.SLOW_DATALOADER: SpanKind.DATALOADER,
               Cause.SLOW_GPU: SpanKind.DEVICE, Cause.GPU_THROTTLE: SpanKind.DEVICE}


def top_function(outliers: list[Outlier], cause: Cause | None = None) -> Outlier:
    """The most specific costly outlier: of the cause's own kind when it has one (GC for
    gc_pause), and a named function rather than a ``kind:`` aggregate."""
    if cause == Cause.DATA_IMBALANCE:  # the function doing the extra calls
        return max(outliers, key=lambda o: (o.calls_ratio if finite_ratio(o.calls_ratio) else 0.0,
                                            o.cost_ms_per_step))
    own_kind = CAUSE_KINDS.get(cause) if cause is not None else None
    pool = [o for o in outliers if o.kind == own_kind] or outliers
    named = [o for o in pool if not o.function.startswith(KIND_PREFIX)]
    return max(named or pool, key=lambda o: o.cost_ms_per_step)


def rank_impact(outliers: list[Outlier]) -> float:
    """Step time recovered (ms) if the rank were as fast as its peers: the summed excess of
    the disjoint per-kind aggregates (:func:`phase_sum`; GC nests inside them, so it counts as
    an alternative, not an addition), or the largest named function when no aggregate flagged."""
    gc = max((o.cost_ms_per_step for o in outliers
              if o.function.startswith(KIND_PREFIX) and o.kind == SpanKind.GC), default=0.0)
    named = max((o.cost_ms_per_step for o in outliers), default=0.0)
    return float(max(phase_sum(outliers), gc, named))


def phase_sum(outliers: list[Outlier]) -> float:
    """The excess of the rank's disjoint phases (the per-kind aggregates, GC left out): the host's
    phases, or their device times (the same steps seen from the GPU, never added to the host's),
    whichever is larger."""
    agg = [o for o in outliers if o.function.startswith(KIND_PREFIX) and o.kind != SpanKind.GC]
    host = sum(o.cost_ms_per_step for o in agg if not is_device(o))
    device = sum(o.cost_ms_per_step for o in agg if is_device(o))
    return float(max(host, device))


def phase_of(outlier: Outlier) -> str:
    """The phase an outlier belongs to in plain words: 'optimizer step', 'backward', ..."""
    try:
        kind = SpanKind(outlier.kind)
    except ValueError:
        return "function"
    return PHASES.get(kind, "function")


PHASES = {SpanKind.OPTIMIZER: "optimizer step", SpanKind.BACKWARD: "backward", SpanKind.FORWARD: "forward",
          SpanKind.DATALOADER: "data loading", SpanKind.GC: "garbage collection"}


def kind_of(k: str) -> Kind:
    return Kind(k)
