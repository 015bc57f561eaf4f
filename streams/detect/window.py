"""Stage 3, one window: RankWindows + FunctionComparisons -> root-cause Findings.

Order of reasoning (each step only sees what the earlier ones left):
  1. rank outliers: a rank's own functions (collective time excluded) above its peers
     -> one finding per rank (cause from :func:`.findings.classify`), host-level causes
     merged per host (with the late entries of step 2 that have the same cause, joined by
     the host's other ranks with direct CPU evidence: :func:`_merge_host_level`), data
     imbalance merged per function;
  2. stragglers: late arrivers of collectives among peers (:func:`.late_arrival.is_late_culprit`:
     strict p-value, or a clear majority of few calls costing a share of the step). A straggler that was itself
     waiting in another collective (at least ``propagated_wait_share`` of the wait it
     caused) or is a member of a group some other rank held up is a propagated victim
     and is dropped; one with no abnormal function of its own is
     reported as entering the collective late (uninstrumented code before it), or, when
     it waited for a CPU more than its peers (:func:`.cpu_evidence.cpu_verdict`), as its
     host's CPU contention;
  3. slow links: a collective group whose pure transfer time t exceeds its sibling groups'
     (same op and size): t >= median * (1 + link_excess), robust z = (t - median) /
     max(MAD_TO_SIGMA * MAD, noise_floor_rel * median) >= mad_threshold, and its excess per
     step >= min_cost_ms_per_step; localized by link hardware evidence or group intersection;
  4. stage imbalance: forward/backward/optimizer ``kind:`` aggregates where one peer group
     (stage) spends >= (1 + 2 * min_excess) x the other groups' median, costing the min cost;
  5. expectations: GC, data loading or a Python function taking too large a share of
     every rank's step (a problem all ranks share has no outlier); a Python function above
     ``step_wrapper_share`` of the step is the step wrapper itself and is left out.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ...schemas.causes import CAUSES, Cause
from ...schemas.records import FunctionComparison, RankWindow
from ...schemas.vocabulary import Kind, SpanKind
from .columnar import MAD_TO_SIGMA
from .cpu_evidence import CONTENDED, WHERE_KIND, CpuVerdict, cpu_verdict, frame_location
from .device_evidence import DEVICE_PREFIX, gpu_side, is_device
from .findings import (
    Finding,
    classify,
    fault_evidence,
    fault_words,
    finite_ratio,
    missing_evidence,
    more_work,
    phase_sum,
    rank_impact,
    throttle_evidence,
    top_function,
)
from .late_arrival import is_late_culprit
from .layout import PREFIX as LAYOUT_PREFIX
from .layout import coords_of, stage_of
from .model import COMM_PREFIX, comm_op
from .net_links import net_link_findings
from .onset import onset_step
from .policy import DetectionPolicy
from .rank_cpu import late_entry_words
from .rank_cpu import with_cpu_evidence as _with_cpu
from .shape import expectations, short_ranks, stage_imbalance

HOST_LEVEL = frozenset({Cause.HOST_CPU_CONTENTION})
GPU_CAUSES = frozenset({Cause.SLOW_GPU, Cause.GPU_THROTTLE})
# A late entry (a rank last into a collective, none of its own functions slow) is inferred
# from the order of arrivals alone. On a busy host runs of one rank arriving last fill a
# window now and then, while a real late arriver is late in every window after its onset
# (decisions table, docs/detection.md: "late entries persist two windows"). So a late entry
# opens only after two consecutive windows, however
# many steps one window holds (``persist_steps``), like an intermittent slowdown. A
# one-window analysis (trace import, ``persist_windows`` 1) is unchanged.
LATE_ENTRY_EXTRA_WINDOWS = 1


def step_ms(rank_windows: dict[int, RankWindow], quantile: float = 50.0) -> float:
    """Job's step time (ms): median over ranks of each rank's ``quantile`` step time
    (nearest rank; plain Python: a rank has a handful of steps per window)."""
    per_rank = []
    for rw in rank_windows.values():
        steps = rw.get("step_time_ns")
        if steps:
            ordered = sorted(steps)
            per_rank.append(ordered[int(round(quantile / 100 * (len(ordered) - 1)))])
    return float(np.median(per_rank)) / 1e6 if per_rank else 0.0


def diagnose_window(rank_windows: dict[int, RankWindow], comparisons: list[FunctionComparison],
                    policy: DetectionPolicy) -> list[Finding]:
    """All root-cause candidates of one window, most costly first."""
    by_rank = _by_rank(comparisons, "outliers")
    _drop_stage_outliers(by_rank, comparisons, rank_windows)
    stragglers, victims = _stragglers(comparisons, step_ms(rank_windows), policy)
    _drop_absorbed(by_rank, stragglers, comparisons, policy)
    link_findings, link_ranks = _slow_links(comparisons, rank_windows, policy)
    host_links, host_link_ranks = net_link_findings(comparisons, rank_windows, policy)
    link_findings, link_ranks = link_findings + host_links, link_ranks | host_link_ranks
    _explain_late_by_minor(by_rank, stragglers, victims | link_ranks, comparisons, policy)
    unjudged = _uncompared_collectives(rank_windows, comparisons)
    partial = _late_beyond_outliers(by_rank, stragglers, victims | link_ranks | unjudged, policy)
    findings = _rank_findings(by_rank, stragglers, rank_windows, policy)
    findings += _late_entries(stragglers, victims | unjudged, set(by_rank) | link_ranks, rank_windows, policy,
                              partial)
    findings = _merge_host_level(findings, rank_windows, policy)
    findings += link_findings
    findings += stage_imbalance(comparisons, policy)
    findings += expectations(comparisons, step_ms(rank_windows), policy)
    return sorted((_with_gpu_ids(_with_layout(f, rank_windows), rank_windows) for f in findings),
                  key=lambda f: -f.impact_ms)


def _drop_stage_outliers(by_rank: dict[int, list[dict]], comparisons: list[FunctionComparison],
                         rank_windows: dict[int, RankWindow]) -> None:
    """Stage imbalance is not a faulty rank: an outlier scored against peers that were not
    grouped by the layout (no coordinates reached the comparator) is dropped when every rank of
    its pipeline stage (``mesh_coords`` of the RankWindows) that ran the function is an outlier
    of it too, and ranks of other stages ran it: the whole stage is slower, not one rank."""
    stages = {r: stage_of(coords_of(rw)) for r, rw in rank_windows.items()}
    if not any(s is not None for s in stages.values()):
        return
    for c in comparisons:
        if c["kind"] == SpanKind.COLLECTIVE or not c["outliers"]:
            continue
        flagged = {o["rank"] for o in c["outliers"] if not str(o["peer_group"]).startswith(LAYOUT_PREFIX)}
        ran = {r for r, rw in rank_windows.items() if c["function"] in (rw.get("functions") or [c["function"]])}
        drop = set()
        for r in flagged:
            stage = stages.get(r)
            members = {m for m in ran if stages.get(m) == stage}
            if stage is not None and members <= flagged and ran - members:
                drop |= members
        for r in drop:
            by_rank[r] = [o for o in by_rank.get(r, []) if o["function"] != c["function"]]
            if not by_rank[r]:
                del by_rank[r]


def _with_layout(f: Finding, rank_windows: dict[int, RankWindow]) -> Finding:
    """A finding about one rank names that rank's mesh coordinates (summary and evidence)."""
    coords = coords_of(rank_windows.get(f.ranks[0])) if len(f.ranks) == 1 else {}
    if not coords:
        return f
    where = ", ".join(f"{d}={i}" for d, i in coords.items())
    who = f"rank {f.ranks[0]}"
    summary, n = re.subn(rf"\b{who}\b", f"{who} ({where})", f.summary, count=1)
    summary = summary if n else f"{who} ({where}): {f.summary}"
    return dataclasses.replace(f, summary=summary, evidence={**f.evidence, "mesh_coords": coords})


