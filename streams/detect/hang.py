"""Who a hung job waits for: the ranks that never entered the collective the others wait in.

While no rank completes an iteration, each rank is one of:

* **dead**: its batches stopped entirely (no heartbeat for more than ``dead_after_heartbeats``
  x ``HEARTBEAT_S``) while the others keep sending: its process died or stopped reporting;
* **waiting**: inside a collective: its pending call is in flight (an entry marker,
  ``pending_in_flight``), or it is ahead of a member of its pending group (a call a member
  has not reached can only be in flight);
* **stalled**: alive (its sender thread still heartbeats) but inside no collective: its
  training thread is blocked in Python or compute.

The collective a waiting rank waits in is its pending (group, seq); the members of that
group (from the collectives compared so far, else the ranks seen in it) whose highest seq
in it is lower never entered it. Those that are dead or stalled are the culprits; members
that are themselves waiting elsewhere are victims of the same culprits and are never named.
A rank's state is its latest RankWindow (a dead rank's is the last one it sent). Its
current stack is the user-code frames its stack sampler saw most in its latest window
with samples (a stalled training thread keeps being sampled: the frame it is stuck in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ...schemas.records import FunctionComparison, RankWindow
from ...schemas.vocabulary import HEARTBEAT_S
from .cpu_evidence import top_frames
from .model import comm_op


def flight_records(text: str) -> list[dict]:
    """A RankWindow's ``flight_records_json``; [] when it is not a JSON list of objects."""
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [dict(e) for e in value if isinstance(e, dict)] if isinstance(value, list) else []


@dataclass
class RankSeen:
    """The latest state of one rank (plain, bounded)."""

    pending_group: str = ""
    pending_seq: int = -1
    in_flight: bool = False
    last_function: str = ""
    host: str = "?"
    gpu: int = -1
    silent_windows: int = 0  # consecutive evaluated windows without one of its batches
    stack: list[dict] = field(default_factory=list)  # top user frames of its latest sampled window
    flight: list[dict] = field(default_factory=list)  # its latest Flight Recorder entries (pending collectives)


@dataclass
class HangState:
    """Per job: each rank's latest state, each group's members and each member's highest seq."""

    ranks: dict[int, RankSeen] = field(default_factory=dict)
    group_seq: dict[str, dict[int, int]] = field(default_factory=dict)  # group -> rank -> max seq
    members: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def note_collectives(self, comparisons: list[FunctionComparison]) -> None:
        for c in comparisons:
            if c.get("members"):
                group = c["function"].split(":", 2)[-1]
                self.members[group] = tuple(int(r) for r in c["members"])
                seqs = self.group_seq.setdefault(group, {})
                for r, s in zip(c["members"], c["member_max_seq"], strict=False):
                    seqs[int(r)] = max(int(s), seqs.get(int(r), -1))

    def note_window(self, rank_windows: dict[int, RankWindow]) -> None:
        """Each rank's latest state; ranks without a batch in this window count as silent."""
        for r, seen in self.ranks.items():
            rw = rank_windows.get(r)
            seen.silent_windows = seen.silent_windows + 1 if rw is None or not int(rw.get("batches", 0)) else 0
        for r, rw in rank_windows.items():
            seen = self.ranks.setdefault(int(r), RankSeen())
            if int(rw.get("batches", 0)) or not seen.pending_group:
                seen.pending_group = str(rw.get("pending_group", ""))
                seen.pending_seq = int(rw.get("pending_seq", -1))
                seen.in_flight = bool(rw.get("pending_in_flight", False))
                seen.last_function = str(rw.get("last_function", "")) or seen.last_function
                seen.host, seen.gpu = str(rw.get("host", "?")), int(rw.get("gpu", -1))
            if int(rw.get("stack_samples", 0)) > 0:
                seen.stack = top_frames(rw) or seen.stack
            if rw.get("flight_records_json"):
                seen.flight = flight_records(str(rw["flight_records_json"])) or seen.flight

    def dead(self, window_s: float, dead_after_heartbeats: float) -> list[int]:
        """Ranks silent for more than ``dead_after_heartbeats`` heartbeat intervals while some rank still reports."""
        limit = dead_after_heartbeats * HEARTBEAT_S
        gone = sorted(r for r, s in self.ranks.items() if s.silent_windows * window_s > limit)
        return gone if len(gone) < len(self.ranks) else []

    def highest(self, rank: int, group: str) -> int:
        seen = self.ranks.get(rank)
        own = seen.pending_seq if seen is not None and seen.pending_group == group else -1
        return max(own, self.group_seq.get(group, {}).get(rank, -1))

    def group_members(self) -> dict[str, set[int]]:
        """Members of every group a rank is pending in (compared members, seqs seen, pending ranks)."""
        out: dict[str, set[int]] = {}
        for r, s in self.ranks.items():
            if s.pending_group:
                out.setdefault(s.pending_group, set()).add(r)
        for g, ranks in out.items():
            ranks.update(self.members.get(g, ()), self.group_seq.get(g, {}))
        return out


