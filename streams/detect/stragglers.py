"""Late arrivers of collectives, the ranks that only pass a delay on, and how a late arrival
and a rank's own outliers explain each other.

Evidence: per collective group, who came last into each call and the wait it caused
(:mod:`.late_arrival`), each member's wait per step in every group, and the non-collective
comparisons' outliers and minor outliers of the same window.

* :func:`find_stragglers`: culprits (:func:`.late_arrival.is_late_culprit`) and propagated
  victims (a late arriver that itself waited elsewhere, a group's other members);
* :func:`drop_absorbed`: extra time a rank spent while it waited anyway for a culprit;
* :func:`explain_late_by_minor` and :func:`late_beyond_outliers`: a late arriver's own small
  excesses that add up to its delay, or outliers that explain little of it;
* :func:`uncompared_collectives`: ranks in a group with no comparison this window.

CPU rank (gloo on CPU tensors): the times inside the call and its phases are host times.
GPU/NCCL rank: its collectives and phases are timed on its device as well as on its host;
a phase's device and host times are alternatives of one delay (:func:`.findings.phase_sum`),
never added. No clocks are compared across ranks, on either.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ...schemas.records import FunctionComparison, RankWindow
from ...schemas.vocabulary import SpanKind
from .decisions import Clearance, Flag
from .facts import LateArrival, LateArrivals, Outliers, outliers_by_rank
from .findings import more_work, phase_sum, rank_impact
from .late_arrival import is_late_culprit
from .model import COMM_PREFIX
from .policy import DetectionPolicy


def find_stragglers(comparisons: list[FunctionComparison], job_step_ms: float,
                    policy: DetectionPolicy) -> tuple[LateArrivals, set[int], list[Clearance]]:
    """Late arrivers of peer collectives (:func:`.late_arrival.is_late_culprit`), and the ranks that only propagate
    someone else's delay: late arrivers that themselves waited, in another collective, at
    least ``propagated_wait_share`` of the wait they caused, and the members other than the
    late arrivers of any collective (pipeline send/recv included) whose late arrivers are not
    all such propagated victims. A group whose only late arriver was itself held up elsewhere
    says nothing of its other members (decisions table, docs/detection.md: "propagated
    victims"). Also returned: why each late arriver that is a victim is one."""
    late: LateArrivals = defaultdict(list)
    groups: list[tuple[set[int], list[int], str]] = []
    for c in comparisons:
        if c["kind"] != SpanKind.COLLECTIVE:
            continue
        names = {s["rank"] for s in c["stragglers"]}
        for s in c["stragglers"] if not c["mixed_signatures"] else []:
            if is_late_culprit(s, job_step_ms, policy, members=len(c["members"])):
                late[s["rank"]].append(LateArrival.of(s, c["function"]))
        if names:
            groups.append((names, list(c["members"]), str(c["function"])))
    waited = _waits_of(comparisons, set(late))
    propagated = set()
    cleared: dict[int, Clearance] = {}
    for rank, entries in late.items():
        caused = max(s.caused_ms_per_step for s in entries)
        own = {s.function for s in entries}
        held = [(fn, w) for fn, w in waited.get(rank, []) if fn not in own and w >= policy.propagated_wait_share * caused]
        if held:
            propagated.add(rank)
            fn, w = max(held, key=lambda h: h[1])
            cleared[rank] = Clearance(rank, "", (
                f"its late arrival only passes on a wait it had in another collective (propagated victim): "
                f"it waited {w:.1f} ms/step in {fn}, {caused:.1f} ms/step caused"),
                {"waited_in": fn, "wait_ms_per_step": round(w, 3), "caused_ms_per_step": round(caused, 3)})
    victims = set(propagated)
    for names, members, fn in groups:
        if names - propagated:  # someone there held the others up on its own account
            victims.update(r for r in members if r not in names)
            for r in members:
                if r in late and r not in names and r not in cleared:
                    culprits = sorted(names - propagated)
                    cleared[r] = Clearance(r, "", (
                        f"it waited in {fn} for rank(s) {','.join(map(str, culprits))}: its late arrival "
                        f"elsewhere passes their delay on (victim)"), {"group": fn, "held_up_by": culprits})
    return late, victims, list(cleared.values())


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


def drop_absorbed(by_rank: Outliers, late: LateArrivals,
                  comparisons: list[FunctionComparison], policy: DetectionPolicy) -> list[Clearance]:
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
    costs no step time). Returns the ranks dropped, each with why."""
    if not late or not by_rank:
        return []
    last_anywhere = {int(s["rank"]) for c in comparisons if c["kind"] == SpanKind.COLLECTIVE
                     for s in c["stragglers"]}
    absorbed: dict[int, Clearance] = {}
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
            if others and wait >= excess and float(np.median(others)) - wait >= policy.absorbed_share * excess \
                    and r not in absorbed:
                culprits = sorted(int(s["rank"]) for s in c["stragglers"] if int(s["rank"]) in late)
                absorbed[r] = Clearance(r, "", (
                    f"its extra time was absorbed while it waited for rank(s) {','.join(map(str, culprits))} in "
                    f"{c['function']}: {excess:.1f} ms/step of excess inside a {wait:.1f} ms/step wait"),
                    {"group": c["function"], "waited_for": culprits, "excess_ms_per_step": round(excess, 3),
                     "wait_ms_per_step": round(wait, 3)})
    for r in absorbed:
        del by_rank[r]
    return list(absorbed.values())


def explain_late_by_minor(by_rank: Outliers, late: LateArrivals, excluded: set[int],
                          comparisons: list[FunctionComparison], policy: DetectionPolicy) -> list[Flag]:
    """A late arriver with no outlier of its own, whose small excesses (``minor_outliers``: above
    its peers in every way but the cost a finding needs alone) add up to at least
    ``explains_share`` of the wait it causes, is explained by them: they become its outliers,
    classified as any (data imbalance when they are extra calls, a slow phase, ...), at the cost
    of the wait. Several phases each under the cost floor can together be all of a late
    arriver's delay, on a GPU rank (device or host times) as on a CPU rank (decisions table,
    docs/detection.md: "minor excesses explain a late arrival"). Returns the ranks so explained."""
    flags = []
    for rank, outs in outliers_by_rank(comparisons, "minor_outliers").items():
        if rank not in late or rank in by_rank or rank in excluded:
            continue
        caused = max(float(s.caused_ms_per_step) for s in late[rank])
        # the per-kind aggregates are disjoint phases (data loading, forward, backward, ...) and
        # add up; named functions may nest (a module inside the forward): the largest one alone
        phases = phase_sum(outs)
        explained = phases if phases > 0 else max(float(o.cost_ms_per_step) for o in outs)
        if explained >= policy.explains_share * caused:
            by_rank[rank] = outs
            flags.append(Flag(rank, "", (f"its small excesses add up to {explained:.1f} of the {caused:.1f} ms/step "
                                         f"the others wait for it: they are its outliers"),
                              {"functions": sorted({str(o.function) for o in outs}),
                               "explained_ms_per_step": round(explained, 3), "caused_ms_per_step": round(caused, 3)}))
    return flags


def late_beyond_outliers(by_rank: Outliers, late: LateArrivals, excluded: set[int],
                         policy: DetectionPolicy) -> Outliers:
    """Take out of ``by_rank`` (and return) the outliers of each late arriver that explain less
    than ``explains_share`` of the wait it causes: the step time they would give back
    (:func:`.findings.rank_impact`) is a small part of what the others wait for it, so the rest
    of its delay is elsewhere, and the rank is reported as a late entry (located by its stack
    samples) with them as evidence, not as a finding of their cause at the cost of the whole
    wait. The converse of :func:`explain_late_by_minor`: a side effect of the real delay (the
    garbage of untimed work, a GC pause) is evidence, not the cause. Not for a rank given more
    work per step than its peers (data imbalance, :func:`.findings.more_work`): more work is
    slower in every phase, the uninstrumented ones (autograd's backward) too, so the imbalance
    is the explanation of the whole wait. A GPU rank's outliers count their device and host
    times as alternatives (:func:`.findings.phase_sum`), never added (decisions table,
    docs/detection.md: "outliers that explain little of a late arrival")."""
    out: Outliers = {}
    for rank, outs in list(by_rank.items()):
        if rank not in late or rank in excluded or more_work(outs, policy.min_excess, policy.explains_share):
            continue
        caused = max(float(s.caused_ms_per_step) for s in late[rank])
        if rank_impact(outs) < policy.explains_share * caused:
            out[rank] = by_rank.pop(rank)
    return out


def uncompared_collectives(rank_windows: dict[int, RankWindow], comparisons: list[FunctionComparison]) -> set[int]:
    """Ranks whose RankWindow names a collective group this window has no comparison of
    (the window was evaluated on the timer before it came): whether such a rank waited in that
    group for someone else, a propagated victim, cannot be told, so its late entries are not
    raised from this window (decisions table, docs/detection.md: "uncompared collectives")."""
    compared = {c["function"] for c in comparisons}
    # the functions a rank names that have no comparison are few (most often none): only they are looked at
    return {int(r) for r, rw in rank_windows.items()
            if any(str(f).startswith(COMM_PREFIX) for f in set(rw.get("functions") or ()).difference(compared))}

