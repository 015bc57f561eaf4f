"""The chunk fold's plan (:mod:`.chunk_fold`): the chunk's columns gathered, and what every event
does -- its checks, wall time, window, function and span time net of nested collectives --
worked out with numpy over the whole chunk; nothing is changed yet (:mod:`.chunk_order` works
out what depends on the order of a rank's events, :mod:`.chunk_apply` changes the folders)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .chunk_columns import (
    BATCH_SHIFT,
    COMM_KEYS,
    DEVICE,
    ITER_KEYS,
    ORD_SHIFT,
    RANK_SHIFT,
    REL_LIMIT,
    SPAN_KEYS,
    UNREADABLE,
    Names,
    Part,
    floor_ms,
)
from .chunk_order import plan_crowding, plan_latest
from .model import comm_function, kind_function
from .rank_events import RankFold, covered_ns

TIME_RANGE = "a plausible time before 1970 or after 2248 (the batch's own clock is off)"
NO_WINDOW = np.iinfo(np.int64).min  # a rank's lowest open window before its first data: nothing is late


class Plan:
    """The chunk's columns, what every event does, and the state each rank ends in."""

    def __init__(self, work: Sequence[tuple[RankFold, dict]], folders: list[RankFold], batch_rank: np.ndarray):
        self.work, self.folders, self.batch_rank = work, folders, batch_rank
        self.rejected = np.zeros(len(work), bool)  # batches not folded: see :meth:`reject`
        self.why: dict[int, str | Exception] = {}  # a rejected batch's position -> why
        self.crowded_host: set[int] = set()  # batches whose host evidence is in a window that may not open
        pol = folders[0].policy
        self.wms, self.max_dur = pol.window_ms, pol.max_duration_s * 1e9
        self.max_dur_ms, self.slack_ms = pol.max_duration_s * 1000, pol.future_slack_ms
        self.funcs = Names()
        self.groups = Names()
        # group id -> (its members as the batch stated them, its ranks as ints) (chunk_apply)
        self.member_cache: dict[str, tuple[tuple, list[int]]] = {}
        self.latest: dict[int, tuple[int, int]] = {}  # rank -> (wall ms, function id) of its latest event
        self.pending: dict[int, tuple[int, int, bool]] = {}  # rank -> (group id, seq, in flight) pending

    # ---- gathering ---------------------------------------------------------------------------
    def build(self) -> None:
        n = len(self.work)
        self.comms, self.spans, self.iters = Part(COMM_KEYS), Part(SPAN_KEYS), Part(ITER_KEYS)
        self.offset = [0] * n  # wall_ns - mono_ns
        self.mono = [0] * n
        self.bw = [0] * n  # the batch's wall time (ms)
        self.n_names, self.n_groups = [0] * n, [0] * n
        self.raw_events = [0] * n  # spans + iterations as sent (a batch without any is a heartbeat)
        self.ragged = [0] * n
        self.has_cpu = [False] * n
        # a rank with no window yet (its first batch ever): its first data fixes its first window,
        # worked out here from that one batch of it (chunk_fold's rounds: its others come after)
        self.fresh = np.asarray([f.windows.next_window is None for f in self.folders], bool)
        once = np.bincount(self.batch_rank, minlength=len(self.folders)) == 1
        if (self.fresh & ~once).any() or any(f.policy is not self.folders[0].policy for f in self.folders):
            raise AssertionError("a chunk fold round holds a fresh rank's later batches or two policies")
        for p, (_, batch) in enumerate(self.work):
            try:
                self._gather(p, batch)
            except UNREADABLE as exc:  # rejected as what reading it raised
                self.rejected[p] = True
                self.why[p] = exc
        self._arrays()

    def _gather(self, p: int, batch: dict) -> None:
        wall, mono = int(batch["wall_ns"]), int(batch["mono_ns"])
        names, groups = batch["names"], batch.get("groups", [])
        comms, spans, iters = batch["comms"], batch["spans"], batch["iterations"]
        stacks = batch.get("stacks") or {}
        has_cpu = bool(batch.get("cpu") or len(stacks.get("frame", ())) or batch.get("net"))  # host evidence
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
        self.NW = np.asarray([f.windows.next_window if f.windows.next_window is not None else NO_WINDOW
                              for f in self.folders], np.int64)  # a fresh rank's: :meth:`_first_windows`

    def reject(self, p: np.ndarray, bad: np.ndarray, why: str) -> None:
        """Reject the batches (positions ``p``) of ``bad`` events, whole: values no collector sends,
        beyond what the fold's packed keys hold (the batch is counted, none of it folded)."""
        if bad.any():
            for q in np.unique(p[bad]).tolist():
                self.rejected[q] = True
                self.why.setdefault(q, why)

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
            wall = floor_ms((self.B_off_f[cp] + self.cstart) + np.maximum(dur, 0))
        cand = inflight | good
        in_range = cand & (wall >= self.B_lo[cp]) & (wall <= self.B_hi[cp])
        self.reject(cp, in_range & ~((wall >= 0) & (wall < RANK_SHIFT)), TIME_RANGE)
        wall_i = np.where(in_range, wall, 0).astype(np.int64)
        wid = wall_i // self.wms
        self.c = dict(r=r, p=cp, valid=valid, fin_start=fin_start, fin=fin, inflight=inflight, good=good,
                      cand=cand, in_range=in_range, wall=wall, wall_i=wall_i, wid=wid,
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
        self.reject(cp, valid & ((op >= 1 << 20) | (grp >= 1 << 20)), "a name or group index beyond 2^20")
        self.c["fid"] = np.asarray(fid, np.int64)[inv]
        self.c["gid"] = np.asarray(gid, np.int64)[inv]
        self.c["group"] = inv
        self.c_members = members

    @staticmethod
    def _starts(part: Part) -> np.ndarray:
        lengths = np.asarray(part.lengths, np.int64)
        return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths

    def _plan_spans(self) -> None:
        sp = self.sp
        r = self.batch_rank[sp]
        dur_f = self.sdur
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(dur_f) & (dur_f >= 0) & (dur_f <= self.max_dur)
            start = self.sstart.astype(np.int64)
        self.reject(sp, ok & ~(np.abs(start) < (1 << 61)), "a span start beyond 2^61 ns")
        dur = np.where(ok, dur_f, 0).astype(np.int64)
        valid = ok & (self.sname >= 0) & (self.sname < self.B_names[sp])
        wall = (self.B_off[sp] + start) // 1_000_000
        in_range = valid & (wall >= self.B_lo[sp]) & (wall <= self.B_hi[sp])
        self.reject(sp, in_range & ~((wall >= 0) & (wall < RANK_SHIFT)), TIME_RANGE)
        wid = np.where(in_range, wall, 0) // self.wms
        ordv = sp * ORD_SHIFT + (1 << 30) + np.arange(len(sp)) - np.repeat(self._starts(self.spans), self.spans.lengths)
        self.s = dict(r=r, p=sp, ok=ok, valid=valid, start=start, dur=dur, wall=wall, in_range=in_range,
                      wid=wid, ord=ordv)
        # function per (batch, name, kind)
        name = np.where(valid, self.sname, 0).astype(np.int64)
        kind = np.where(valid, self.skind, 0)
        self.reject(sp, valid & ((kind < 0) | (kind >= 1 << 16) | (kind != np.floor(kind)) | (name >= 1 << 24)),
                    "a span kind that is not a whole number below 2^16, or a name index beyond 2^24")
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
        for k, pp in enumerate((cb, cb, sb, sb)):
            self.reject(pp, np.abs(rel[k]) >= REL_LIMIT, "a time more than 2^44 ns from the batch's clock")
            rel[k] = np.clip(rel[k], -REL_LIMIT, REL_LIMIT)  # a rejected batch: planned again without it
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
            wall = floor_ms((self.B_off_f[ip] + start) + dur)
        in_range = timed & (wall >= self.B_lo[ip]) & (wall <= self.B_hi[ip])
        self.reject(ip, in_range & ~((wall >= 0) & (wall < RANK_SHIFT)), TIME_RANGE)
        wall_i = np.where(in_range, wall, 0).astype(np.int64)
        wid = wall_i // self.wms
        self.i = dict(r=r, good=good, timed=timed, in_range=in_range, wall_i=wall_i, wid=wid,
                      ord=ip * ORD_SHIFT + (2 << 30))

    def _first_windows(self) -> None:
        """A fresh rank's first window: that of its first data in the order one batch folds them
        (``RankWindows.note_data``): collectives, spans, iterations, each in its column's order, then
        the batch's own time when nothing was sent (a heartbeat). None found: none is fixed (nothing late)."""
        if not self.fresh.any():
            return
        c, s, i = self.c, self.s, self.i
        in_range_c = np.bincount(self.cp[c["in_range"]], minlength=len(self.work))
        beat = np.flatnonzero((np.asarray(self.raw_events, np.int64) == 0) & (in_range_c == 0))
        r = np.concatenate([c["r"][c["in_range"]], s["r"][s["in_range"]], i["r"][i["in_range"]],
                            self.batch_rank[beat]])
        ordv = np.concatenate([c["ord"][c["in_range"]], s["ord"][s["in_range"]],
                               i["ord"][i["in_range"]] + np.flatnonzero(i["in_range"]),
                               beat * ORD_SHIFT + (3 << 30)])
        wid = np.concatenate([c["wid"][c["in_range"]], s["wid"][s["in_range"]], i["wid"][i["in_range"]],
                              self.B_bw[beat] // self.wms])
        take = self.fresh[r]
        r, ordv, wid = r[take], ordv[take], wid[take]
        if len(r):
            order = np.lexsort((ordv, r))
            first = order[np.append(True, r[order][1:] != r[order][:-1])]
            self.NW[r[first]] = wid[first]

    def _lateness(self) -> None:
        """Late: below the rank's lowest open window (:meth:`RankWindows.open_slot`); kept: the rest."""
        c, s, i = self.c, self.s, self.i
        c["late"] = c["good"] & c["in_range"] & (c["wid"] < self.NW[c["r"]])
        c["kept"] = c["good"] & c["in_range"] & ~c["late"]
        for part in (s, i):
            part["late"] = part["in_range"] & (part["wid"] < self.NW[part["r"]])
            part["kept"] = part["in_range"] & ~part["late"]
        self.reject(self.ip, i["kept"] & ~np.isfinite(self.istep), "a step that is not a finite number")

    def first_window(self, r: int) -> int | None:
        """The first window :meth:`plan` found for fresh rank ``r`` (None: none, or not fresh)."""
        return int(self.NW[r]) if self.fresh[r] and self.NW[r] != NO_WINDOW else None

    def plan(self) -> None:
        """Work out what every event does (nothing is changed yet)."""
        self._plan_comms()
        self._plan_spans()
        self._plan_iterations()
        self._first_windows()
        self._lateness()
        plan_crowding(self)
        self._net_durations()
        plan_latest(self)