def _with_gpu_ids(f: Finding, rank_windows: dict[int, RankWindow]) -> Finding:
    """A finding about ranks with GPUs names each GPU by NVML's UUID too (``evidence.gpu_uuids``:
    an index is only unique on its host); a GPU cause says it in the summary, for whoever
    drains the node."""
    windows: Mapping[int, Mapping[str, Any]] = rank_windows
    uuids = {str(r): str(windows.get(r, {}).get("gpu_uuid") or "") for r in f.ranks}
    uuids = {r: u for r, u in uuids.items() if u}
    if not uuids:
        return f
    summary = f.summary
    if f.cause in GPU_CAUSES and len(f.ranks) == 1:
        rw = windows.get(f.ranks[0], {})
        summary += f" [GPU {int(rw.get('gpu', -1))} {uuids[str(f.ranks[0])]} on {rw.get('host', '?')}]"
    return dataclasses.replace(f, summary=summary, evidence={**f.evidence, "gpu_uuids": uuids})


def _stragglers(comparisons: list[FunctionComparison], job_step_ms: float,
                policy: DetectionPolicy) -> tuple[dict[int, list[dict]], set[int]]:
    """Late arrivers of peer collectives (:func:`.late_arrival.is_late_culprit`), and the ranks that only propagate
    someone else's delay: late arrivers that themselves waited, in another collective, at
    least ``propagated_wait_share`` of the wait they caused, and the members other than the
    late arrivers of any collective (pipeline send/recv included) whose late arrivers are not
    all such propagated victims. A group whose only late arriver was itself held up elsewhere
    says nothing of its other members (decisions table, docs/detection.md: "propagated
    victims")."""
    late: dict[int, list[dict]] = defaultdict(list)
    groups: list[tuple[set[int], list[int]]] = []
    for c in comparisons:
        if c["kind"] != SpanKind.COLLECTIVE:
            continue
        names = {s["rank"] for s in c["stragglers"]}
        for s in c["stragglers"] if not c["mixed_signatures"] else []:
            if is_late_culprit(s, job_step_ms, policy, members=len(c["members"])):
                late[s["rank"]].append({**s, "function": c["function"]})
        if names:
            groups.append((names, list(c["members"])))
    waited = _waits_of(comparisons, set(late))
    propagated = set()
    for rank, entries in late.items():
        caused = max(s["caused_ms_per_step"] for s in entries)
        own = {s["function"] for s in entries}
        if any(w >= policy.propagated_wait_share * caused for fn, w in waited.get(rank, []) if fn not in own):
            propagated.add(rank)
    victims = set(propagated)
    for names, members in groups:
        if names - propagated:  # someone there held the others up on its own account
            victims.update(r for r in members if r not in names)
    return late, victims


