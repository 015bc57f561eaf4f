"""A window's function events kept as the chunk fold's columns, grouped by function at close.

The chunk fold (:mod:`.chunk_apply`) sorts a chunk's comm and span events by (rank, window,
function, type, order) into a :class:`ChunkCols` and hands each (rank, window) its slice, a
:class:`PendingCols`, without looking at its functions: a rank's batch (one second of it) then
costs one append per window instead of one per function. :func:`group_events` groups the slices
of many windows at once -- every window a timer tick closes -- by (window, function): one
gather and one sort of all their events. The close (:mod:`.window_close`) makes the records
from those groups' columns; :func:`settle` makes them a window's per-function
:class:`.accumulate.FunctionAcc` where they are read one by one (``WindowAcc.functions``).

**The same accumulators as folding each chunk's groups in turn.** The slices are taken in fold
order and the sort is stable, so each function's durations, seqs and seq durations keep the
order the chunks gave them; its kind is the one its first group set (each event carries its
group's); its group's ranks are its last collective call's; its bytes a sum; the durations past
:data:`.accumulate.MAX_DURATIONS_PER_FUNCTION` counted as overflow, as a fold that capped them
chunk by chunk counts them. A window that holds :data:`SETTLE_EVENTS` pending events settles at
once (bounded memory: the cap applies); accumulators already settled are taken as the window's
first slice (:func:`acc_chunk`), so settling early changes nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .accumulate import MAX_DURATIONS_PER_FUNCTION, FunctionAcc
from .chunk_columns import COMM, SPAN

if TYPE_CHECKING:
    from .accumulate import WindowAcc

SETTLE_EVENTS = 65_536  # pending events past which a window settles at once
INT32 = np.iinfo(np.int32)
_serials = itertools.count()


class ChunkCols(NamedTuple):
    """A chunk's comm and span events, sorted by (rank, window, function, type, order)."""

    serial: int  # fold order of the chunk (accumulators already settled: -1, first)
    names: list[str]  # the chunk's function names: fid -> name
    fid: np.ndarray
    typ: np.ndarray  # COMM or SPAN
    val: np.ndarray  # duration (ns): a collective's time inside the call, a span's net time
    kind: np.ndarray  # the SpanKind a new accumulator of the event's function gets (its group's)
    seq: np.ndarray  # a collective call's seq (0 for spans)
    nbytes: np.ndarray  # a collective call's bytes (0 for spans)
    grp: np.ndarray  # a collective call's group: its index in ``groups`` (spans: unused)
    groups: list[list[int]]  # the groups' ranks (never mutated)
    overflow: np.ndarray | None = None  # durations already dropped, on a function's first event


class PendingCols(NamedTuple):
    """One (rank, window)'s events of a chunk: ``chunk``'s rows ``a:z``."""

    chunk: ChunkCols
    a: int
    z: int


def new_chunk(names: list[str], fid: np.ndarray, typ: np.ndarray, val: np.ndarray, kind: np.ndarray,
              seq: np.ndarray, nbytes: np.ndarray, grp: np.ndarray, groups: list[list[int]]) -> ChunkCols:
    """A chunk's sorted columns, numbered in fold order, each as narrow as its values allow (they
    wait in memory until their windows close)."""
    return ChunkCols(next(_serials), names, _narrow(fid), typ.astype(np.int8), val, _narrow(kind), seq, nbytes,
                     _narrow(grp), groups)


def _narrow(x: np.ndarray) -> np.ndarray:
    """``x`` as int32 when its values fit (ids and kinds do, in any batch a collector sends)."""
    if len(x) and (int(x.min()) < INT32.min or int(x.max()) > INT32.max):
        return x
    return x.astype(np.int32)


def acc_chunk(accs: dict[str, FunctionAcc]) -> ChunkCols:
    """Accumulators already settled as a chunk (each function's collective calls, then its spans)."""
    names = list(accs)
    fid: list[int] = []
    typ: list[int] = []
    val: list[int] = []
    kind: list[int] = []
    seq: list[int] = []
    nbytes: list[int] = []
    grp: list[int] = []
    overflow: list[int] = []
    for f, acc in enumerate(accs.values()):  # each holds an event: the fold makes none without
        n_c, n_s = len(acc.seqs), len(acc.durations)
        n = n_c + n_s
        fid += [f] * n
        typ += [COMM] * n_c + [SPAN] * n_s
        val += acc.seq_durs + acc.durations
        kind += [acc.kind] * n
        seq += acc.seqs + [0] * n_s
        nbytes += [acc.bytes] + [0] * (n - 1)
        grp += [f] * n
        overflow += [acc.overflow] + [0] * (n - 1)
    i64 = np.int64
    return ChunkCols(-1, names, np.asarray(fid, i64), np.asarray(typ, i64), np.asarray(val, i64),
                     np.asarray(kind, i64), np.asarray(seq, i64), np.asarray(nbytes, i64), np.asarray(grp, i64),
                     [acc.group_ranks for acc in accs.values()], np.asarray(overflow, i64))


@dataclass
class Grouped:
    """Many windows' events grouped by (window, function); a group's collective calls are its
    events ``a:m``, its spans ``m:z`` (sorted arrays, fold order within)."""

    names: list[str]  # function id -> name, sorted (a window's groups come in name order)
    win: np.ndarray  # per group: the window's position in the list grouped
    gid: np.ndarray  # per group: the function's id
    kind: np.ndarray  # per group: the accumulator's kind
    a: np.ndarray
    m: np.ndarray
    z: np.ndarray
    nbytes: np.ndarray  # per group: bytes of its collective calls
    overflow: np.ndarray  # per group: durations dropped before (settled) and past the cap now
    group_ranks: list[list[int]]  # per group: its last collective call's group's ranks ([]: none)
    val: np.ndarray  # per event, sorted
    seq: np.ndarray
    kept: np.ndarray  # per event: kept (a collective call, or a span within the cap)


