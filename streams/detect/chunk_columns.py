"""The chunk fold's columns (:mod:`.chunk_fold`): what a bad batch raises, the event types and
the packed keys' shifts, each event type's columns gathered over the chunk, and the chunk-wide
ids of names and groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...schemas.vocabulary import SpanKind

ERRORS = (KeyError, TypeError, ValueError, IndexError, OverflowError)  # what a bad batch raises (RankSummarizer counts them)
UNREADABLE = (*ERRORS, AttributeError)  # ... and what reading its columns raises (e.g. a column not a dict)
COLLECTIVE = int(SpanKind.COLLECTIVE)
DEVICE = int(SpanKind.DEVICE)
COMM, SPAN = 0, 1  # event types, in the order a batch folds them (iterations after)
RANK_SHIFT = np.int64(1) << np.int64(43)  # (rank, wall ms) packed: wall times below 2^43 ms (year 2248)
BATCH_SHIFT = np.int64(1) << np.int64(46)  # (batch, ns from its mono_ns) packed for covered_ns
REL_LIMIT = 1 << 44  # ... times within ~4.9 h of their batch's clock
ORD_SHIFT = 1 << 32  # an event's place: batch << 32 | type << 30 | index in its column
COMM_KEYS = ("op", "group", "seq", "bytes", "start_ns", "dur_ns")
SPAN_KEYS = ("kind", "name", "start_ns", "dur_ns")
ITER_KEYS = ("step", "start_ns", "dur_ns")


@dataclass
class ChunkResult:
    """What :func:`fold_chunk` did besides folding."""

    errors: dict[int, Exception] = field(default_factory=dict)  # work index -> why its batch failed
    sequential: int = 0  # batches folded alone, each a chunk of one: their chunk's columns were unreadable together
    folded: int = 0  # batches folded in all
    failure: Exception | None = None  # an unexpected error of the fold (its chunk was folded a batch at a time)


@dataclass
class Part:
    """One event type's columns over the chunk: list columns (EventBatch v1..v7) gathered into
    Python lists, array columns (v8, :mod:`...schemas.columns`) kept as arrays; joined once."""

    keys: tuple[str, ...]
    cols: list[list[Any]] = field(default_factory=list)  # per column: list values not yet in ``done``
    done: list[list[np.ndarray]] = field(default_factory=list)  # per column: array segments (lists as float64), in order
    batch: list[int] = field(default_factory=list)  # per batch: its index, repeated per event below
    lengths: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cols = [[] for _ in self.keys]
        self.done = [[] for _ in self.keys]

    def add(self, p: int, part: dict) -> bool:
        """Add batch ``p``'s columns; False (nothing added) when they are ragged."""
        cols = [part[k] for k in self.keys]
        n = len(cols[0])
        if any(len(c) != n for c in cols):
            return False
        for acc, done, c in zip(self.cols, self.done, cols, strict=True):
            if isinstance(c, np.ndarray):  # one segment, no round trip through Python ints
                if acc:
                    done.append(np.asarray(acc, dtype=np.float64))
                    acc.clear()
                done.append(c)
            else:
                acc.extend(c)
        self.batch.append(p)
        self.lengths.append(n)
        return True

    def arrays(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """(batch index per event, each column as float64), like ``EventFolder._valid``."""
        p = np.repeat(np.asarray(self.batch, np.int64), np.asarray(self.lengths, np.int64))
        out = []
        for acc, done in zip(self.cols, self.done, strict=True):
            if not done:
                out.append(np.asarray(acc, dtype=np.float64))
                continue
            tail = [np.asarray(acc, dtype=np.float64)] if acc else []
            out.append(np.concatenate(done + tail).astype(np.float64, copy=False))
        return p, out


class Names:
    """Chunk-wide ids of function names and group ids (one Python step per distinct one)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def id(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i


def count_where(r: np.ndarray, mask: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(r[mask], minlength=n) if mask.any() else np.zeros(n, np.int64)


def floor_ms(ns: np.ndarray) -> np.ndarray:
    """``x // 1_000_000`` of float ns, as Python computes it (numpy's floor_divide matches)."""
    return np.floor_divide(ns, 1e6)