def _by_rank(comparisons: list[FunctionComparison],
             field: Literal["outliers", "minor_outliers"]) -> dict[int, list[dict]]:
    """Rank -> its ``field`` entries (``outliers`` or ``minor_outliers``) of the non-collective
    comparisons, each with its function and kind."""
    out: dict[int, list[dict]] = defaultdict(list)
    for c in comparisons:
        if c["kind"] != SpanKind.COLLECTIVE:
            for o in c.get(field) or []:
                out[int(o["rank"])].append({**o, "function": c["function"], "kind": c["kind"]})
    return out


def _explain_late_by_minor(by_rank: dict[int, list[dict]], late: dict[int, list[dict]], excluded: set[int],
                           comparisons: list[FunctionComparison], policy: DetectionPolicy) -> None:
    """A late arriver with no outlier of its own, whose small excesses (``minor_outliers``: above
    its peers in every way but the cost a finding needs alone) add up to at least
    ``explains_share`` of the wait it causes, is explained by them: they become its outliers,
    classified as any (data imbalance when they are extra calls, a slow phase, ...), at the cost
    of the wait. Several phases each under the cost floor can together be all of a late
    arriver's delay, on a GPU rank (device or host times) as on a CPU rank (decisions table,
    docs/detection.md: "minor excesses explain a late arrival")."""
    for rank, outs in _by_rank(comparisons, "minor_outliers").items():
        if rank not in late or rank in by_rank or rank in excluded:
            continue
        caused = max(float(s["caused_ms_per_step"]) for s in late[rank])
        # the per-kind aggregates are disjoint phases (data loading, forward, backward, ...) and
        # add up; named functions may nest (a module inside the forward): the largest one alone
        phases = phase_sum(outs)
        explained = phases if phases > 0 else max(float(o["cost_ms_per_step"]) for o in outs)
        if explained >= policy.explains_share * caused:
            by_rank[rank] = outs


def _late_beyond_outliers(by_rank: dict[int, list[dict]], late: dict[int, list[dict]], excluded: set[int],
                          policy: DetectionPolicy) -> dict[int, list[dict]]:
    """Take out of ``by_rank`` (and return) the outliers of each late arriver that explain less
    than ``explains_share`` of the wait it causes: the step time they would give back
    (:func:`.findings.rank_impact`) is a small part of what the others wait for it, so the rest
    of its delay is elsewhere, and the rank is reported as a late entry (located by its stack
    samples) with them as evidence, not as a finding of their cause at the cost of the whole
    wait. The converse of :func:`_explain_late_by_minor`: a side effect of the real delay (the
    garbage of untimed work, a GC pause) is evidence, not the cause. Not for a rank given more
    work per step than its peers (data imbalance, :func:`.findings.more_work`): more work is
    slower in every phase, the uninstrumented ones (autograd's backward) too, so the imbalance
    is the explanation of the whole wait. A GPU rank's outliers count their device and host
    times as alternatives (:func:`.findings.phase_sum`), never added (decisions table,
    docs/detection.md: "outliers that explain little of a late arrival")."""
    out: dict[int, list[dict]] = {}
    for rank, outs in list(by_rank.items()):
        if rank not in late or rank in excluded or more_work(outs, policy.min_excess, policy.explains_share):
            continue
        caused = max(float(s["caused_ms_per_step"]) for s in late[rank])
        if rank_impact(outs) < policy.explains_share * caused:
            out[rank] = by_rank.pop(rank)
    return out


