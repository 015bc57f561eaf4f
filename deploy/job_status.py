"""`perftracker status --job J`: the ranks a job should have against the ranks that report.

A rank whose collector never attached (its node lacks the install, its launcher did not
pass the environment on) sends nothing, and nothing on that node can say so. The store
can: every RankWindow carries the job's world size, so the ranks expected are
``0 .. world_size - 1`` (the largest world size any rank reported), and the ranks
reporting are those whose last event is within ``recent_s`` of the job's newest one. The
rest are missing: never seen (no window at all), or silent for longer than ``recent_s``
while other ranks went on (dead, hung, or cut off). Measured against the job's newest
data, not the clock, so a finished job's ranks all count as reporting; ``age_s`` says how
long ago that newest data was.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..schemas.settings import Settings

DEFAULT_RECENT_S = 60.0


@dataclass(frozen=True)
class SilentRank:
    rank: int
    host: str
    behind_s: float  # how long before the job's newest event its last event was; -1: never an event


@dataclass(frozen=True)
class JobRanks:
    job: str
    world_size: int
    reporting: list[int]
    never_seen: list[int]  # expected, and no window of it in the store
    silent: list[SilentRank] = field(default_factory=list)
    age_s: float = 0.0  # the job's newest event, seconds before the store's clock
    recent_s: float = DEFAULT_RECENT_S

    @property
    def expected(self) -> list[int]:
        return list(range(self.world_size))

    @property
    def missing(self) -> list[int]:
        return sorted([*self.never_seen, *(s.rank for s in self.silent)])

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "expected": len(self.expected), "missing": self.missing}


def job_ranks(job: str, rows: list[dict[str, Any]], recent_s: float = DEFAULT_RECENT_S) -> JobRanks:
    """Expected vs reporting ranks from the ``rank_reporting`` query's rows (one per rank seen)."""
    seen = {int(r["rank"]): r for r in rows}
    world = max([int(r["world_size"]) for r in rows] + [max(seen, default=-1) + 1])
    events = [int(r["last_event_ms"]) for r in rows if int(r["last_event_ms"]) > 0]
    newest = max(events, default=0)
    reporting, silent = [], []
    for rank, r in sorted(seen.items()):
        last = int(r["last_event_ms"])
        if last > 0 and newest - last <= recent_s * 1000:
            reporting.append(rank)
        else:
            silent.append(SilentRank(rank, str(r["host"]), round((newest - last) / 1000, 1) if last > 0 else -1.0))
    now = max((int(r["now_ms"]) for r in rows), default=0)
    return JobRanks(job=job, world_size=world, reporting=reporting,
                    never_seen=[r for r in range(world) if r not in seen], silent=silent,
                    age_s=round(max(now - newest, 0) / 1000, 1) if newest else -1.0, recent_s=recent_s)


def fetch_job_ranks(settings: Settings, job: str, recent_s: float = DEFAULT_RECENT_S,
                    minutes: int = 60) -> JobRanks:
    """Read the job's RankWindows (through a running sink or the store itself); an unknown job
    is :class:`.lookup.UnknownJob`, an empty data dir :class:`.lookup.StackNotInitialised`."""
    from ..sinks.client import query
    from .lookup import reading_store, require_job

    with reading_store(settings):
        rows = query(settings, "rank_reporting", job=job, minutes=minutes)
        if not rows:
            require_job(settings, job)
    return job_ranks(job, rows, recent_s)
