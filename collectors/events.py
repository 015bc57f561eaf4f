"""Event kinds and the tuple layouts the hot path appends to the buffer.

The hot path stores plain tuples (no objects, no formatting); the batch
builder turns them into the columnar EventBatch off the training thread.

* span:      ``(SPAN, kind, name, step, start_ns, dur_ns)``
* comm:      ``(COMM, op, group, seq, nbytes, step, start_ns, dur_ns)``, ``group`` a :class:`GroupRef`
* iteration: ``(ITER, step, start_ns, dur_ns)``
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

SPAN = 0
COMM = 1
ITER = 2


class SpanKind(IntEnum):
    """Span kinds of the EventBatch schema."""

    PYTHON = 0
    DATALOADER = 1
    OPTIMIZER = 2
    FORWARD = 3
    BACKWARD = 4
    GC = 5
    CHECKPOINT = 6
    SYNCHRONIZE = 7
    USER = 8


class OpKind(IntEnum):
    """Op summary kinds of a profiling window."""

    CUDA_KERNEL = 0
    MEMCPY = 1
    MEMSET = 2
    CPU_OP = 3
    COMM_KERNEL = 4


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