def _drop_absorbed(by_rank: dict[int, list[dict]], late: dict[int, list[dict]],
                   comparisons: list[FunctionComparison], policy: DetectionPolicy) -> None:
    """Drop the outliers of a rank whose extra time the job never waited for: the rank was last
    into no collective of the window (no straggler anywhere), and in a group that another rank,
    a late culprit, held up, its extra time came out of its waiting there: it waited at least its
    whole excess per step, and less than the group's other waiting members by at least
    ``absorbed_share`` of it. Its extra work ran while it would have waited anyway; the step is
    as long without it (decisions table, docs/detection.md: "absorbed excess"). Equal culprits are each late in their share
    of the calls and wait little for each other: both stay. A rank whose extra time falls after
    its wait (the DLRM trace: ranks 4 and 5 slow in backward, after waiting for rank 7 in the
    forward all-to-alls like everyone else) waits no less than the others and stays. A slower
    rank hides a lesser one that its wait absorbs until it is fixed (until then the lesser one
    costs no step time)."""
    if not late or not by_rank:
        return
    last_anywhere = {int(s["rank"]) for c in comparisons if c["kind"] == SpanKind.COLLECTIVE
                     for s in c["stragglers"]}
    absorbed = set()
    for c in comparisons:
        if c["kind"] != SpanKind.COLLECTIVE or not any(int(s["rank"]) in late for s in c["stragglers"]):
            continue
        waits = dict(zip((int(m) for m in c["members"]), (float(w) for w in c.get("member_wait_ms_per_step") or []),
                         strict=False))
        for r, wait in waits.items():
            if r not in by_rank or r in last_anywhere:
                continue
            others = [w for m, w in waits.items() if m != r and m not in last_anywhere]
            excess = rank_impact(by_rank[r])
            if others and wait >= excess and float(np.median(others)) - wait >= policy.absorbed_share * excess:
                absorbed.add(r)
    for r in absorbed:
        del by_rank[r]


def _waits_of(comparisons: list[FunctionComparison], ranks: set[int]) -> dict[int, list[tuple[str, float]]]:
    """(collective, wait ms per step beyond the group's ordinary wait) of each of ``ranks`` in
    every group it belongs to. The ordinary wait is the median wait of the group's *other*
    members: on a busy host every member of a group waits a few ms per step for whichever
    member happened to come last, and that wait, which every member has, is no sign that
    someone held this rank up (decisions table, docs/detection.md: "ordinary wait")."""
    out: dict[int, list[tuple[str, float]]] = defaultdict(list)
    if not ranks:
        return out
    for c in comparisons:
        waits = [float(w) for w in (c.get("member_wait_ms_per_step") or [])]
        members = list(c.get("members", []))[:len(waits)]
        for i, r in enumerate(members):
            if r in ranks:
                others = waits[:i] + waits[i + 1:]
                ordinary = float(np.median(others)) if others else 0.0
                out[r].append((c["function"], waits[i] - ordinary))
    return out


def _hw_peer_clock(rank_windows: dict[int, RankWindow]) -> float:
    clocks = [rw["sm_clock_mhz"] for rw in rank_windows.values() if rw.get("sm_clock_mhz", -1) > 0]
    return float(np.median(clocks)) if clocks else -1.0


def _rank_findings(by_rank: dict[int, list[dict]], stragglers: dict[int, list[dict]],
                   rank_windows: dict[int, RankWindow], policy: DetectionPolicy) -> list[Finding]:
    peer_clock = _hw_peer_clock(rank_windows)
    groups: dict[tuple, list[tuple[int, Cause, list[dict], dict, CpuVerdict]]] = defaultdict(list)
    for rank, outs in by_rank.items():
        rw: Mapping[str, Any] = rank_windows.get(rank, {})
        gpu = int(outs[0].get("gpu", rw.get("gpu", -1)))
        hw = throttle_evidence(rw, peer_clock, policy.clock_ratio, policy.hot_temp_c) if gpu >= 0 else {}
        cpu = cpu_verdict(rank, rank_windows, rank_impact(outs), policy)
        cause = classify(outs, gpu, hw, policy, cpu.verdict)
        if cause in GPU_CAUSES:
            hw = {**hw, **fault_evidence(rw, rank_windows)}
        if cause in HOST_LEVEL:
            key: tuple = (cause, outs[0]["host"])
        elif cause == Cause.DATA_IMBALANCE:
            key = (cause, top_function(outs, cause)["function"])
        else:
            key = (cause, rank)
        groups[key].append((rank, cause, outs, hw, cpu))
    return [_with_cpu(_onset(_merge_rank_group(key, members, stragglers), rank_windows, policy), members,
                      rank_windows, policy) for key, members in groups.items()]


def _step_times(rank_windows: dict[int, RankWindow], rank: int) -> list[int]:
    rw = rank_windows.get(rank)
    return list(rw.get("step_time_ns") or []) if rw is not None else []


