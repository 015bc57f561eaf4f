"""The fold: EventBatches folded into their ranks' windows a chunk at a time, with numpy.

The product's only fold of events (a single batch, ``RankSummarizer.add_events``, is a chunk of
one). The agent takes its input 500 messages at a time; :func:`fold_chunk` folds all of them
together: the columns of every batch concatenated, every check, wall time, window and function
name worked out with numpy over the whole chunk, and what is left in Python is one step per
distinct name of a batch, per (rank, window, function) group (an ``extend`` of its accumulator)
and per rank -- never one per event of a running job. The state it leaves is the state folding
the batches one event at a time, in order, leaves, counter for counter:
``tests/unit/streams/detect/reference_fold.py`` keeps that event-at-a-time fold as the oracle,
and ``test_fold_equivalence.py`` and ``test_chunk_fold.py`` hold the fold to it over random
chunks of many ranks, with every kind of bad value, calls out of order and too many windows.

What depends on the order of one rank's events (:mod:`.chunk_order`):

* the rank's latest event (``RankProgress.note_event``): the greatest wall time, the last in
  order among equal ones, when it is not older than the one before the chunk;
* its pending collective (``RankProgress.note_entry``): when each call either repeats the pending
  one or replaces it (calls come in order: the usual case), the last call is pending, in flight
  when every repeat of it since it became pending was an entry marker; a rank with a call that
  does neither has its calls taken in turn (one Python step per call of that rank);
* the windows: an event is late exactly when its window lies below the lowest one open; a rank
  with no window yet has its first window fixed by its first data in the order one batch folds
  them (collectives, spans, iterations, then the batch's own time when it sent nothing) -- so
  such a rank's first batch is folded in a round before its others (:func:`_round`); a rank that
  would open more windows than may be open opens the first new ones in the fold's order, and the
  events of the others are counted and dropped (``too_many_open_windows``), as one at a time.

**Rejected whole.** A batch with values no collector sends -- a plausible time before 1970 or
after 2248, a name index beyond 2^20, a span kind that is not a whole number, a collective seq
or step that is not a number, a time 2^44 ns from its clock, columns that are not there -- is
counted as a bad batch (``bad_batch:<type>``) and none of it is folded; the chunk is planned again
without it. A chunk whose columns cannot be read together (not numbers) is folded a batch at a
time, each a chunk of one, so only the unreadable batch is rejected (``ChunkResult.sequential``
counts the batches folded so).

Modules: :func:`fold_chunk` here; :mod:`.chunk_columns` (the columns, event types, packed keys'
shifts), :mod:`.chunk_plan` (gathering, and what every event does), :mod:`.chunk_order` (what
depends on the order of a rank's events), :mod:`.chunk_apply` (the folders changed),
:class:`.rank_events.RankFold` (what a rank's events are folded into, and a batch's host evidence).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .chunk_apply import apply
from .chunk_columns import (
    BATCH_SHIFT,
    COLLECTIVE,
    COMM,
    COMM_KEYS,
    DEVICE,
    ERRORS,
    ITER_KEYS,
    ORD_SHIFT,
    RANK_SHIFT,
    REL_LIMIT,
    SPAN,
    SPAN_KEYS,
    UNREADABLE,
    ChunkResult,
)
from .chunk_plan import Plan
from .rank_events import RankFold

__all__ = [  # the fold's names, importable from here as before the split
    "BATCH_SHIFT", "COLLECTIVE", "COMM", "COMM_KEYS", "DEVICE", "ERRORS", "ITER_KEYS", "MAX_BATCHES", "ORD_SHIFT",
    "RANK_SHIFT", "REL_LIMIT", "SPAN", "SPAN_KEYS", "UNREADABLE", "ChunkResult", "fold_chunk",
]

MAX_BATCHES = 1 << 16  # batches folded at once at most (the batch index is packed above the times)


def fold_chunk(work: Sequence[tuple[RankFold, dict]]) -> ChunkResult:
    """Fold ``work``'s batches (each rank's in order) into their folders; see the module docstring."""
    if len(work) > MAX_BATCHES:  # in parts, in order: each rank's batches still come in order
        parts = [fold_chunk(work[i:i + MAX_BATCHES]) for i in range(0, len(work), MAX_BATCHES)]
        return ChunkResult(errors={i * MAX_BATCHES + p: e for i, r in enumerate(parts) for p, e in r.errors.items()},
                           sequential=sum(r.sequential for r in parts), folded=len(work),
                           failure=next((r.failure for r in parts if r.failure is not None), None))
    result = ChunkResult(folded=len(work))
    waiting = list(range(len(work)))
    while waiting:
        now, waiting = _round(work, waiting)
        by_policy: dict[int, list[int]] = {}
        for p in now:
            by_policy.setdefault(id(work[p][0].policy), []).append(p)
        for part in by_policy.values():
            _fold_round([work[p] for p in part], part, result)
    return result


def _round(work: Sequence[tuple[RankFold, dict]], waiting: list[int]) -> tuple[list[int], list[int]]:
    """The positions folded in the next round, and those that wait: a rank with no window yet (its
    first batch ever, or every one so far without plausible data) has one batch in the round --
    the first data fixes the first window -- and its later ones wait; each rank's stay in order."""
    now: list[int] = []
    later: list[int] = []
    fresh: set[int] = set()
    held: set[int] = set()
    for p in waiting:
        folder = work[p][0]
        if id(folder) in held:
            later.append(p)
        elif folder.windows.next_window is None and id(folder) in fresh:
            held.add(id(folder))
            later.append(p)
        else:
            if folder.windows.next_window is None:
                fresh.add(id(folder))
            now.append(p)
    return now, later


def _fold_round(work: list[tuple[RankFold, dict]], at: list[int], result: ChunkResult) -> None:
    """Fold one round: plan, and apply the plan when no batch of it is rejected; a rejected batch is
    left out (its error recorded under its position ``at``) and the rest planned again."""
    while work:
        rank_of: dict[int, int] = {}
        folders: list[RankFold] = []
        batch_rank = []
        for folder, _ in work:
            r = rank_of.get(id(folder))
            if r is None:
                r = rank_of[id(folder)] = len(folders)
                folders.append(folder)
            batch_rank.append(r)
        plan = Plan(work, folders, np.asarray(batch_rank, np.int64))
        try:
            plan.build()
            plan.plan()
        except Exception as exc:  # columns that are not numbers (or a defect here): each batch alone
            if len(work) == 1:
                result.errors[at[0]] = _error(exc)
                if not isinstance(exc, UNREADABLE):
                    result.failure = exc
                return
            if not isinstance(exc, UNREADABLE):
                result.failure = exc
            result.sequential += len(work)
            for one, p in zip(work, at, strict=True):
                _fold_round([one], [p], result)
            return
        if not plan.rejected.any():
            apply(plan, result, at)
            return
        for p in np.flatnonzero(plan.rejected).tolist():
            result.errors[at[p]] = _error(plan.why[p])
        keep = np.flatnonzero(~plan.rejected).tolist()
        work, at = [work[p] for p in keep], [at[p] for p in keep]


def _error(why: str | Exception) -> Exception:
    """What a rejected batch is counted as (``bad_batch:<type>``): what reading it raised, or a
    ValueError that says why."""
    if isinstance(why, ERRORS):
        return why
    if isinstance(why, Exception):
        return TypeError(f"EventBatch unreadable: {type(why).__name__}: {why}")
    return ValueError(f"EventBatch rejected: {why}")
