"""Stage 3 sharded: one job's window diagnosed in shards of ranks, then merged into the same
findings, summaries, evidence and decision trace as :func:`.window.diagnose_window_traced`.

**Why shards of ranks, contiguous.** No split of a TP x PP x DP job keeps every rule's
evidence in one shard: a rank is a member of a TP group, a pipeline stage and a DP group, and
the rules follow a delay across them (a straggler's late arrival in its DP group is cleared as
a propagated victim by its wait in its TP group, :func:`.stragglers.find_stragglers`; a stage's
shape spans every DP replica; a CPU verdict compares a rank with every other rank). So a shard
is a contiguous range of ranks (``rank * shards // world``): it holds each rank's own record
whole -- the ranks of one host and of one TP group (torchrun numbers a host's local ranks, and
Megatron its TP group, contiguously) fall in one shard --, its Kafka key (job, shard) follows
from the rank and the world size its own record carries, with no layout to know, and every rule that compares a rank with peers in
other groups runs once, at the merge, on the evidence the shards hand on.

**A shard** (:func:`diagnose_shard`: a pure function of a :class:`ShardInput` to a
:class:`ShardResult`, both plain frozen records of dicts, ints and strings, picklable, so it runs
in a process pool or on another worker) does each rank's own work, the part of a window's
diagnosis that grows with every rank: rule ``rank_outliers`` for its ranks (their outlier
entries of the non-collective comparisons, typed once), rule ``uncompared`` (its ranks whose
RankWindow names a collective group with no comparison this window), each rank's step time
(the job's is their median) and the functions each rank sent patterns of (the window's
readiness, :mod:`.job_windows`). **The merge** (:func:`merge`) runs everything that needs the
whole job, in :data:`.pipeline.RULES` order, with the shards' results standing in for those two
rules: stage shapes, stragglers and their victims across groups, absorbed excesses, slow links
(sibling groups), minor excesses, partial outliers, rank causes with CPU and GPU verdicts
against the job's peers, late entries, host-level merges across a host's ranks, stage
imbalance and expectations; then placing and rendering. The diagnoser keeps the cross-window
state (incidents, regressions, hangs, periodic stalls) as before.

**Equal by construction.** A shard's outliers keep their positions (comparison, entry), so
the merge rebuilds rank -> outliers in the order one pass over the comparisons makes; the
RankWindows keep the order the window received them; step times, uncompared ranks and
pattern counts are a median, a union and a sum. tests/unit/streams/detect/test_shards.py
holds sharded and unsharded diagnosis equal over recorded real runs and a synthetic job.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...schemas.records import FunctionComparison, RankWindow
from ...schemas.vocabulary import SpanKind
from .decisions import DecisionTrace, RuleOutcome
from .facts import Outlier, Outliers
from .findings import Finding
from .model import COMM_PREFIX
from .pipeline import RULES, Diagnosis, Rule, WindowFacts, outliers_outcome, run, uncompared_outcome
from .policy import DetectionPolicy
from .rank_records import pattern_functions
from .window import median_step_ms, rank_step_ns

# one outlier entry of a non-collective comparison: (comparison's position in the window,
# entry's position in its list, function, SpanKind, the RankOutlier entry)
OutlierEntry = tuple[int, int, str, int, Mapping[str, Any]]
Mapper = Callable[[Callable[["ShardInput"], "ShardResult"], Iterable["ShardInput"]], Iterable["ShardResult"]]


@dataclass(frozen=True)
class ShardInput:
    """What one shard of a job's window reads: its ranks' RankWindows (with each one's position
    in the window), their outlier entries, and the names of the functions compared this window."""

    shard: int
    rank_windows: Mapping[int, RankWindow]
    positions: Mapping[int, int]  # rank -> its position among the window's RankWindows
    outlier_entries: tuple[OutlierEntry, ...]
    compared: frozenset[str]


@dataclass(frozen=True)
class ShardResult:
    """One shard's part of the window's diagnosis: rule ``rank_outliers`` and rule ``uncompared``
    for its ranks, each rank's step time, the pattern functions named, and the RankWindows the
    merge's job-wide rules read."""

    shard: int
    outliers: tuple[tuple[int, int, Outlier], ...]  # (comparison position, entry position, outlier)
    uncompared: frozenset[int]
    step_ns: tuple[int, ...]  # each rank's median step time, of the ranks with steps
    named: Counter[str]  # function -> ranks whose RankWindow names it
    rank_windows: Mapping[int, RankWindow]
    positions: Mapping[int, int]


@dataclass(frozen=True)
class Merged:
    """The window's diagnosis from its shards: findings (most costly first), the decision trace,
    the job's step time and the pattern functions named (as the unsharded path has them)."""

    findings: list[Finding]
    trace: DecisionTrace
    job_step_ms: float
    named: Counter[str]