def _onset(f: Finding, rank_windows: dict[int, RankWindow], policy: DetectionPolicy) -> Finding:
    """An intermittent finding whose every rank's steps all turned slow from some step of this
    window to its end began inside it: it opens like a sustained one (:mod:`.onset`)."""
    if not f.evidence.get("intermittent") or policy.persist_steps <= 0:
        return f
    onsets = [onset_step(_step_times(rank_windows, r), policy.persist_steps) for r in f.ranks]
    if not onsets or any(k is None for k in onsets):
        return f
    evidence = {k: v for k, v in f.evidence.items() if k != "intermittent"}
    evidence["onset_in_window_step"] = min(k for k in onsets if k is not None)
    summary = f.summary.replace(" (intermittent: the slow tail, not every call)",
                                " (began inside this window: every step of the rank since is slower)")
    return dataclasses.replace(f, evidence=evidence, summary=summary, extra_windows=0)


def _merge_rank_group(key: tuple, members: list, stragglers: dict[int, list[dict]]) -> Finding:
    cause = key[0]
    ranks = tuple(sorted(m[0] for m in members))
    outs = [o for m in members for o in m[2]]
    top = top_function(outs, cause)
    impact = max(rank_impact(m[2]) for m in members)
    late = [s for r in ranks for s in stragglers.get(r, [])]
    if late:
        impact = max(impact, max(s["caused_ms_per_step"] for s in late))
    hosts = tuple(sorted({o["host"] for o in outs}))
    gpus = tuple(sorted({int(o["gpu"]) for o in outs}))
    evidence = {
        "function": top["function"], "peer_median_ms": round(top["peer_median_ms_per_step"], 3),
        "rank_value_ms": round(top["value_ms_per_step"], 3), "ratio": round(top["ratio"], 3),
        "robust_z": round(top["robust_z"], 1), "calls_ratio": round(top["calls_ratio"], 3),
        "abnormal_functions": sorted({o["function"] for o in outs}),
        "hardware": {str(m[0]): m[3] for m in members if m[3]},
        "late_arrivals": [{k: s[k] for k in ("function", "late_seqs", "late_fraction", "caused_ms_per_step")}
                          for s in late[:5]],
    }
    kind = Kind.IMBALANCE if cause == Cause.DATA_IMBALANCE else Kind.OUTLIER
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {short_ranks(ranks)}"
    side = gpu_side(members[0][2], 0.0, 0.0) if cause in GPU_CAUSES else None
    missing = sorted({w for m in members for w in missing_evidence(m[2], int(m[2][0].get("gpu", -1)), cause,
                                                                   m[4].verdict)})
    if side is not None:
        evidence["gpu_side"] = side.evidence()
        what = side.words()
    else:
        what = (f"{top['function']} takes {top['value_ms_per_step']:.1f} ms/step vs "
                f"{top['peer_median_ms_per_step']:.1f} ms on its peers ({_times(top['ratio'])})")
    if missing:
        evidence["missing_evidence"] = missing
    faults = next((fault_words(m[3]) for m in members if fault_words(m[3])), "")
    summary = (f"{who} on {', '.join(hosts[:3])}: {what} - {CAUSES[cause].reason}{faults}"
               + (f" (no {'; no '.join(missing)})" if missing else "") + f"; costs the job ~{impact:.1f} ms per step")
    intermittent = all(o.get("intermittent", False) for o in outs)
    if intermittent:
        evidence["intermittent"] = True
        summary += " (intermittent: the slow tail, not every call)"
    return Finding(kind=kind, cause=cause, identity=f"{cause.value}|{key[1]}", ranks=ranks, hosts=hosts,
                   gpus=gpus, function=top["function"], score=float(max(o["robust_z"] for o in outs)),
                   impact_ms=float(impact), summary=summary, evidence=evidence,
                   extra_windows=1 if intermittent else 0)


def _times(ratio: float) -> str:
    """``'3.20x'``; for a function the median peer spends no time in (:func:`.findings.finite_ratio`),
    words instead of a made-up factor."""
    return f"{ratio:.2f}x" if finite_ratio(ratio) else "its median peer spends none"


