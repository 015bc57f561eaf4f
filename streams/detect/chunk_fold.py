"""Folding a chunk of EventBatches at once: one set of numpy calls for hundreds of batches.

:class:`.rank_events.EventFolder` folds a batch in one Python pass over its events (~4 us
an event, the summarize agent's largest cost). The agent takes its input 500 messages at a
time; :func:`fold_chunk` folds all of them together: the columns of every batch
concatenated, every check, wall time, window and function name worked out with numpy over
the whole chunk, and what is left in Python is one step per distinct name of a batch, per
(rank, window, function) group (an ``extend`` of its accumulator) and per rank -- never one
per event. The state it leaves is the state folding the batches one at a time, in order,
leaves, counter for counter (``tests/unit/streams/detect/test_chunk_fold.py`` holds it to
:class:`EventFolder` over random chunks of many ranks).

What depends on the order of one rank's events is worked out without a loop:

* the rank's latest event (``RankProgress.note_event``): the greatest wall time, the last
  in order among equal ones, when it is not older than the one before the chunk;
* its pending collective (``RankProgress.note_entry``): when each call either repeats the
  pending one or replaces it (calls come in order: the usual case), the last call is
  pending, in flight when every repeat of it since it became pending was an entry marker;
* the windows: with room for every window the chunk opens, an event is late exactly when its
  window lies below the lowest one open; a rank with none yet (its first batch ever, alone in
  the chunk: ``summarize.add_batches`` gives it a round of its own) has its first window fixed
  by its first data in the one-batch fold's order (collectives, spans, iterations, then the
  batch's own time when it sent nothing).

A rank for which one of these does not hold -- its first batch ever with others of it in the
chunk, a call that neither repeats nor replaces the pending one, more windows than
may be open, times or values beyond what the packed keys below hold, a batch that cannot
be read column-wise -- has its batches of the chunk folded one at a time by EventFolder,
in order (``ChunkResult.sequential`` counts them). So does every rank of a chunk whose
columns are not all numbers.

Modules: :func:`fold_chunk` here; :mod:`.chunk_columns` (the columns, event types, packed keys'
shifts), :mod:`.chunk_plan` (gathering, and what every event does), :mod:`.chunk_order` (what
depends on the order of a rank's events), :mod:`.chunk_apply` (the folders changed).
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
from .rank_events import EventFolder

__all__ = [  # the fold's names, importable from here as before the split
    "BATCH_SHIFT", "COLLECTIVE", "COMM", "COMM_KEYS", "DEVICE", "ERRORS", "ITER_KEYS", "MAX_BATCHES", "ORD_SHIFT",
    "RANK_SHIFT", "REL_LIMIT", "SPAN", "SPAN_KEYS", "UNREADABLE", "ChunkResult", "fold_chunk",
]

MAX_BATCHES = 1 << 16  # batches folded at once at most (the batch index is packed above the times)


def fold_chunk(work: Sequence[tuple[EventFolder, dict]]) -> ChunkResult:
    """Fold ``work``'s batches (each rank's in order) into their folders; see the module docstring."""
    if len(work) > MAX_BATCHES:  # in parts, in order: each rank's batches still come in order
        parts = [fold_chunk(work[i:i + MAX_BATCHES]) for i in range(0, len(work), MAX_BATCHES)]
        return ChunkResult(errors={i * MAX_BATCHES + p: e for i, r in enumerate(parts) for p, e in r.errors.items()},
                           sequential=sum(r.sequential for r in parts), folded=len(work),
                           failure=next((r.failure for r in parts if r.failure is not None), None))
    result = ChunkResult(folded=len(work))
    if not work:
        return result
    rank_of: dict[int, int] = {}
    folders: list[EventFolder] = []
    batch_rank = []
    for folder, _ in work:
        r = rank_of.get(id(folder))
        if r is None:
            r = rank_of[id(folder)] = len(folders)
            folders.append(folder)
        batch_rank.append(r)
    sequential = np.zeros(len(folders), bool)
    plan = Plan(work, folders, np.asarray(batch_rank, np.int64), sequential)
    try:
        plan.build()
        plan.plan()
    except Exception as exc:  # columns that are not numbers, or a defect here: fold one at a time
        result.failure = None if isinstance(exc, UNREADABLE) else exc
        sequential[:] = True
    if not sequential.all():
        apply(plan, result)  # changes only the ranks not folded one at a time
    for p, (folder, batch) in enumerate(work):
        if sequential[batch_rank[p]]:
            result.sequential += 1
            try:
                folder.fold(batch)
            except ERRORS as exc:
                result.errors[p] = exc
    return result