def shard_count(ranks: int, policy: DetectionPolicy) -> int:
    """How many shards a window of ``ranks`` ranks is split into: one per
    ``diagnose_shard_ranks`` ranks (0: never split)."""
    if policy.diagnose_shard_ranks <= 0 or ranks <= policy.diagnose_shard_ranks:
        return 1
    return math.ceil(ranks / policy.diagnose_shard_ranks)


def shard_of(rank: int, world: int, shards: int) -> int:
    """The shard of ``rank`` in a job of ``world`` ranks: contiguous ranges of ranks."""
    return min(rank * shards // max(world, 1), shards - 1)


def split(rank_windows: Mapping[int, RankWindow], comparisons: list[FunctionComparison],
          shards: int) -> list[ShardInput]:
    """The window's inputs cut into ``shards`` :class:`ShardInput` (empty shards left out)."""
    world = max([int(r) + 1 for r in rank_windows] + [int(rw.get("world_size", 0) or 0) for rw in rank_windows.values()],
                default=0)  # a window of comparisons only: its outlier entries, one shard's
    rws: list[dict[int, RankWindow]] = [{} for _ in range(shards)]
    pos: list[dict[int, int]] = [{} for _ in range(shards)]
    for i, (rank, rw) in enumerate(rank_windows.items()):
        s = shard_of(int(rank), world, shards)
        rws[s][rank] = rw
        pos[s][rank] = i
    entries: list[list[OutlierEntry]] = [[] for _ in range(shards)]
    for ci, c in enumerate(comparisons):
        if c["kind"] != SpanKind.COLLECTIVE:
            for ei, o in enumerate(c.get("outliers") or []):
                entries[shard_of(int(o["rank"]), world, shards)].append((ci, ei, c["function"], c["kind"], o))
    compared = frozenset(str(c["function"]) for c in comparisons)
    return [ShardInput(s, rws[s], pos[s], tuple(entries[s]), compared)
            for s in range(shards) if rws[s] or entries[s]]


def diagnose_shard(inp: ShardInput) -> ShardResult:
    """One shard's part (see the module docstring): pure, and the same wherever it runs."""
    outliers = tuple((ci, ei, Outlier.of(o, function, kind)) for ci, ei, function, kind, o in inp.outlier_entries)
    uncompared = frozenset(int(r) for r, rw in inp.rank_windows.items()
                           if any(str(f).startswith(COMM_PREFIX) and f not in inp.compared
                                  for f in rw.get("functions") or []))
    steps = tuple(s for rw in inp.rank_windows.values() if (s := rank_step_ns(rw)) is not None)
    named: Counter[str] = Counter()
    for rw in inp.rank_windows.values():
        named.update(pattern_functions(rw))
    return ShardResult(inp.shard, outliers, uncompared, steps, named, inp.rank_windows, inp.positions)


def merge(results: Iterable[ShardResult], comparisons: list[FunctionComparison], policy: DetectionPolicy) -> Merged:
    """The window's diagnosis from its shards' results (see the module docstring)."""
    results = list(results)
    placed = sorted((p, r, res.rank_windows[r]) for res in results for r, p in res.positions.items())
    rank_windows = {r: rw for _, r, rw in placed}
    by_rank: Outliers = defaultdict(list)
    for _, _, o in sorted((x for res in results for x in res.outliers), key=lambda x: (x[0], x[1])):
        by_rank[o.rank].append(o)
    uncompared = frozenset().union(*(res.uncompared for res in results))
    job_step = median_step_ms([s for res in results for s in res.step_ns])
    named: Counter[str] = Counter()
    for res in results:
        named.update(res.named)
    findings, trace = run(WindowFacts(rank_windows, comparisons, job_step, policy), _rules(by_rank, uncompared))
    return Merged(findings, trace, job_step, named)


def diagnose_sharded(rank_windows: Mapping[int, RankWindow], comparisons: list[FunctionComparison],
                     policy: DetectionPolicy, shards: int, mapper: Mapper = map) -> Merged:
    """Split, run each shard (``mapper``: ``map``, or a process pool's), merge."""
    return merge(mapper(diagnose_shard, split(rank_windows, comparisons, shards)), comparisons, policy)


def _rules(by_rank: Outliers, uncompared: frozenset[int]) -> tuple[tuple[str, Rule, str], ...]:
    """:data:`.pipeline.RULES` with the shards' results in place of the two rules they ran."""
    def given_outliers(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
        return outliers_outcome(by_rank)

    def given_uncompared(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
        return uncompared_outcome(uncompared, d)

    given: dict[str, Rule] = {"rank_outliers": given_outliers, "uncompared": given_uncompared}
    return tuple((name, given.get(name, rule), doc) for name, rule, doc in RULES)

