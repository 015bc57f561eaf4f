"""Late entries: a rank last into a collective with none of its own functions slow enough to
explain it, named for where its extra time goes (:func:`late_entries`).

Evidence: the late arrivals left after victims and explained ranks are taken out, the rank's
sampled user-code frames against its peers' (:func:`.cpu_evidence.frame_location`), its
scheduler evidence of waiting for a CPU (:func:`.cpu_evidence.cpu_verdict`), and for a GPU
rank its device times and GPU hardware readings.

CPU rank (gloo on CPU tensors): timed on the host alone, so its stack samples can clear a
late entry: samples alike its peers' and no wait for a CPU leave nothing behind it but
scheduling skew. A rank that waited for a CPU more than its peers is its host's CPU
contention. GPU/NCCL rank: its phases and collectives are timed on its device; a GPU that is
behind shows as device time beyond what its host explains (slow GPU, or GPU throttle with
clock or temperature evidence), while its CPU thread waits at the same line as its peers',
so its samples never clear it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...schemas.causes import CAUSES, Cause
from ...schemas.records import RankWindow
from ...schemas.vocabulary import Kind
from .cpu_evidence import CONTENDED, WHERE_KIND, cpu_verdict, frame_location
from .decisions import Clearance
from .device_evidence import DEVICE_PREFIX, gpu_side, is_device
from .facts import LateArrivals, Outlier, Outliers
from .findings import Finding, fault_evidence, fault_words, rank_impact, throttle_evidence
from .policy import DetectionPolicy
from .rank_cpu import late_entry_words
from .rank_findings import hw_peer_clock

# A late entry (a rank last into a collective, none of its own functions slow) is inferred
# from the order of arrivals alone. On a busy host runs of one rank arriving last fill a
# window now and then, while a real late arriver is late in every window after its onset
# (decisions table, docs/detection.md: "late entries persist two windows"). So a late entry
# opens only after two consecutive windows, however
# many steps one window holds (``persist_steps``), like an intermittent slowdown. A
# one-window analysis (trace import, ``persist_windows`` 1) is unchanged. The extra windows:
# ``late_entry_extra_windows``.


def late_entries(stragglers: LateArrivals, victims: set[int], explained: set[int],
                 rank_windows: dict[int, RankWindow], policy: DetectionPolicy,
                 partial: Outliers | None = None) -> tuple[list[Finding], list[Clearance]]:
    """Stragglers not explained by abnormal functions of their own and not held up elsewhere;
    the sampled frame where the straggler's extra time goes, when its collector samples stacks.
    ``partial``: late arrivers whose outliers explain only a small part of their delay
    (:func:`.stragglers.late_beyond_outliers`), named in the summary and the evidence.
    Also returned: the late arrivers cleared here, with why."""
    partial = partial or {}
    out = []
    cleared = []
    for rank, late in stragglers.items():
        if rank in victims or rank in explained:
            continue
        top = max(late, key=lambda s: s.caused_ms_per_step)
        impact = float(top.caused_ms_per_step)
        where = frame_location(rank, rank_windows, policy)
        cpu = cpu_verdict(rank, rank_windows, impact, policy)
        own = partial.get(rank, [])
        if not own and not where and cpu.verdict != CONTENDED and _sampled_alike(rank, rank_windows):
            # its stacks and its CPU say it did nothing its peers did not: not shown late
            cleared.append(Clearance(rank, "", (
                "its stack samples are alike its peers' and it waited for a CPU no more than they did: "
                "nothing behind its late arrival but scheduling skew"),
                {"group": top.function, "late_fraction": round(float(top.late_fraction), 3),
                 "cpu": cpu.verdict}))
            continue
        head = (f"rank {rank} on {top.host} enters {top.function} late in "
                f"{top.late_fraction:.0%} of calls; the others wait ~{impact:.1f} ms per step for it; ")
        summary = head + f"{_instrumented_share(own)}, so "
        evidence = {"late_seqs": top.late_seqs, "late_fraction": round(top.late_fraction, 3),
                    "caused_ms_per_step": round(impact, 3), "p_value": top.p_value,
                    "groups": sorted(s.function for s in late), "location": where,
                    "cpu": {str(rank): {"verdict": cpu.verdict, **cpu.evidence}}}
        if own:
            evidence["abnormal_functions"] = sorted({o.function for o in own})
            evidence["explained_ms_per_step"] = round(rank_impact(own), 3)
        cause, identity = Cause.SLOW_FUNCTION, f"late|{rank}"
        side = gpu_side(own, policy.min_cost_ms_per_step, policy.explains_share)
        if side is not None:
            # its GPU is behind: the device time of its phases grew beyond what its host explains
            rw: Mapping[str, Any] = rank_windows.get(rank, {})
            hw = throttle_evidence(rw, hw_peer_clock(rank_windows), policy.clock_ratio, policy.hot_temp_c)
            cause = Cause.GPU_THROTTLE if hw else Cause.SLOW_GPU
            identity = f"{cause.value}|{rank}"
            evidence["gpu_side"] = side.evidence()
            hw = {**hw, **fault_evidence(rw, rank_windows)}
            if hw:
                evidence["hardware"] = {str(rank): hw}
            summary = head + f"{side.words()} - {CAUSES[cause].reason}{fault_words(hw)}"
        elif cpu.verdict == CONTENDED:
            # direct evidence it waited for a CPU: the late entry is its starved host, not its code
            cause, identity = Cause.HOST_CPU_CONTENTION, f"{Cause.HOST_CPU_CONTENTION.value}|{top.host}"
            evidence["cpu_basis"] = "scheduler evidence"
            summary += f"{CAUSES[cause].reason} [{cpu.note}]"
        elif not where and _device_timed(rank_windows.get(rank, {})) and _sampled_alike_cpu(rank, rank_windows):
            summary += ("its CPU thread waits where its peers' do (stack samples alike) and its timed phases "
                        "are no slower on its GPU: the delay is in GPU or host work outside them")
        else:
            summary += late_entry_words(rank, where)
            if int(top.gpu) >= 0 and not any(is_device(o) for o in own):
                evidence["missing_evidence"] = ["GPU-side timing (CUDA-event times) to tell a late GPU from late host code"]
        # inferred from arrival order alone: must be seen in two consecutive windows, however
        # many steps one holds (late_entry_extra_windows)
        out.append(Finding(kind=Kind.STRAGGLER, cause=cause, identity=identity,
                           ranks=(rank,), hosts=(top.host,), gpus=(int(top.gpu),),
                           function=top.function, score=float(top.late_fraction * 10), impact_ms=impact,
                           summary=summary, evidence=evidence,
                           extra_windows=policy.late_entry_extra_windows if policy.persist_windows > 1 else 0,
                           subject=f"rank {rank}"))
    return out, cleared


def _instrumented_share(outliers: list[Outlier]) -> str:
    """What a late arriver's own slow functions account for, in words."""
    if not outliers:
        return "none of its instrumented functions is slow"
    top = sorted(outliers, key=lambda o: -float(o.cost_ms_per_step))[:2]
    named = ", ".join(f"{o.function} +{float(o.cost_ms_per_step):.1f} ms/step" for o in top)
    return f"its slow instrumented functions explain only {rank_impact(outliers):.1f} ms/step of it ({named})"


