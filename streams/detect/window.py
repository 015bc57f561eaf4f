"""Stage 3, one window: RankWindows + FunctionComparisons -> root-cause Findings.

Order of reasoning (each step only sees what the earlier ones left):
  1. rank outliers: a rank's own functions (collective time excluded) above its peers
     -> one finding per rank (cause from :func:`.findings.classify`), host-level causes
     merged per host (with the late entries of step 2 that have the same cause, joined by
     the host's other ranks with direct CPU evidence: :func:`.host_level.merge_host_level`), data
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
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...schemas.records import FunctionComparison, RankWindow
from .findings import Finding
from .group_links import slow_links
from .host_level import merge_host_level
from .late_entries import late_entries
from .layout import coords_of
from .net_links import net_link_findings
from .policy import DetectionPolicy
from .rank_findings import GPU_CAUSES, outliers_by_rank, rank_findings
from .shape import drop_stage_outliers, expectations, stage_imbalance
from .stragglers import (
    drop_absorbed,
    explain_late_by_minor,
    find_stragglers,
    late_beyond_outliers,
    uncompared_collectives,
)


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
    by_rank = outliers_by_rank(comparisons, "outliers")
    drop_stage_outliers(by_rank, comparisons, rank_windows)
    stragglers, victims = find_stragglers(comparisons, step_ms(rank_windows), policy)
    drop_absorbed(by_rank, stragglers, comparisons, policy)
    link_findings, link_ranks = slow_links(comparisons, rank_windows, policy)
    host_links, host_link_ranks = net_link_findings(comparisons, rank_windows, policy)
    link_findings, link_ranks = link_findings + host_links, link_ranks | host_link_ranks
    explain_late_by_minor(by_rank, stragglers, victims | link_ranks, comparisons, policy)
    unjudged = uncompared_collectives(rank_windows, comparisons)
    partial = late_beyond_outliers(by_rank, stragglers, victims | link_ranks | unjudged, policy)
    findings = rank_findings(by_rank, stragglers, rank_windows, policy)
    findings += late_entries(stragglers, victims | unjudged, set(by_rank) | link_ranks, rank_windows, policy,
                             partial)
    findings = merge_host_level(findings, rank_windows, policy)
    findings += link_findings
    findings += stage_imbalance(comparisons, policy)
    findings += expectations(comparisons, step_ms(rank_windows), policy)
    return sorted((_with_gpu_ids(_with_layout(f, rank_windows), rank_windows) for f in findings),
                  key=lambda f: -f.impact_ms)


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