def _late_entries(stragglers: dict[int, list[dict]], victims: set[int], explained: set[int],
                  rank_windows: dict[int, RankWindow], policy: DetectionPolicy,
                  partial: Mapping[int, list[dict]] | None = None) -> list[Finding]:
    """Stragglers not explained by abnormal functions of their own and not held up elsewhere;
    the sampled frame where the straggler's extra time goes, when its collector samples stacks.
    ``partial``: late arrivers whose outliers explain only a small part of their delay
    (:func:`_late_beyond_outliers`), named in the summary and the evidence."""
    partial = partial or {}
    out = []
    for rank, late in stragglers.items():
        if rank in victims or rank in explained:
            continue
        top = max(late, key=lambda s: s["caused_ms_per_step"])
        impact = float(top["caused_ms_per_step"])
        where = frame_location(rank, rank_windows, policy)
        cpu = cpu_verdict(rank, rank_windows, impact, policy)
        own = partial.get(rank, [])
        if not own and not where and cpu.verdict != CONTENDED and _sampled_alike(rank, rank_windows):
            continue  # its stacks and its CPU say it did nothing its peers did not: not shown late
        head = (f"rank {rank} on {top['host']} enters {top['function']} late in "
                f"{top['late_fraction']:.0%} of calls; the others wait ~{impact:.1f} ms per step for it; ")
        summary = head + f"{_instrumented_share(own)}, so "
        evidence = {"late_seqs": top["late_seqs"], "late_fraction": round(top["late_fraction"], 3),
                    "caused_ms_per_step": round(impact, 3), "p_value": top["p_value"],
                    "groups": sorted(s["function"] for s in late), "location": where,
                    "cpu": {str(rank): {"verdict": cpu.verdict, **cpu.evidence}}}
        if own:
            evidence["abnormal_functions"] = sorted({o["function"] for o in own})
            evidence["explained_ms_per_step"] = round(rank_impact(own), 3)
        cause, identity = Cause.SLOW_FUNCTION, f"late|{rank}"
        side = gpu_side(own, policy.min_cost_ms_per_step, policy.explains_share)
        if side is not None:
            # its GPU is behind: the device time of its phases grew beyond what its host explains
            rw: Mapping[str, Any] = rank_windows.get(rank, {})
            hw = throttle_evidence(rw, _hw_peer_clock(rank_windows), policy.clock_ratio, policy.hot_temp_c)
            cause = Cause.GPU_THROTTLE if hw else Cause.SLOW_GPU
            identity = f"{cause.value}|{rank}"
            evidence["gpu_side"] = side.evidence()
            hw = {**hw, **fault_evidence(rw, rank_windows)}
            if hw:
                evidence["hardware"] = {str(rank): hw}
            summary = head + f"{side.words()} - {CAUSES[cause].reason}{fault_words(hw)}"
        elif cpu.verdict == CONTENDED:
            # direct evidence it waited for a CPU: the late entry is its starved host, not its code
            cause, identity = Cause.HOST_CPU_CONTENTION, f"{Cause.HOST_CPU_CONTENTION.value}|{top['host']}"
            evidence["cpu_basis"] = "scheduler evidence"
            summary += f"{CAUSES[cause].reason} [{cpu.note}]"
        elif not where and _device_timed(rank_windows.get(rank, {})) and _sampled_alike_cpu(rank, rank_windows):
            summary += ("its CPU thread waits where its peers' do (stack samples alike) and its timed phases "
                        "are no slower on its GPU: the delay is in GPU or host work outside them")
        else:
            summary += late_entry_words(rank, where)
            if int(top.get("gpu", -1)) >= 0 and not any(is_device(o) for o in own):
                evidence["missing_evidence"] = ["GPU-side timing (CUDA-event times) to tell a late GPU from late host code"]
        # inferred from arrival order alone: must be seen in two consecutive windows, however
        # many steps one holds (LATE_ENTRY_EXTRA_WINDOWS)
        out.append(Finding(kind=Kind.STRAGGLER, cause=cause, identity=identity,
                           ranks=(rank,), hosts=(top["host"],), gpus=(int(top["gpu"]),),
                           function=top["function"], score=float(top["late_fraction"] * 10), impact_ms=impact,
                           summary=summary, evidence=evidence,
                           extra_windows=LATE_ENTRY_EXTRA_WINDOWS if policy.persist_windows > 1 else 0))
    return out


def _instrumented_share(outliers: list[dict]) -> str:
    """What a late arriver's own slow functions account for, in words."""
    if not outliers:
        return "none of its instrumented functions is slow"
    top = sorted(outliers, key=lambda o: -float(o["cost_ms_per_step"]))[:2]
    named = ", ".join(f"{o['function']} +{float(o['cost_ms_per_step']):.1f} ms/step" for o in top)
    return f"its slow instrumented functions explain only {rank_impact(outliers):.1f} ms/step of it ({named})"


def _uncompared_collectives(rank_windows: dict[int, RankWindow], comparisons: list[FunctionComparison]) -> set[int]:
    """Ranks whose RankWindow names a collective group this window has no comparison of
    (the window was evaluated on the timer before it came): whether such a rank waited in that
    group for someone else, a propagated victim, cannot be told, so its late entries are not
    raised from this window (decisions table, docs/detection.md: "uncompared collectives")."""
    compared = {c["function"] for c in comparisons}
    return {int(r) for r, rw in rank_windows.items()
            if any(str(f).startswith(COMM_PREFIX) and f not in compared for f in rw.get("functions") or [])}


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


