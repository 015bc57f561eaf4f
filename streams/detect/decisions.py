"""The typed records of a window's diagnosis and its decision trace.

A rule of the pipeline (:mod:`.pipeline`) reads the window's facts and the diagnosis so far and
returns a :class:`RuleOutcome`: the findings it adds, the ranks it flags (an outlier, a late
arrival: something that may become a finding), and the ranks it clears, each
:class:`Clearance` with the reason in words and the evidence the rule used. The pipeline
applies the outcome and writes every step into a :class:`DecisionTrace`: per rank, which rule
flagged it, which added it to which finding, which cleared it and why. A rank no rule
touched was never flagged: no outlier and no late arrival against its peers.

The trace goes out with the incidents (``evidence.decisions``, bounded by
:func:`DecisionTrace.for_finding`), so ``perftracker diagnose --job J --explain RANK`` can say
why a rank was or was not named (:mod:`...sinks.explain`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .findings import Finding

ADDED, CLEARED, FLAGGED = "added", "cleared", "flagged"
# what a rank that no rule touched was not: said for it by --explain and the trace
NOT_FLAGGED = "no outlier and no late arrival against its peers"
# entries of a window's trace an incident's evidence carries (its own ranks' come first)
MAX_STORED_DECISIONS = 32


@dataclass(frozen=True)
class Clearance:
    """A rule took ``rank`` out of the diagnosis (or one piece of evidence of it): why, in
    words, and the evidence it used."""

    rank: int
    rule: str
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Flag:
    """A rule found something of ``rank`` that may become a finding (an outlier, a late arrival)."""

    rank: int
    rule: str
    what: str
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RuleOutcome:
    """What one rule did to one window: findings it adds, ranks it flags and clears, and the
    diagnosis state it replaces (field name of :class:`.pipeline.Diagnosis` -> new value)."""

    added: list[Finding] = field(default_factory=list)
    cleared: list[Clearance] = field(default_factory=list)
    flagged: list[Flag] = field(default_factory=list)
    state: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """One line of the trace: ``rule`` ``action`` (added, cleared, flagged) ``rank``."""

    rank: int
    rule: str
    action: str
    reason: str
    identity: str = ""  # the finding it was added to (action added)
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.rank, "rule": self.rule, "action": self.action, "reason": self.reason}
        if self.identity:
            out["identity"] = self.identity
        if self.evidence:
            out["evidence"] = dict(self.evidence)
        return out

    def words(self) -> str:
        """'<rule> cleared it: <reason>', in words."""
        what = {ADDED: f"named it in {self.identity}" if self.identity else "named it", CLEARED: "cleared it",
                FLAGGED: "flagged it"}.get(self.action, self.action)
        return f"rule {self.rule} {what}: {self.reason}"


@dataclass
class DecisionTrace:
    """Every decision of one window's diagnosis, in the order the rules made them."""

    decisions: list[Decision] = field(default_factory=list)
    ranks: tuple[int, ...] = ()  # the ranks of the window (those never flagged: NOT_FLAGGED)

    def record(self, rule: str, outcome: RuleOutcome) -> None:
        for fl in outcome.flagged:
            self.decisions.append(Decision(fl.rank, rule, FLAGGED, fl.what, evidence=fl.evidence))
        for c in outcome.cleared:
            self.decisions.append(Decision(c.rank, rule, CLEARED, c.reason, evidence=c.evidence))
        for f in outcome.added:
            self.add(rule, f)

    def add(self, rule: str, f: Finding, reason: str = "") -> None:
        why = reason or f"{f.cause.value} ({f.kind.value}) on {f.function}, ~{f.impact_ms:.1f} ms per step"
        evidence = {"cause": f.cause.value, "kind": f.kind.value, "function": f.function,
                    "impact_ms_per_step": round(float(f.impact_ms), 3)}
        for r in f.ranks:
            self.decisions.append(Decision(int(r), rule, ADDED, why, identity=f.identity, evidence=evidence))

    def of(self, rank: int) -> list[Decision]:
        return [d for d in self.decisions if d.rank == rank]

    def named(self, rank: int, findings: Iterable[Finding]) -> bool:
        return any(rank in f.ranks for f in findings)

    def explain(self, rank: int, findings: Iterable[Finding]) -> str:
        """Why ``rank`` was or was not named by ``findings`` (the window's last), in words."""
        mine = self.of(rank)
        named = [f.identity for f in findings if rank in f.ranks]
        if named:
            head = f"rank {rank} was named ({', '.join(named)})"
        elif mine:
            head = f"rank {rank} was not named"
        else:
            return f"rank {rank} was not named: {NOT_FLAGGED}"
        return head + "".join(f"; {d.words()}" for d in mine)

    def counts(self) -> Counter[tuple[str, str]]:
        """(rule, action) -> how many decisions (the per-rule counters)."""
        return Counter((d.rule, d.action) for d in self.decisions)

    def for_finding(self, f: Finding, limit: int = MAX_STORED_DECISIONS) -> list[dict[str, Any]]:
        """The entries an incident of ``f`` keeps: its own ranks' first, then the window's other
        clearances and additions (flags of ranks that became nothing are kept too: they say what
        was seen); at most ``limit``."""
        own = [d for d in self.decisions if d.rank in f.ranks]
        rest = [d for d in self.decisions if d.rank not in f.ranks and d.action != FLAGGED]
        flags = [d for d in self.decisions if d.rank not in f.ranks and d.action == FLAGGED]
        return [d.to_json() for d in (own + rest + flags)[:limit]]
