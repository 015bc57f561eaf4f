"""Stage 3, one window, as a pipeline: the window's facts, the diagnosis state, and the
ordered rules (:data:`RULES`) that read both and return what they add and clear.

Each rule is a small function ``(WindowFacts, Diagnosis) -> RuleOutcome``
(:mod:`.decisions`): the findings it adds, the ranks it flags (an outlier, a late arrival),
the ranks it clears with the reason in words and its evidence, and the state it hands on
(outliers per rank, late arrivals, victims ...). :func:`run` applies the rules in order,
records every outcome in the window's :class:`.decisions.DecisionTrace`, and places and
renders the findings last (:mod:`.render`). The rule families live in their own modules
(``shape.py``, ``stragglers.py``, ``group_links.py``, ``net_links.py``, ``rank_findings.py``,
``late_entries.py``, ``host_level.py``); what each needs and decides: docs/detection.md,
"The pipeline".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...schemas.records import FunctionComparison, RankWindow
from .decisions import Clearance, DecisionTrace, Flag, RuleOutcome
from .facts import LateArrivals, Outliers, outliers_by_rank
from .findings import Finding, rank_impact
from .group_links import slow_links
from .host_level import merge_host_level
from .late_entries import late_entries
from .net_links import net_link_findings
from .policy import DetectionPolicy
from .rank_findings import rank_findings
from .render import placed, rendered
from .shape import drop_stage_outliers, expectations, stage_imbalance
from .stragglers import (
    drop_absorbed,
    explain_late_by_minor,
    find_stragglers,
    late_beyond_outliers,
    uncompared_collectives,
)


@dataclass(frozen=True)
class WindowFacts:
    """What one window says: every rank's RankWindow, the comparisons, the job's step time."""

    rank_windows: Mapping[int, RankWindow]
    comparisons: list[FunctionComparison]
    job_step_ms: float
    policy: DetectionPolicy


@dataclass(frozen=True)
class Diagnosis:
    """The state the rules hand on, replaced (never edited) by each :class:`RuleOutcome`."""

    outliers: Outliers = field(default_factory=dict)
    late: LateArrivals = field(default_factory=dict)
    victims: frozenset[int] = frozenset()
    link_ranks: frozenset[int] = frozenset()
    links: tuple[Finding, ...] = ()  # the slow links, found early (their ranks clear late arrivals), added late
    unjudged: frozenset[int] = frozenset()
    partial: Outliers = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()


Rule = Callable[[WindowFacts, Diagnosis], RuleOutcome]


def _rws(facts: WindowFacts) -> dict[int, RankWindow]:
    return dict(facts.rank_windows)


def rank_outliers(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    return outliers_outcome(outliers_by_rank(facts.comparisons, "outliers"))


def outliers_outcome(by_rank: Outliers) -> RuleOutcome:
    """Rule ``rank_outliers`` given each rank's outliers (found here, or by the shards: :mod:`.shards`)."""
    flags = [Flag(r, "", f"its own functions are above its peers': {', '.join(sorted({o.function for o in outs}))}",
                  {"functions": sorted({str(o.function) for o in outs}),
                   "excess_ms_per_step": round(rank_impact(outs), 3)}) for r, outs in sorted(by_rank.items())]
    return RuleOutcome(flagged=flags, state={"outliers": by_rank})