def group_events(windows: Sequence[WindowAcc]) -> Grouped:
    """Every event of ``windows`` (their settled accumulators first, then the pending slices in
    fold order), grouped by (window, function) (module docstring)."""
    parts: dict[int, tuple[ChunkCols, list[int], list[int], list[int]]] = {}
    for k, w in enumerate(windows):
        slices = list(w.pending)
        if w.accs:
            settled = acc_chunk(w.accs)
            slices.insert(0, PendingCols(settled, 0, len(settled.fid)))
        for p in slices:
            entry = parts.get(id(p.chunk))
            if entry is None:
                entry = parts[id(p.chunk)] = (p.chunk, [], [], [])
            entry[1].append(k)
            entry[2].append(p.a)
            entry[3].append(p.z - p.a)
    chunks = sorted(parts.values(), key=lambda e: e[0].serial)
    if not any(n for *_, lengths in chunks for n in lengths):
        none = np.zeros(0, np.int64)
        return Grouped([], none, none, none, none, none, none, none, none, [], none, none, none.astype(bool))
    names = sorted(set().union(*(c.names for c, *_ in chunks)))
    gid_of = {n: i for i, n in enumerate(names)}
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("win", "gid", "typ", "val", "kind", "seq", "nbytes",
                                                           "member", "overflow")}
    members: list[list[int]] = []
    for c, ks, firsts, lengths in chunks:
        n = np.asarray(lengths, np.int64)
        idx = np.repeat(np.asarray(firsts, np.int64) - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
        cols["win"].append(np.repeat(np.asarray(ks, np.int64), n))
        cols["gid"].append(np.asarray([gid_of[x] for x in c.names], np.int64)[c.fid[idx]])
        for key, col in (("typ", c.typ), ("val", c.val), ("kind", c.kind), ("seq", c.seq), ("nbytes", c.nbytes)):
            cols[key].append(col[idx])
        cols["member"].append(c.grp[idx] + len(members))
        members += c.groups
        cols["overflow"].append(c.overflow[idx] if c.overflow is not None else np.zeros(len(idx), np.int64))

    def gathered(key: str) -> np.ndarray:  # one column at a time: the events of a tick's windows are many
        return np.concatenate(cols.pop(key))

    settled_before = any(c.overflow is not None for c, *_ in chunks)
    win, gid = gathered("win"), gathered("gid")
    typ = gathered("typ")
    order = np.lexsort((np.arange(len(win)), typ != COMM, gid, win))  # a function's calls first, each in fold order
    win, gid, is_comm = win[order], gid[order], typ[order] == COMM
    del typ
    starts = np.flatnonzero(np.append(True, (win[1:] != win[:-1]) | (gid[1:] != gid[:-1])))
    ends = np.append(starts[1:], len(win))
    m = starts + np.add.reduceat(is_comm.astype(np.int64), starts)
    # a function's spans past the cap are dropped and counted (collective calls are all kept)
    place = np.arange(len(win)) - np.repeat(m, ends - starts)
    kept = is_comm | (place < MAX_DURATIONS_PER_FUNCTION)
    del place
    overflow = np.add.reduceat((~kept).astype(np.int64), starts)
    if settled_before:  # accumulators settled before: what they had dropped
        overflow += np.add.reduceat(gathered("overflow")[order], starts)
    nbytes = np.add.reduceat(np.where(is_comm, gathered("nbytes")[order], 0), starts)
    # the accumulator's kind: its first event's in fold order (a call, or a span folded before any call)
    first = np.where((m > starts) & ((m == ends) | (order[starts] < order[np.minimum(m, len(win) - 1)])), starts, m)
    kind = gathered("kind")[order[first]]
    last_call = gathered("member")[order[np.maximum(m - 1, 0)]].tolist()
    group_ranks = [members[x] if has else [] for x, has in zip(last_call, (m > starts).tolist(), strict=True)]
    val = gathered("val")[order]
    seq = gathered("seq")[order]
    return Grouped(names, win[starts], gid[starts], kind, starts, m, ends, nbytes, overflow, group_ranks, val, seq, kept)


def settle(windows: Sequence[WindowAcc]) -> None:
    """Group every pending slice of ``windows`` into their functions' accumulators."""
    windows = [w for w in windows if w.pending]
    if not windows:
        return
    g = group_events(windows)
    val, seq = g.val.tolist(), g.seq.tolist()
    for w in windows:
        w.accs = {}
        w.pending = []
        w.pending_events = 0
    rows = zip(g.win.tolist(), g.gid.tolist(), g.kind.tolist(), g.a.tolist(), g.m.tolist(), g.z.tolist(),
               g.nbytes.tolist(), g.overflow.tolist(), g.group_ranks, strict=True)
    for k, f, kind, a, m, z, nb, over, ranks in rows:
        top = min(z, m + MAX_DURATIONS_PER_FUNCTION)
        windows[k].accs[g.names[f]] = FunctionAcc(kind, durations=val[m:top], seqs=seq[a:m], seq_durs=val[a:m],
                                                  group_ranks=ranks, bytes=nb, overflow=over)