def _sampled_alike(rank: int, rank_windows: dict[int, RankWindow]) -> bool:
    """Whether the rank's CPU stack samples can clear its late entry: the rank and at least one
    peer have user-code stack samples this window, so that :func:`.cpu_evidence.frame_location`
    finding no frame where the rank spends more time than its peers is evidence (not a lack of
    it). A late entry with such samples, no such frame and no sign of waiting for a CPU has
    nothing behind it but the shortest time inside the call, which scheduling skew on an
    oversubscribed host produces. Only for a rank timed on the host alone (a CPU rank, gloo on
    CPU tensors): a GPU rank's collectives and phases are timed on its device, and a rank whose
    delay is on its GPU leaves its CPU thread waiting at the same line as its peers', so its
    samples say nothing of its device (decisions table, docs/detection.md)."""
    if _device_timed(rank_windows.get(rank, {})):
        return False  # device-timed: its GPU can be late while its CPU waits at its peers' line
    return _sampled_alike_cpu(rank, rank_windows)


def _sampled_alike_cpu(rank: int, rank_windows: dict[int, RankWindow]) -> bool:
    def sampled(rw: Any) -> bool:
        return float(rw.get("stack_hz", 0) or 0) > 0 and WHERE_KIND in (rw.get("top_frame_kinds") or [])
    peers = [rw for r, rw in rank_windows.items() if r != rank]
    return sampled(rank_windows.get(rank, {})) and any(sampled(rw) for rw in peers)


def _device_timed(rw: Mapping[str, Any]) -> bool:
    """The rank's phases are timed on its GPU too (device spans this window)."""
    return any(str(f).startswith(DEVICE_PREFIX) for f in rw.get("functions") or [])