def stage_shape(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    by_rank = {r: list(o) for r, o in d.outliers.items()}
    cleared = drop_stage_outliers(by_rank, facts.comparisons, _rws(facts))
    return RuleOutcome(cleared=cleared, state={"outliers": by_rank})


def stragglers(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    late, victims, cleared = find_stragglers(facts.comparisons, facts.job_step_ms, facts.policy)
    flags = [Flag(r, "", f"last into {', '.join(sorted({s.function for s in ss}))} more often than chance",
                  {"groups": sorted({str(s.function) for s in ss}),
                   "caused_ms_per_step": round(max(float(s.caused_ms_per_step) for s in ss), 3)})
             for r, ss in sorted(late.items())]
    return RuleOutcome(flagged=flags, cleared=cleared, state={"late": dict(late), "victims": frozenset(victims)})


def absorbed(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    by_rank = dict(d.outliers)
    return RuleOutcome(cleared=drop_absorbed(by_rank, d.late, facts.comparisons, facts.policy),
                       state={"outliers": by_rank})


def links(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    found, ranks = slow_links(facts.comparisons, _rws(facts), facts.policy)
    host_links, host_ranks = net_link_findings(facts.comparisons, _rws(facts), facts.policy)
    ranks = ranks | host_ranks
    cleared = [Clearance(r, "", "its late arrival is the slow link's: its collectives wait on the link",
                         {"links": [f.identity for f in found + host_links if r in f.ranks]})
               for r in sorted(ranks) if r in d.late and r not in d.victims]
    return RuleOutcome(cleared=cleared, state={"links": tuple(found + host_links), "link_ranks": frozenset(ranks)})


def minor_excesses(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    by_rank = dict(d.outliers)
    flags = explain_late_by_minor(by_rank, d.late, set(d.victims | d.link_ranks), facts.comparisons, facts.policy)
    return RuleOutcome(flagged=flags, state={"outliers": by_rank})


def uncompared(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    return uncompared_outcome(uncompared_collectives(_rws(facts), facts.comparisons), d)


def uncompared_outcome(unjudged: set[int] | frozenset[int], d: Diagnosis) -> RuleOutcome:
    """Rule ``uncompared`` given the ranks in a group with no comparison (found here, or by the shards)."""
    cleared = [Clearance(r, "", ("a collective group it belongs to has no comparison this window: whether it "
                                 "waited there for someone else cannot be told"), {})
               for r in sorted(unjudged) if r in d.late and r not in d.victims]
    return RuleOutcome(cleared=cleared, state={"unjudged": frozenset(unjudged)})


def partial_outliers(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    by_rank = dict(d.outliers)
    partial = late_beyond_outliers(by_rank, d.late, set(d.victims | d.link_ranks | d.unjudged), facts.policy)
    cleared = []
    for r, outs in sorted(partial.items()):
        caused = max(float(s.caused_ms_per_step) for s in d.late[r])
        cleared.append(Clearance(r, "", (f"its outliers explain only {rank_impact(outs):.1f} of the {caused:.1f} "
                                         f"ms/step the others wait for it: evidence of a late entry, not its cause"),
                                 {"functions": sorted({str(o.function) for o in outs}),
                                  "explained_ms_per_step": round(rank_impact(outs), 3),
                                  "caused_ms_per_step": round(caused, 3)}))
    return RuleOutcome(cleared=cleared, state={"outliers": by_rank, "partial": partial})


def rank_causes(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    found = rank_findings(d.outliers, d.late, _rws(facts), facts.policy)
    return RuleOutcome(added=found, state={"findings": d.findings + tuple(found)})


def late_entry(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    found, cleared = late_entries(d.late, set(d.victims | d.unjudged), set(d.outliers) | d.link_ranks,
                                  _rws(facts), facts.policy, d.partial)
    return RuleOutcome(added=found, cleared=cleared, state={"findings": d.findings + tuple(found)})


def host_merge(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    merged = merge_host_level(list(d.findings), _rws(facts), facts.policy)
    before = {f.identity: set(f.ranks) for f in d.findings}
    flags = [Flag(r, "", f"joined {f.identity}: it waited for a CPU on that host like the finding's ranks",
                  dict(f.evidence.get("cpu", {}).get(str(r), {})))
             for f in merged for r in f.ranks if r not in before.get(f.identity, set())]
    return RuleOutcome(flagged=flags, state={"findings": tuple(merged)})


def add_links(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    return RuleOutcome(added=list(d.links), state={"findings": d.findings + d.links})


def stage_work(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    found = stage_imbalance(facts.comparisons, facts.policy)
    return RuleOutcome(added=found, state={"findings": d.findings + tuple(found)})


def shared_share(facts: WindowFacts, d: Diagnosis) -> RuleOutcome:
    found = expectations(facts.comparisons, facts.job_step_ms, facts.policy)
    return RuleOutcome(added=found, state={"findings": d.findings + tuple(found)})


# The rules of one window, in order: (name, rule, what it adds or clears). Each sees only what
# the earlier ones left (docs/detection.md, "The pipeline").
RULES: tuple[tuple[str, Rule, str], ...] = (
    ("rank_outliers", rank_outliers, "flags each rank whose own functions are above its peers'"),
    ("stage_shape", stage_shape, "clears an outlier its whole pipeline stage shares"),
    ("stragglers", stragglers, "flags late arrivers; clears propagated victims and held-up members"),
    ("absorbed", absorbed, "clears extra time a rank spent while it waited for a late culprit anyway"),
    ("slow_links", links, "finds slow links (added later); clears the late arrivals of their ranks"),
    ("minor_excesses", minor_excesses, "flags small excesses that add up to a late arriver's delay"),
    ("uncompared", uncompared, "clears late arrivals of ranks in a group with no comparison"),
    ("partial_outliers", partial_outliers, "clears outliers that explain little of a late arrival"),
    ("rank_causes", rank_causes, "adds one finding per rank cause (host-level per host, imbalance per function)"),
    ("late_entries", late_entry, "adds late entries; clears late arrivers with nothing behind them"),
    ("host_level", host_merge, "merges host-level causes per host; joins contended ranks of that host"),
    ("links", add_links, "adds the slow links"),
    ("stage_imbalance", stage_work, "adds pipeline stages doing far more work than the others"),
    ("expectations", shared_share, "adds shares of every rank's step above a healthy job's"),
)


def run(facts: WindowFacts, rules: tuple[tuple[str, Rule, str], ...] = RULES) -> tuple[list[Finding], DecisionTrace]:
    """The window's findings (placed and rendered, most costly first) and its decision trace."""
    trace = DecisionTrace(ranks=tuple(sorted(int(r) for r in facts.rank_windows)))
    d = Diagnosis()
    for name, rule, _ in rules:
        outcome = rule(facts, d)
        trace.record(name, _named(outcome, name))
        d = dataclasses.replace(d, **dict(outcome.state))
    findings = [rendered(placed(f, facts.rank_windows)) for f in d.findings]
    return sorted(findings, key=lambda f: -f.impact_ms), trace


def _named(outcome: RuleOutcome, rule: str) -> RuleOutcome:
    """``outcome`` with the rule's name on every clearance and flag its rule functions left blank."""
    def name(x: Any) -> Any:
        return x if x.rule else dataclasses.replace(x, rule=rule)
    return dataclasses.replace(outcome, cleared=[name(c) for c in outcome.cleared],
                               flagged=[name(f) for f in outcome.flagged])
