"""The tuple layouts the hot path appends to the buffer (span and op kinds: schemas.vocabulary).

The hot path stores plain tuples (no objects, no formatting); the batch
builder turns them into the columnar EventBatch off the training thread.

* span:      ``(SPAN, kind, name, step, start_ns, dur_ns)``
* comm:      ``(COMM, op, group, seq, nbytes, step, start_ns, dur_ns)``, ``group`` a :class:`GroupRef`
* iteration: ``(ITER, step, start_ns, dur_ns)``
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schemas.vocabulary import OpKind

SPAN = 0
COMM = 1
ITER = 2

__all__ = ["COMM", "ITER", "SPAN", "GroupRef", "OpSummary"]


@dataclass(frozen=True)
class GroupRef:
    """A process group (or a point-to-point pair) as every member names it."""

    group_id: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class OpSummary:
    """Per-op summary of one profiling window (times in ns)."""

    kind: OpKind
    name: str
    profile_id: str
    count: int
    total_ns: int
    p50_ns: int
    p99_ns: int
    max_ns: int
    nbytes: int = 0