@dataclass
class Wait:
    """One collective ranks wait in and the members that never entered it."""

    group: str
    seq: int
    collective: str
    waiting: list[int]
    missing: set[int]


@dataclass
class HangVerdict:
    culprits: list[int]  # dead + stalled ranks the waiting ones wait for
    dead: list[int]
    waits: list[Wait]
    everyone_outside: bool  # nobody is inside a collective and nobody died


def waiting_ranks(state: HangState, dead: set[int], members: dict[str, set[int]]) -> dict[int, tuple[str, int]]:
    """Alive ranks inside a collective: rank -> (group, seq) it is in.

    A rank is inside when its pending call is in flight (an entry marker). Being *ahead* of a
    member of its pending group stands in for the marker only when no rank of the job sent
    one (collectors without entry markers): a member's highest seq in a group it has left
    for another group is known only from the last comparison, often a few calls behind, so a
    rank that completed its calls looked "ahead" of it and was taken for a waiting one
    (decisions table, docs/detection.md: "inside a collective"). GPU ranks send entry markers
    for collectives pending on their device, CPU ranks for calls not returned."""
    markers = any(s.in_flight for r, s in state.ranks.items() if r not in dead)
    lowest: dict[str, list[tuple[int, int]]] = {}  # group -> its two lowest (highest seq, rank)
    for g, ranks in members.items():
        lowest[g] = sorted((state.highest(m, g), m) for m in ranks)[:2]
    out: dict[int, tuple[str, int]] = {}
    for r, s in state.ranks.items():
        if r in dead or not s.pending_group:
            continue
        g, seq = s.pending_group, s.pending_seq
        ahead = not markers and any(h < seq for h, m in lowest[g] if m != r)
        if s.in_flight or ahead:
            out[r] = (g, seq)
    return out


def verdict(state: HangState, window_s: float, dead_after_heartbeats: float) -> HangVerdict:
    dead = state.dead(window_s, dead_after_heartbeats)
    members = state.group_members()
    waiting = waiting_ranks(state, set(dead), members)
    by_group: dict[str, list[int]] = {}
    for r, (g, _) in waiting.items():
        by_group.setdefault(g, []).append(r)
    waits = []
    for g, ranks in by_group.items():
        front = max(waiting[r][1] for r in ranks)
        inside = set(ranks)
        missing = {m for m in members[g] if m not in inside and state.highest(m, g) < front}
        blocked = {m for m in missing if m not in waiting}
        seq = min((state.highest(m, g) + 1 for m in blocked or missing), default=front)
        fn = next((state.ranks[r].last_function for r in sorted(ranks)
                   if comm_op(state.ranks[r].last_function)), "")
        waits.append(Wait(g, min(seq, front), comm_op(fn) or "collective", sorted(ranks), missing))
    waits.sort(key=lambda w: (-len(w.waiting), w.group))
    culprits = sorted(set(dead) | {m for w in waits for m in w.missing if m not in waiting})
    return HangVerdict(culprits, dead, waits, not waiting and not dead)
