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
* the windows: with the rank's first window known and room for every window the chunk
  opens, an event is late exactly when its window lies below the lowest one open.

A rank for which one of these does not hold -- its first batch ever (the first window is
fixed by it), a call that neither repeats nor replaces the pending one, more windows than
may be open, times or values beyond what the packed keys below hold, a batch that cannot
be read column-wise -- has its batches of the chunk folded one at a time by EventFolder,
in order (``ChunkResult.sequential`` counts them). So does every rank of a chunk whose
columns are not all numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...schemas.vocabulary import SpanKind
from .accumulate import MAX_DURATIONS_PER_FUNCTION, FunctionAcc, WindowAcc
from .model import comm_function, kind_function
from .rank_events import EventFolder, covered_ns

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
    sequential: int = 0  # batches folded one at a time (see the module docstring)
    folded: int = 0  # batches folded in all
    failure: Exception | None = None  # an unexpected error of the columnar fold (all went sequential)


@dataclass
class _Part:
    """One event type's columns over the chunk, gathered as Python lists first."""

    keys: tuple[str, ...]
    cols: list[list[Any]] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)  # per batch: its index, repeated per event below
    lengths: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cols = [[] for _ in self.keys]

    def add(self, p: int, part: dict) -> bool:
        """Add batch ``p``'s columns; False (nothing added) when they are ragged."""
        cols = [part[k] for k in self.keys]
        n = len(cols[0])
        if any(len(c) != n for c in cols):
            return False
        for acc, c in zip(self.cols, cols, strict=True):
            acc.extend(c)
        self.batch.append(p)
        self.lengths.append(n)
        return True

    def arrays(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """(batch index per event, each column as float64), like ``EventFolder._valid``."""
        p = np.repeat(np.asarray(self.batch, np.int64), np.asarray(self.lengths, np.int64))
        return p, [np.asarray(c, dtype=np.float64) for c in self.cols]


class _Names:
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


def _count(r: np.ndarray, mask: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(r[mask], minlength=n) if mask.any() else np.zeros(n, np.int64)


def _floor_ms(ns: np.ndarray) -> np.ndarray:
    """``x // 1_000_000`` of float ns, as Python computes it (numpy's floor_divide matches)."""
    return np.floor_divide(ns, 1e6)


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
    plan = _Plan(work, folders, np.asarray(batch_rank, np.int64), sequential)
    try:
        plan.build()
        plan.plan()
    except Exception as exc:  # columns that are not numbers, or a defect here: fold one at a time
        result.failure = None if isinstance(exc, UNREADABLE) else exc
        sequential[:] = True
    if not sequential.all():
        plan.apply(result)  # changes only the ranks not folded one at a time
    for p, (folder, batch) in enumerate(work):
        if sequential[batch_rank[p]]:
            result.sequential += 1
            try:
                folder.fold(batch)
            except ERRORS as exc:
                result.errors[p] = exc
    return result


class _Plan:
    """The chunk's columns, what every event does, and the state each rank ends in."""

    def __init__(self, work: Sequence[tuple[EventFolder, dict]], folders: list[EventFolder],
                 batch_rank: np.ndarray, sequential: np.ndarray):
        self.work, self.folders, self.batch_rank, self.sequential = work, folders, batch_rank, sequential
        pol = folders[0].policy
        self.wms, self.max_dur = pol.window_ms, pol.max_duration_s * 1e9
        self.max_dur_ms, self.slack_ms = pol.max_duration_s * 1000, pol.future_slack_ms
        self.funcs = _Names()
        self.groups = _Names()
        self._member_cache: dict[str, list[int]] = {}

    # ---- gathering ---------------------------------------------------------------------------
    def build(self) -> None:
        n = len(self.work)
        self.comms, self.spans, self.iters = _Part(COMM_KEYS), _Part(SPAN_KEYS), _Part(ITER_KEYS)
        self.offset = [0] * n  # wall_ns - mono_ns
        self.mono = [0] * n
        self.bw = [0] * n  # the batch's wall time (ms)
        self.n_names, self.n_groups = [0] * n, [0] * n
        self.raw_events = [0] * n  # spans + iterations as sent (a batch without any is a heartbeat)
        self.ragged = [0] * n
        self.has_cpu = [False] * n
        for p, (folder, batch) in enumerate(self.work):
            r = self.batch_rank[p]
            if self.sequential[r]:
                continue
            if folder.windows.next_window is None or folder.policy is not self.folders[0].policy:
                self.sequential[r] = True  # its first window is fixed by its first event
                continue
            try:
                self._gather(p, batch)
            except UNREADABLE:
                self.sequential[r] = True
        self._arrays()

    def _gather(self, p: int, batch: dict) -> None:
        wall, mono = int(batch["wall_ns"]), int(batch["mono_ns"])
        names, groups = batch["names"], batch.get("groups", [])
        comms, spans, iters = batch["comms"], batch["spans"], batch["iterations"]
        stacks = batch.get("stacks") or {}
        has_cpu = bool(batch.get("cpu") or stacks.get("frame") or batch.get("net"))  # host evidence
        raw = len(spans["kind"]) + len(iters["step"])
        n_names, n_groups = len(names), len(groups)
        self.offset[p], self.mono[p], self.bw[p] = wall - mono, mono, wall // 1_000_000
        self.n_names[p], self.n_groups[p], self.raw_events[p], self.has_cpu[p] = n_names, n_groups, raw, has_cpu
        for part, cols in ((self.comms, comms), (self.spans, spans), (self.iters, iters)):
            if not part.add(p, cols):
                self.ragged[p] += 1

    def _arrays(self) -> None:
        self.B_off = np.asarray(self.offset, np.int64)
        self.B_off_f = np.asarray(self.offset, np.float64)
        self.B_mono = np.asarray(self.mono, np.int64)
        bw = np.asarray(self.bw, np.int64)
        self.B_bw = bw
        unknown = bw == 0  # no reference time: everything plausible (EventFolder's range_ms)
        self.B_lo = np.where(unknown, -np.inf, bw - self.max_dur_ms)
        self.B_hi = np.where(unknown, np.inf, bw + self.slack_ms)
        self.B_names = np.asarray(self.n_names, np.float64)
        self.B_groups = np.asarray(self.n_groups, np.float64)
        self.cp, (self.cop, self.cgrp, self.cseq, self.cbytes, self.cstart, self.cdur) = self.comms.arrays()
        self.sp, (self.skind, self.sname, self.sstart, self.sdur) = self.spans.arrays()
        self.ip, (self.istep, self.istart, self.idur) = self.iters.arrays()
        self.R = len(self.folders)
        self.NW = np.asarray([f.windows.next_window if f.windows.next_window is not None else 0
                              for f in self.folders], np.int64)

    def _drop(self, r: np.ndarray, bad: np.ndarray) -> None:
        """Fold the ranks of ``bad`` events one batch at a time."""
        if bad.any():
            self.sequential[np.unique(r[bad])] = True

    # ---- what every event does ---------------------------------------------------------------
    def _plan_comms(self) -> None:
        cp = self.cp
        r = self.batch_rank[cp]
        op, grp, dur = self.cop, self.cgrp, self.cdur
        valid = (op >= 0) & (op < self.B_names[cp]) & (grp >= 0) & (grp < self.B_groups[cp])
        fin_start = valid & np.isfinite(self.cstart)
        fin = fin_start & np.isfinite(dur)
        with np.errstate(invalid="ignore"):
            inflight = fin & (dur < 0)
            good = fin & (dur >= 0) & (dur <= self.max_dur)
            wall = _floor_ms((self.B_off_f[cp] + self.cstart) + np.maximum(dur, 0))
        cand = inflight | good
        in_range = cand & (wall >= self.B_lo[cp]) & (wall <= self.B_hi[cp])
        self._drop(r, in_range & ~((wall >= 0) & (wall < RANK_SHIFT)))
        wall_i = np.where(in_range, wall, 0).astype(np.int64)
        wid = wall_i // self.wms
        late = good & in_range & (wid < self.NW[r])
        kept = good & in_range & ~late
        self.c = dict(r=r, p=cp, valid=valid, fin_start=fin_start, fin=fin, inflight=inflight, good=good,
                      cand=cand, in_range=in_range, wall=wall, wall_i=wall_i, wid=wid, late=late, kept=kept,
                      ord=cp * ORD_SHIFT + np.arange(len(cp)) - np.repeat(self._starts(self.comms), self.comms.lengths))
        # function and group per (batch, op, group): one Python step per distinct one
        key = (cp * (1 << 20) + np.where(valid, op, 0).astype(np.int64)) * (1 << 20) + np.where(valid, grp, 0).astype(np.int64)
        uniq, inv = np.unique(np.where(valid, key, -1), return_inverse=True)
        fid: list[int] = []
        gid: list[int] = []
        members: list[Any] = []
        for k in uniq.tolist():
            if k < 0:
                fid.append(-1)
                gid.append(-1)
                members.append(None)
                continue
            p, o, g = k >> 40, (k >> 20) & 0xFFFFF, k & 0xFFFFF
            batch = self.work[p][1]
            group = batch["groups"][g]
            group_id = str(group["group_id"])
            fid.append(self.funcs.id(comm_function(batch["names"][o], group_id)))
            gid.append(self.groups.id(group_id))
            members.append(group)
        self._drop(r, valid & ((op >= 1 << 20) | (grp >= 1 << 20)))
        self.c["fid"] = np.asarray(fid, np.int64)[inv]
        self.c["gid"] = np.asarray(gid, np.int64)[inv]
        self.c["group"] = inv
        self.c_members = members

    @staticmethod
    def _starts(part: _Part) -> np.ndarray:
        lengths = np.asarray(part.lengths, np.int64)
        return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths

    def _plan_spans(self) -> None:
        sp = self.sp
        r = self.batch_rank[sp]
        dur_f = self.sdur
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(dur_f) & (dur_f >= 0) & (dur_f <= self.max_dur)
            start = self.sstart.astype(np.int64)
        self._drop(r, ok & ~(np.abs(start) < (1 << 61)))
        dur = np.where(ok, dur_f, 0).astype(np.int64)
        valid = ok & (self.sname >= 0) & (self.sname < self.B_names[sp])
        wall = (self.B_off[sp] + start) // 1_000_000
        in_range = valid & (wall >= self.B_lo[sp]) & (wall <= self.B_hi[sp])
        self._drop(r, in_range & ~((wall >= 0) & (wall < RANK_SHIFT)))
        wid = np.where(in_range, wall, 0) // self.wms
        late = in_range & (wid < self.NW[r])
        kept = in_range & ~late
        ordv = sp * ORD_SHIFT + (1 << 30) + np.arange(len(sp)) - np.repeat(self._starts(self.spans), self.spans.lengths)
        self.s = dict(r=r, p=sp, ok=ok, valid=valid, start=start, dur=dur, wall=wall, in_range=in_range,
                      wid=wid, late=late, kept=kept, ord=ordv)
        # function per (batch, name, kind)
        name = np.where(valid, self.sname, 0).astype(np.int64)
        kind = np.where(valid, self.skind, 0)
        self._drop(r, valid & ((kind < 0) | (kind >= 1 << 16) | (kind != np.floor(kind)) | (name >= 1 << 24)))
        kind_i = np.clip(kind, 0, (1 << 16) - 1).astype(np.int64)
        key = (sp * (1 << 24) + name) * (1 << 16) + kind_i
        uniq, inv = np.unique(np.where(valid, key, -1), return_inverse=True)
        fid = []
        for k in uniq.tolist():
            if k < 0:
                fid.append(-1)
                continue
            p, n, kd = k >> 40, (k >> 16) & 0xFFFFFF, k & 0xFFFF
            fid.append(self.funcs.id(self.work[p][1]["names"][n] or kind_function(kd)))
        self.s["fid"] = np.asarray(fid, np.int64)[inv]
        self.s["kind"] = kind_i

    def _net_durations(self) -> None:
        """Span time net of the collective time nested in it, per batch (kept collectives only);
        a device span (:data:`DEVICE`) is kept whole: it is timed on the device, not between the
        host times the collectives' intervals start at."""
        c, s = self.c, self.s
        ck = c["kept"]
        cstart = self.cstart[ck].astype(np.int64)
        cend = (self.cstart[ck] + self.cdur[ck]).astype(np.int64)
        cb = self.cp[ck]
        need = s["in_range"] & (s["kind"] != DEVICE)
        a = s["start"][need]
        b = a + s["dur"][need]
        sb = self.sp[need]
        rel = [cstart - self.B_mono[cb], cend - self.B_mono[cb], a - self.B_mono[sb], b - self.B_mono[sb]]
        for k, rr in enumerate((self.batch_rank[cb], self.batch_rank[cb], self.batch_rank[sb], self.batch_rank[sb])):
            self._drop(rr, np.abs(rel[k]) >= REL_LIMIT)
            rel[k] = np.clip(rel[k], -REL_LIMIT, REL_LIMIT)  # a rank folded one at a time: its band only
        net = s["dur"].copy()
        if len(a):
            cov = covered_ns(cb * BATCH_SHIFT + rel[0], cb * BATCH_SHIFT + rel[1],
                             sb * BATCH_SHIFT + rel[2], sb * BATCH_SHIFT + rel[3])
            net[need] -= cov
        s["net"] = net

    def _plan_iterations(self) -> None:
        ip = self.ip
        r = self.batch_rank[ip]
        dur, start = self.idur, self.istart
        with np.errstate(invalid="ignore"):
            good = np.isfinite(dur) & (dur >= 0) & (dur <= self.max_dur)
            timed = good & np.isfinite(start)
            wall = _floor_ms((self.B_off_f[ip] + start) + dur)
        in_range = timed & (wall >= self.B_lo[ip]) & (wall <= self.B_hi[ip])
        self._drop(r, in_range & ~((wall >= 0) & (wall < RANK_SHIFT)))
        wall_i = np.where(in_range, wall, 0).astype(np.int64)
        wid = wall_i // self.wms
        late = in_range & (wid < self.NW[r])
        kept = in_range & ~late
        self._drop(r, kept & ~np.isfinite(self.istep))
        self.i = dict(r=r, good=good, timed=timed, in_range=in_range, wall_i=wall_i, wid=wid, late=late,
                      kept=kept, ord=ip * ORD_SHIFT + (2 << 30))

    # ---- what depends on the order of a rank's events -----------------------------------------
    def _plan_latest(self) -> None:
        """Each rank's latest event and its pending collective (see the module docstring)."""
        c, s, R = self.c, self.s, self.R
        ev_c, ev_s = c["in_range"], s["in_range"]
        # the latest event: greatest wall time, last in order among equals
        r = np.concatenate([c["r"][ev_c], s["r"][ev_s]])
        wall = np.concatenate([c["wall_i"][ev_c], s["wall"][ev_s]])
        ordv = np.concatenate([c["ord"][ev_c], s["ord"][ev_s]])
        fid = np.concatenate([c["fid"][ev_c], s["fid"][ev_s]])
        self.latest: dict[int, tuple[int, int]] = {}
        if len(r):
            order = np.lexsort((ordv, wall, r))
            last = np.flatnonzero(np.append(r[order][1:] != r[order][:-1], True))
            for j in order[last].tolist():
                self.latest[int(r[j])] = (int(wall[j]), int(fid[j]))
        # the pending collective: calls (entries) and events merged in each rank's order, the
        # latest event time before each call as a running maximum (rank packed above the time)
        cand = c["cand"]
        e_r, e_ord = c["r"][cand], c["ord"][cand]
        L0 = np.asarray([min(max(f.progress.last_event_ms, 0), int(RANK_SHIFT) - 1) for f in self.folders], np.int64)
        m_r = np.concatenate([np.arange(R), r, e_r])
        m_ord = np.concatenate([np.full(R, -1, np.int64), ordv * 2 + 1, e_ord * 2])
        m_val = np.concatenate([np.arange(R) * RANK_SHIFT + L0, r * RANK_SHIFT + np.clip(wall, 0, RANK_SHIFT - 1),
                                e_r * RANK_SHIFT])
        order = np.lexsort((m_ord, m_r))
        running = np.maximum.accumulate(m_val[order])
        is_entry = order >= R + len(r)
        before = np.empty(len(e_r), np.int64)
        before[order[is_entry] - R - len(r)] = running[is_entry] - e_r[order[is_entry] - R - len(r)] * RANK_SHIFT
        e_wall = c["wall"][cand]
        self._drop(e_r, ~np.isfinite(self.cseq[cand]))
        e_g, e_s = c["gid"][cand], np.trunc(self.cseq[cand])
        e_fl = c["inflight"][cand]
        # each rank's calls in order, with the pending state before the first
        o = np.lexsort((e_ord, e_r))
        er, eg, es, ew, ef, eb = e_r[o], e_g[o], e_s[o], e_wall[o], e_fl[o], before[o]
        first = np.append(True, er[1:] != er[:-1]) if len(er) else np.zeros(0, bool)
        g0 = np.asarray([self.groups.id(f.progress.pending_group) for f in self.folders], np.int64)
        s0 = np.asarray([f.progress.pending_seq for f in self.folders], np.float64)
        pg = np.where(first, g0[er] if len(er) else eg, np.roll(eg, 1))
        ps = np.where(first, s0[er] if len(er) else es, np.roll(es, 1))
        same = (eg == pg) & (es == ps)
        replaces = ((eg != pg) | (es >= ps)) & ((ew >= eb) | (es > ps))
        self._drop(er, ~(same | replaces))
        self.pending: dict[int, tuple[int, int, bool]] = {}
        if len(er):
            last = np.flatnonzero(np.append(er[1:] != er[:-1], True))
            start = np.flatnonzero(first)
            sets = np.where(~same, np.arange(len(er)), -1)
            last_set = np.maximum.reduceat(sets, start)
            not_flight = np.concatenate([[0], np.cumsum(~ef)])
            for a, z, j in zip(start.tolist(), last.tolist(), last_set.tolist(), strict=True):
                rr = int(er[a])
                fl_from = j if j >= 0 else a
                in_flight = not_flight[z + 1] - not_flight[fl_from] == 0
                if j < 0:
                    in_flight = in_flight and self.folders[rr].progress.pending_in_flight
                self.pending[rr] = (int(eg[z]), int(es[z]), bool(in_flight))

    def _plan_windows(self) -> None:
        """Ranks that would open more windows than may be open go one batch at a time."""
        c, s, i = self.c, self.s, self.i
        cpu_p = np.flatnonzero(np.asarray(self.has_cpu, bool))
        r = np.concatenate([c["r"][c["kept"]], s["r"][s["kept"]], i["r"][i["kept"]], self.batch_rank[cpu_p]])
        wid = np.concatenate([c["wid"][c["kept"]], s["wid"][s["kept"]], i["wid"][i["kept"]],
                              self.B_bw[cpu_p] // self.wms])
        if not len(r):
            return
        pairs = np.unique(r * RANK_SHIFT + np.clip(wid, 0, RANK_SHIFT - 1))
        pr = (pairs // RANK_SHIFT).tolist()
        pw = (pairs % RANK_SHIFT).tolist()
        new: dict[int, set[int]] = {}
        for rr, w in zip(pr, pw, strict=True):
            new.setdefault(rr, set()).add(w)
        for rr, wids in new.items():
            f = self.folders[rr]
            if len(wids | set(f.windows.windows)) > f.policy.max_open_windows:
                self.sequential[rr] = True

    # ---- applying it -------------------------------------------------------------------------
    def plan(self) -> None:
        """Work out what every event does (nothing is changed yet)."""
        self._plan_comms()
        self._plan_spans()
        self._plan_iterations()
        self._net_durations()
        self._plan_latest()
        self._plan_windows()

    def apply(self, result: ChunkResult) -> None:
        """Change the folders of the ranks folded column-wise."""
        fast = ~self.sequential
        self._apply_counts(fast)
        self._apply_accumulators(fast)
        self._apply_progress(fast)
        self._apply_cpu(fast, result)

    def _apply_counts(self, fast: np.ndarray) -> None:
        c, s, i, R = self.c, self.s, self.i, self.R
        cr, sr, ir = c["r"], s["r"], i["r"]
        counts = {
            "bad_name_index": _count(cr, ~c["valid"], R) + _count(sr, s["ok"] & ~s["valid"], R),
            "bad_timestamp": (_count(cr, c["valid"] & ~c["fin_start"], R) + _count(cr, c["good"] & ~c["in_range"], R)
                              + _count(sr, s["valid"] & ~s["in_range"], R)
                              + _count(ir, i["good"] & ~i["in_range"], R)),
            "bad_duration": (_count(cr, c["fin_start"] & ~c["cand"], R) + _count(sr, ~s["ok"], R)
                             + _count(ir, ~i["good"], R)),
            "in_flight_collective": _count(cr, c["inflight"], R),
            "late_event": _count(cr, c["late"], R) + _count(sr, s["late"], R) + _count(ir, i["late"], R),
        }
        ragged = np.bincount(self.batch_rank, weights=np.asarray(self.ragged, np.float64), minlength=R).astype(np.int64)
        counts["ragged_columns"] = ragged
        for reason, per_rank in counts.items():
            for rr in np.flatnonzero(per_rank * fast).tolist():
                self.folders[rr].skipped[reason] += int(per_rank[rr])
        for rr in np.flatnonzero(counts["late_event"] * fast).tolist():
            self.folders[rr].windows.dropped += int(counts["late_event"][rr])
        # the rank's data time: every plausible event, and a batch with nothing completed in it
        kept_c = np.bincount(self.cp[c["kept"]], minlength=len(self.work))
        heartbeat = (np.asarray(self.raw_events, np.int64) == 0) & (kept_c == 0)
        data_r = np.concatenate([cr[c["in_range"]], sr[s["in_range"]], ir[i["in_range"]], self.batch_rank[heartbeat]])
        data_w = np.concatenate([c["wall_i"][c["in_range"]], s["wall"][s["in_range"]], i["wall_i"][i["in_range"]],
                                 self.B_bw[heartbeat]])
        if len(data_r):
            top = np.full(R, np.iinfo(np.int64).min)
            np.maximum.at(top, data_r, data_w)
            for rr in np.flatnonzero(fast & (top > np.iinfo(np.int64).min)).tolist():
                w = self.folders[rr].windows
                w.data_ms = max(w.data_ms, int(top[rr]))

    def _apply_accumulators(self, fast: np.ndarray) -> None:
        c, s, i = self.c, self.s, self.i
        ck = c["kept"] & fast[c["r"]]
        sk = s["kept"] & fast[s["r"]]
        # comm and span events of each (rank, window, function), comms first, each in order
        r = np.concatenate([c["r"][ck], s["r"][sk]])
        wid = np.concatenate([c["wid"][ck], s["wid"][sk]])
        fid = np.concatenate([c["fid"][ck], s["fid"][sk]])
        typ = np.concatenate([np.full(int(ck.sum()), COMM), np.full(int(sk.sum()), SPAN)])
        ordv = np.concatenate([c["ord"][ck], s["ord"][sk]])
        val = np.concatenate([self.cdur[ck].astype(np.int64), s["net"][sk]])
        wall = np.concatenate([c["wall_i"][ck], s["wall"][sk]])
        kind = np.concatenate([np.full(int(ck.sum()), COLLECTIVE), s["kind"][sk]])
        n_span = int(sk.sum())
        seq = np.concatenate([self.cseq[ck].astype(np.int64), np.zeros(n_span, np.int64)])
        nbytes = np.concatenate([self.cbytes[ck].astype(np.int64), np.zeros(n_span, np.int64)])
        grp = np.concatenate([c["group"][ck], np.zeros(n_span, np.int64)])
        if len(r):
            order = np.lexsort((ordv, typ, fid, wid, r))
            r, wid, fid, typ, ordv, val, wall, kind, seq, nbytes, grp = (
                x[order] for x in (r, wid, fid, typ, ordv, val, wall, kind, seq, nbytes, grp))
            new_window = np.append(True, (r[1:] != r[:-1]) | (wid[1:] != wid[:-1]))
            same_fn = np.append(False, ~new_window[1:] & (fid[1:] == fid[:-1]))
            starts = np.flatnonzero(~same_fn | np.append(True, typ[1:] != typ[:-1]))
            ends = np.append(starts[1:], len(r))
            # each (rank, window): its accumulator, looked up once; its latest event
            wstarts = np.flatnonzero(new_window)
            wins = self._windows(r[wstarts].tolist(), wid[wstarts].tolist(), np.maximum.reduceat(wall, wstarts).tolist())
            g_win = (np.cumsum(new_window) - 1)[starts]
            # the kind a function's accumulator is created with: its first event's in order (a span
            # of the same name as a collective can come first: the group after, same function)
            nxt = np.append(starts[1:], 0)  # the next group's start (the last group's: unused)
            span_first = np.append(same_fn[starts[1:]], False) & (ordv[nxt] < ordv[starts])
            g_kind = np.where(span_first, kind[nxt], kind[starts])
            names = self.funcs.names
            val_l = val.tolist()
            groups = zip(starts.tolist(), ends.tolist(), g_win.tolist(), fid[starts].tolist(),
                         typ[starts].tolist(), g_kind.tolist(), strict=True)
            comm_groups = []
            for a, z, gw, f, t, kd in groups:
                functions = wins[gw].functions
                name = names[f]
                acc = functions.get(name)
                if acc is None:
                    acc = functions[name] = FunctionAcc(kd)
                if t == COMM:
                    comm_groups.append((acc, a, z))
                elif len(acc.durations) + (z - a) <= MAX_DURATIONS_PER_FUNCTION:
                    acc.durations.extend(val_l[a:z])
                else:
                    room = max(MAX_DURATIONS_PER_FUNCTION - len(acc.durations), 0)
                    acc.durations.extend(val_l[a:a + room])
                    acc.overflow += (z - a) - room
            if comm_groups:
                seq_l = seq.tolist()
                c_starts = np.asarray([g[1] for g in comm_groups], np.int64)
                c_ends = np.asarray([g[2] for g in comm_groups], np.int64)
                bytes_l = np.add.reduceat(nbytes, c_starts).tolist()
                last_grp = grp[c_ends - 1].tolist()
                for (acc, a, z), nb, lg in zip(comm_groups, bytes_l, last_grp, strict=True):
                    acc.seqs.extend(seq_l[a:z])
                    acc.seq_durs.extend(val_l[a:z])
                    acc.group_ranks = self._members(lg)
                    acc.bytes += nb
        # iterations: steps of each (rank, window), in order
        ik = i["kept"] & fast[i["r"]]
        if ik.any():
            r, wid, ordv = i["r"][ik], i["wid"][ik], i["ord"][ik] + np.flatnonzero(ik)
            step = self.istep[ik].astype(np.int64)
            dur = self.idur[ik].astype(np.int64)
            order = np.lexsort((ordv, wid, r))
            r, wid, step, dur = r[order], wid[order], step[order], dur[order]
            cuts = np.flatnonzero((r[1:] != r[:-1]) | (wid[1:] != wid[:-1])) + 1
            starts = np.concatenate([[0], cuts])
            ends = np.append(cuts, len(r))
            step_l, dur_l = step.tolist(), dur.tolist()
            for a, z in zip(starts.tolist(), ends.tolist(), strict=True):
                f = self.folders[int(r[a])]
                windows = f.windows.windows
                w = windows.get(int(wid[a]))
                if w is None:
                    w = windows[int(wid[a])] = WindowAcc()
                w.steps.extend(step_l[a:z])
                w.step_ns.extend(dur_l[a:z])
                f.progress.note_step(max(step_l[a:z]))

    def _windows(self, ranks: list[int], wids: list[int], latest: list[int]) -> list[WindowAcc]:
        """The accumulator of each (rank, window), opened when new; its latest event moved on."""
        out = []
        for rr, wd, m in zip(ranks, wids, latest, strict=True):
            windows = self.folders[rr].windows.windows
            w = windows.get(wd)
            if w is None:
                w = windows[wd] = WindowAcc()
            if m > w.last_event_ms:
                w.last_event_ms = m
            out.append(w)
        return out

    def _members(self, group: int) -> list[int]:
        """A group's ranks as ints (shared by the calls, never mutated): converted once per group id
        while its batches state the same ranks."""
        sent = self.c_members[group]
        gid = str(sent["group_id"])
        ranks = self._member_cache.get(gid)
        if ranks is None or ranks != sent["ranks"]:
            ranks = self._member_cache[gid] = [int(x) for x in sent["ranks"]]
        return ranks

    def _apply_progress(self, fast: np.ndarray) -> None:
        for rr, (wall, fid) in self.latest.items():
            if fast[rr]:
                self.folders[rr].progress.note_event(wall, self.funcs.names[fid])
        for rr, (gid, seq, in_flight) in self.pending.items():
            if fast[rr]:
                p = self.folders[rr].progress
                p.pending_group, p.pending_seq, p.pending_in_flight = self.groups.names[gid], seq, in_flight

    def _apply_cpu(self, fast: np.ndarray, result: ChunkResult) -> None:
        """CPU samples, stack rows and network samples per batch (EventFolder's), and each
        batch's time in turn."""
        for p, (folder, batch) in enumerate(self.work):
            if not fast[self.batch_rank[p]]:
                continue
            folder.windows.batch_wall_ms = self.bw[p]
            if self.has_cpu[p]:
                try:
                    folder._add_cpu(batch, list(batch["names"]))
                    folder._add_net(batch)
                except ERRORS as exc:
                    result.errors[p] = exc