def _merge_host_level(findings: list[Finding], rank_windows: dict[int, RankWindow],
                      policy: DetectionPolicy) -> list[Finding]:
    """One finding per host and host-level cause: the rank findings (slow functions) and the
    late entries of ranks on one host with such a cause are one incident, joined by the
    other ranks of that host with direct evidence of the same cause (they waited for a CPU
    more than their peers) that no other finding names. Identity ``cause|host``."""
    by_identity: dict[str, list[Finding]] = defaultdict(list)
    rest: list[Finding] = []
    for f in findings:
        (by_identity[f.identity] if f.cause in HOST_LEVEL else rest).append(f)
    named = {r for f in rest for r in f.ranks}
    merged = []
    for parts in by_identity.values():
        host = parts[0].hosts[0] if len(parts[0].hosts) == 1 and parts[0].hosts[0] else None  # known, one
        impact = max(p.impact_ms for p in parts)
        have = {r for p in parts for r in p.ranks}
        verdicts = {r: cpu_verdict(r, rank_windows, impact, policy) for r, rw in sorted(rank_windows.items())
                    if host is not None and rw.get("host") == host and r not in have and r not in named}
        contended = {r: v for r, v in verdicts.items() if v.verdict == CONTENDED}
        worst = _worst_extra_wait(have, rank_windows, impact, policy) if contended else None
        joined = {r: v for r, v in contended.items() if _comparable(v, worst, policy)}
        merged.append(parts[0] if len(parts) == 1 and not joined else _join_host(parts, joined))
    return rest + merged


def _worst_extra_wait(ranks: set[int], rank_windows: dict[int, RankWindow], impact: float,
                      policy: DetectionPolicy) -> float | None:
    """The largest :func:`_extra_wait` of ``ranks`` (a host-level finding's own ranks); None unknown."""
    waits = [_extra_wait(cpu_verdict(r, rank_windows, impact, policy).evidence) for r in sorted(ranks)]
    return max((w for w in waits if w is not None), default=None)


def _extra_wait(ev: Mapping[str, Any]) -> float | None:
    """A CPU verdict's run-queue wait above what its peers' rate expects (ms/step); None unknown."""
    mine = float(ev.get("runqueue_wait_ms_per_step", -1))
    if mine < 0:
        return None
    return mine - float(ev.get("expected_runqueue_wait_ms_per_step", ev.get("peer_runqueue_wait_ms_per_step", 0.0)))


def _comparable(v: CpuVerdict, worst: float | None, policy: DetectionPolicy) -> bool:
    """A contended host peer joins when it waited for a CPU at least ``host_join_share`` of what
    the finding's own ranks did (the same evidence, not a trace of it; decisions table,
    docs/detection.md: "joining a contended host")."""
    mine = _extra_wait(v.evidence)
    return worst is None or mine is None or mine >= policy.host_join_share * worst


def _join_host(parts: list[Finding], joined: dict[int, CpuVerdict]) -> Finding:
    """``parts`` (findings of one host and cause) and the ``joined`` ranks (with the CPU verdict
    that joined them, rank order) as one finding."""
    top = max(parts, key=lambda p: p.impact_ms)
    ranks = tuple(sorted({r for p in parts for r in p.ranks} | set(joined)))
    evidence: dict[str, Any] = dict(top.evidence)
    cpu: dict[str, Any] = {}
    for p in parts:
        cpu.update(p.evidence.get("cpu", {}))
    notes = []
    for r, v in joined.items():
        cpu[str(r)] = {"verdict": v.verdict, **v.evidence}
        notes.append(f"rank {r}: {v.note}")
    evidence["cpu"] = cpu
    evidence["merged"] = [{"ranks": list(p.ranks), "kind": p.kind.value, "function": p.function,
                           "impact_ms": round(p.impact_ms, 3)} for p in parts]
    if joined:
        evidence["joined_ranks"] = list(joined)
    host = ", ".join(sorted({h for p in parts for h in p.hosts}))
    summary = (f"ranks {short_ranks(ranks)} on {host}: {CAUSES[top.cause].title} - "
               + "; ".join(p.summary for p in sorted(parts, key=lambda p: -p.impact_ms))
               + "".join(f"; {n}" for n in notes))
    return dataclasses.replace(top, ranks=ranks, hosts=tuple(sorted({h for p in parts for h in p.hosts})),
                               gpus=tuple(sorted({g for p in parts for g in p.gpus})),
                               score=max(p.score for p in parts), summary=summary, evidence=evidence,
                               extra_windows=min(p.extra_windows for p in parts))


