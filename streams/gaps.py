"""Gaps and drops of every rank as worker metrics, with labels that stay few.

Each rank's summarizer keeps its transport health: ``lost_batches``
(sequence-number gaps it found) and ``dropped_events`` (the running total the
rank's collector writes in every batch header, plus what came too late for its window). Exported per rank, a 4,000-rank job would make
4,000 series per metric, and a fleet of such jobs a Prometheus problem. So
this exports per **job** (label ``training_job``; ``job`` is Prometheus' own
target label): counters of batches lost and events dropped, summed
over its ranks as they are found, and one gauge naming the job's worst rank
(label ``rank``) with its lost batches. The per-rank numbers are in the store
(``rank_windows``, the job dashboard's collector health panel). A job's series
are removed when the worker forgets its last rank (idle), so the number of
series follows the jobs this worker serves now.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..schemas.vocabulary import EVENT_BATCH
from .context import StreamCounters
from .detect import RankSummarizer


def event_count(batch: Mapping) -> int:
    """Events in one decoded EventBatch: spans, collectives and iterations."""
    try:
        return (len(batch["spans"]["kind"]) + len(batch["comms"]["op"])
                + len(batch["iterations"]["step"]))
    except (KeyError, TypeError):
        return 0


class GapMetrics:
    """Turns the summarizers' per-rank transport health into per-job metrics (module docstring)."""

    def __init__(self, counters: StreamCounters):
        self.counters = counters
        self._ranks: dict[str, dict[int, tuple[int, int]]] = {}  # job -> rank -> (lost, dropped)
        self._worst: dict[str, tuple[int, int]] = {}  # job -> (rank, lost) exported

    def batch_in(self, job: str, rank: int, lost: int, dropped: int, batch: Mapping) -> None:
        """After an EventBatch of ``job``/``rank`` was folded in: count its events and what its
        rank lost (``lost``: batches missing so far) or dropped (``dropped``: its collector's total)."""
        self.counters.inc(StreamCounters.events_in, by=event_count(batch))
        ranks = self._ranks.setdefault(job, {})
        prev_lost, prev_dropped = ranks.get(rank, (0, 0))
        ranks[rank] = (lost, dropped)
        if lost > prev_lost:
            self.counters.inc(StreamCounters.batches_lost, job, by=lost - prev_lost)
            self._update_worst(job, rank, lost)
        if dropped != prev_dropped:  # a smaller total: the collector restarted and counts anew
            new = dropped - prev_dropped if dropped > prev_dropped else dropped
            if new > 0:
                self.counters.inc(StreamCounters.events_dropped, job, by=new)

    def _update_worst(self, job: str, rank: int, lost: int) -> None:
        worst = self._worst.get(job)
        if worst is not None and worst[0] != rank and worst[1] >= lost:
            return
        if worst is not None and worst[0] != rank:
            self.counters.remove(StreamCounters.worst_rank_batches_lost, job)
        self._worst[job] = (rank, lost)
        self.counters.set(StreamCounters.worst_rank_batches_lost, lost, job, str(rank))

    def forget(self, job: str, rank: int) -> None:
        """The worker dropped this rank (idle); the job's series go with its last rank."""
        ranks = self._ranks.get(job)
        if ranks is None:
            return
        ranks.pop(rank, None)
        if ranks:
            return
        del self._ranks[job]
        self._worst.pop(job, None)
        for counter in (StreamCounters.batches_lost, StreamCounters.events_dropped,
                        StreamCounters.worst_rank_batches_lost):
            self.counters.remove(counter, job)


class SummarizerGaps:
    """The summarize stage's observer (``agents.stage.Observer``): each summarizer's transport
    health, after every EventBatch it folds in, into :class:`GapMetrics`; its rank forgotten
    when the worker drops it."""

    def __init__(self, counters: StreamCounters):
        self.counters = counters
        self.metrics = GapMetrics(counters)

    def fed(self, s: RankSummarizer, name: str, record: Mapping) -> None:
        if name == EVENT_BATCH:
            self.metrics.batch_in(s.job, s.rank, s.health.lost_batches, s.collector_dropped, record)
            if record.get("final") and s.ended:  # its windows were closed as it was folded in
                self.counters.inc(StreamCounters.ranks_ended)
                self.counters.inc(StreamCounters.windows_closed_at_end, by=s.closed_at_end_pending())

    def dropped(self, s: RankSummarizer) -> None:
        self.metrics.forget(s.job, s.rank)
