"""Rules on the job's shape: work split unevenly over pipeline stages, and a share of every
rank's step above what a healthy job spends (:func:`stage_imbalance`, :func:`expectations`).

Both compare groups of ranks or the whole job, never one rank with its peers, so what they
find names no faulty rank; for the same reason a rank outlier that its whole pipeline stage
shares is dropped before rank findings are made (:func:`drop_stage_outliers`, from the
RankWindows' ``mesh_coords``). A GPU/NCCL job and a CPU job show them alike: a pipeline's last
stage (the output layer and the loss) does more forward, backward and optimizer work than
the others on any device, and an all-rank data loader or garbage-collection share is the
job's code. Whether a finding is the job's shape (advice) or a change (an incident) is
decided by :meth:`.job_checks.JobChecks.shape` (:data:`...schemas.causes.SHAPE`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ...schemas.causes import Cause
from ...schemas.records import FunctionComparison, PeerGroupStat, RankWindow
from ...schemas.vocabulary import Kind, SpanKind
from .decisions import Clearance
from .facts import Outliers
from .findings import Finding
from .layout import PREFIX as LAYOUT_PREFIX
from .layout import coords_of, stage_of
from .model import KIND_PREFIX
from .policy import DetectionPolicy


def short_ranks(ranks: tuple[int, ...]) -> str:
    """At most 8 ranks, then how many in all: ``0,1,2,... (64 ranks)``."""
    return ",".join(map(str, ranks[:8])) + (f",... ({len(ranks)} ranks)" if len(ranks) > 8 else "")


def stage_groups(comparisons: list[FunctionComparison]) -> Iterator[tuple[FunctionComparison, PeerGroupStat, float]]:
    """(comparison, peer group, the other groups' median ms/step) of every peer group (stage) in
    the forward/backward/optimizer comparisons of a job split into several peer groups."""
    for c in comparisons:
        if not c["function"].startswith(KIND_PREFIX) or c["peer_groups"] < 2:
            continue
        if c["kind"] not in (SpanKind.FORWARD, SpanKind.BACKWARD, SpanKind.OPTIMIZER):
            continue
        meds = np.array([g["median_ms_per_step"] for g in c["groups"]])
        for i, g in enumerate(c["groups"]):
            yield c, g, float(np.median(np.delete(meds, i)))


def stage_imbalance(comparisons: list[FunctionComparison], policy: DetectionPolicy) -> list[Finding]:
    """Peer groups (stages) whose forward/backward/optimizer work far exceeds the others'."""
    found: dict[str, Finding] = {}
    for c, g, others in stage_groups(comparisons):
        cost = g["median_ms_per_step"] - others
        if others <= 0 or g["median_ms_per_step"] < others * (1 + 2 * policy.min_excess) \
                or cost < policy.min_cost_ms_per_step:
            continue
        ident = f"stage_imbalance|{g['key']}"
        prev = found.get(ident)
        impact = cost + (prev.impact_ms if prev else 0.0)
        ranks = tuple(sorted(g["ranks"]))
        summary = (f"pipeline stage imbalance: the {len(ranks)} ranks of peer group {g['key']} (ranks "
                   f"{short_ranks(ranks)}) spend {g['median_ms_per_step']:.1f} ms/step in {c['function']} vs "
                   f"{others:.1f} ms on other stages; the others wait for them. Rebalance layers "
                   f"(~{impact:.1f} ms per step); no rank is faulty")
        evidence = {"group": g["key"], "group_ms": round(g["median_ms_per_step"], 3),
                    "other_groups_ms": round(others, 3), "ratio": round(g["median_ms_per_step"] / others, 3)}
        found[ident] = Finding(kind=Kind.IMBALANCE, cause=Cause.STAGE_IMBALANCE, identity=ident, ranks=ranks,
                               hosts=(), gpus=(), function=c["function"],
                               score=float(g["median_ms_per_step"] / others), impact_ms=impact,
                               summary=summary, evidence=evidence)
    return list(found.values())


def expectations(comparisons: list[FunctionComparison], job_step_ms: float, policy: DetectionPolicy) -> list[Finding]:
    """All-rank problems: a share of the step far above what a healthy job spends."""
    if job_step_ms <= 0:
        return []
    out = []
    for c in comparisons:
        limit = _share_limit(c, policy)
        share = c["median_ms_per_step"] / job_step_ms
        if limit is None or share <= limit or share > policy.step_wrapper_share and c["kind"] == SpanKind.PYTHON:
            continue
        cost = (share - limit) * job_step_ms
        if cost < policy.min_cost_ms_per_step:
            continue
        summary = (f"all {c['ranks_seen']} ranks spend {share:.0%} of each {job_step_ms:.0f} ms step in "
                   f"{c['function']} (expected under {limit:.0%}): a shared inefficiency, no single culprit; "
                   f"~{cost:.1f} ms per step to gain")
        evidence = {"share_of_step": round(share, 4), "expected_max_share": limit,
                    "explains_ms": round(c["median_ms_per_step"], 3),
                    "median_ms_per_step": round(c["median_ms_per_step"], 3), "step_ms": round(job_step_ms, 3),
                    "ranks": c["ranks_seen"]}
        out.append(Finding(kind=Kind.EXPECTATION, cause=Cause.SHARED_INEFFICIENCY,
                           identity=f"shared|{c['function']}", ranks=(), hosts=(), gpus=(), function=c["function"],
                           score=float(share / limit), impact_ms=float(cost), summary=summary, evidence=evidence))
    return out


def _share_limit(c: FunctionComparison, policy: DetectionPolicy) -> float | None:
    if c["function"] == KIND_PREFIX + "gc":
        return policy.gc_share
    if c["function"] == KIND_PREFIX + "dataloader":
        return policy.dataloader_share
    if c["kind"] == SpanKind.PYTHON and not c["function"].startswith(KIND_PREFIX):
        return policy.python_share
    return None


def drop_stage_outliers(by_rank: Outliers, comparisons: list[FunctionComparison],
                        rank_windows: dict[int, RankWindow]) -> list[Clearance]:
    """Stage imbalance is not a faulty rank: an outlier scored against peers that were not
    grouped by the layout (no coordinates reached the comparator) is dropped when every rank of
    its pipeline stage (``mesh_coords`` of the RankWindows) that ran the function is an outlier
    of it too, and ranks of other stages ran it: the whole stage is slower, not one rank.
    Returns each outlier dropped, with why."""
    stages = {r: stage_of(coords_of(rw)) for r, rw in rank_windows.items()}
    cleared: list[Clearance] = []
    if not any(s is not None for s in stages.values()):
        return cleared
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
            by_rank[r] = [o for o in by_rank.get(r, []) if o.function != c["function"]]
            if not by_rank[r]:
                del by_rank[r]
            cleared.append(Clearance(r, "", (f"its outlier in {c['function']} is its pipeline stage's shape: "
                                             f"every rank of its stage that ran it is slower"),
                                     {"function": c["function"], "stage": stages.get(r),
                                      "stage_ranks": sorted(m for m in ran if stages.get(m) == stages.get(r))}))
    return cleared
