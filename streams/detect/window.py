"""Stage 3, one window: RankWindows + FunctionComparisons -> root-cause Findings and the
decision trace (the rules are :data:`.pipeline.RULES`, run by :func:`.pipeline.run`).

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

Last, each finding is placed (its rank's mesh coordinates, its GPUs) and its summary rendered
from those fields (:mod:`.render`).
"""

from __future__ import annotations

import numpy as np

from ...schemas.records import FunctionComparison, RankWindow
from .decisions import DecisionTrace
from .findings import Finding
from .pipeline import WindowFacts, run
from .policy import DetectionPolicy


def step_ms(rank_windows: dict[int, RankWindow], quantile: float = 50.0) -> float:
    """Job's step time (ms): median over ranks of each rank's ``quantile`` step time
    (nearest rank; plain Python: a rank has a handful of steps per window)."""
    return median_step_ms([s for rw in rank_windows.values() if (s := rank_step_ns(rw, quantile)) is not None])


def rank_step_ns(rw: RankWindow, quantile: float = 50.0) -> int | None:
    """One rank's ``quantile`` step time (ns, nearest rank), None without steps: what
    :func:`step_ms` takes of each rank (a shard computes it for its ranks: :mod:`.shards`)."""
    steps = rw.get("step_time_ns")
    if not steps:
        return None
    ordered = sorted(steps)
    return ordered[int(round(quantile / 100 * (len(ordered) - 1)))]  # as the record carries it


def median_step_ms(per_rank_ns: list[int]) -> float:
    """The job's step time (ms) from each rank's (:func:`rank_step_ns`): their median."""
    return float(np.median(per_rank_ns)) / 1e6 if per_rank_ns else 0.0


def diagnose_window_traced(rank_windows: dict[int, RankWindow], comparisons: list[FunctionComparison],
                           policy: DetectionPolicy) -> tuple[list[Finding], DecisionTrace]:
    """All root-cause candidates of one window, most costly first, and the decision trace that
    says which rule added or cleared each rank (:mod:`.pipeline`, :mod:`.decisions`)."""
    return run(WindowFacts(rank_windows, comparisons, step_ms(rank_windows), policy))


def diagnose_window(rank_windows: dict[int, RankWindow], comparisons: list[FunctionComparison],
                    policy: DetectionPolicy) -> list[Finding]:
    """All root-cause candidates of one window, most costly first."""
    return diagnose_window_traced(rank_windows, comparisons, policy)[0]