def _slow_links(comparisons: list[FunctionComparison], rank_windows: dict[int, RankWindow],
                policy: DetectionPolicy) -> tuple[list[Finding], set[int]]:
    """Collective groups whose transfer time exceeds sibling groups (same op, same size)."""
    siblings: dict[tuple, list[FunctionComparison]] = defaultdict(list)
    for c in comparisons:
        if c["kind"] == SpanKind.COLLECTIVE and c["seqs_compared"] >= policy.min_seqs:
            siblings[(comm_op(c["function"]), len(c["members"]))].append(c)
    slow = []
    for group in siblings.values():
        if len(group) < policy.min_peers:
            continue
        t = np.array([c["transfer_ms_median"] for c in group])
        per_step = np.array([c["transfer_ms_per_step"] for c in group])
        m, mad = float(np.median(t)), float(np.median(np.abs(t - np.median(t))))
        scale = max(MAD_TO_SIGMA * mad, policy.noise_floor_rel * m, 1e-6)
        ms = float(np.median(per_step))
        for c, ti, pi in zip(group, t, per_step, strict=False):
            if ti >= m * (1 + policy.link_excess) and (ti - m) / scale >= policy.mad_threshold \
                    and pi - ms >= policy.min_cost_ms_per_step:
                slow.append((c, ti / m, (ti - m) / scale, pi - ms))
    return _localize_links(slow, rank_windows)


def _link_suspects(members: list[int], rank_windows: dict[int, RankWindow]) -> dict[int, dict]:
    """Members with link hardware evidence: PCIe gen/width below the others, NVLink errors."""
    rws = [rank_windows[r] for r in members if r in rank_windows]
    gens = [rw["pcie_gen_min"] for rw in rws if rw.get("pcie_gen_min", -1) > 0]
    widths = [rw["pcie_width_min"] for rw in rws if rw.get("pcie_width_min", -1) > 0]
    gen_med = float(np.median(gens)) if gens else -1
    width_med = float(np.median(widths)) if widths else -1
    out = {}
    for rw in rws:
        ev: dict[str, Any] = {}
        if 0 < rw.get("pcie_gen_min", -1) < gen_med:
            ev["pcie_gen"], ev["peer_pcie_gen"] = rw["pcie_gen_min"], gen_med
        if 0 < rw.get("pcie_width_min", -1) < width_med:
            ev["pcie_width"], ev["peer_pcie_width"] = rw["pcie_width_min"], width_med
        if rw.get("nvlink_errors", 0) > 0:
            ev["nvlink_errors"] = rw["nvlink_errors"]
        if ev:
            out[int(rw["rank"])] = ev
    return out


def _localize_links(slow: list[tuple], rank_windows: dict[int, RankWindow]) -> tuple[list[Finding], set[int]]:
    if not slow:
        return [], set()
    sets = [set(c["members"]) for c, *_ in slow]
    common = set.intersection(*sets) if len(sets) > 1 else set()
    findings, covered = [], set()
    for c, ratio, z, cost in slow:
        suspects = _link_suspects(c["members"], rank_windows)
        if suspects:
            ranks, how = tuple(sorted(suspects)), "link hardware evidence"
        elif common and len(common) < len(c["members"]):
            ranks, how = tuple(sorted(common)), "the only member of every slow group"
        else:
            ranks, how = tuple(sorted(c["members"])), "not localized within the group"
        covered.update(c["members"])
        seen: list[Mapping[str, Any]] = [rank_windows.get(r, {}) for r in ranks]
        hosts = tuple(sorted({rw.get("host", "?") for rw in seen}))
        gpus = tuple(sorted({int(rw.get("gpu", -1)) for rw in seen}))
        summary = (f"collective {c['function']} transfers {ratio:.2f}x slower than its sibling groups "
                   f"({c['transfer_ms_median']:.2f} ms per call); slow link at rank(s) {short_ranks(ranks)} on "
                   f"{', '.join(hosts[:3])} ({how}); costs ~{cost:.1f} ms per step")
        evidence = {"transfer_ms_median": round(c["transfer_ms_median"], 3), "ratio": round(ratio, 3),
                    "robust_z": round(z, 1), "localized_by": how, "hardware": suspects,
                    "group_members": len(c["members"])}
        findings.append(Finding(kind=Kind.OUTLIER, cause=Cause.SLOW_LINK, identity=f"slow_link|{short_ranks(ranks)}",
                                ranks=ranks, hosts=hosts, gpus=gpus, function=c["function"], score=float(z),
                                impact_ms=float(cost), summary=summary, evidence=evidence))
    return _dedupe(findings), covered


def _dedupe(findings: list[Finding]) -> list[Finding]:
    best: dict[str, Finding] = {}
    for f in findings:
        if f.identity not in best or f.impact_ms > best[f.identity].impact_ms:
            best[f.identity] = f
    return list(best.values())
