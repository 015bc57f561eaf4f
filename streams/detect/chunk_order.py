"""The chunk fold's order-dependent part (:mod:`.chunk_fold`): each rank's latest event and its
pending collective, and the windows a rank may not open (more than may be open), worked out
from the columns in the order one batch after another folds them. The usual case takes no
loop; a rank whose calls come out of order, or that opens more windows than may be open, takes
a Python step per call or per distinct window of it (hostile or stalled input, not a running job)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .chunk_columns import ORD_SHIFT, RANK_SHIFT

if TYPE_CHECKING:
    from .chunk_plan import Plan


def plan_latest(plan: Plan) -> None:
    """Each rank's latest event and its pending collective (see the module docstring)."""
    c, s, R = plan.c, plan.s, plan.R
    ev_c, ev_s = c["in_range"], s["in_range"]
    # the latest event: greatest wall time, last in order among equals
    r = np.concatenate([c["r"][ev_c], s["r"][ev_s]])
    wall = np.concatenate([c["wall_i"][ev_c], s["wall"][ev_s]])
    ordv = np.concatenate([c["ord"][ev_c], s["ord"][ev_s]])
    fid = np.concatenate([c["fid"][ev_c], s["fid"][ev_s]])
    plan.latest = {}
    if len(r):
        order = np.lexsort((ordv, wall, r))
        last = np.flatnonzero(np.append(r[order][1:] != r[order][:-1], True))
        for j in order[last].tolist():
            plan.latest[int(r[j])] = (int(wall[j]), int(fid[j]))
    # the pending collective: calls (entries) and events merged in each rank's order, the
    # latest event time before each call as a running maximum (rank packed above the time)
    cand = c["cand"]
    e_r, e_ord = c["r"][cand], c["ord"][cand]
    L0 = np.asarray([min(max(f.progress.last_event_ms, 0), int(RANK_SHIFT) - 1) for f in plan.folders], np.int64)
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
    plan.reject(c["p"][cand], ~np.isfinite(plan.cseq[cand]), "a collective seq that is not a finite number")
    e_g, e_s = c["gid"][cand], np.trunc(plan.cseq[cand])
    e_fl = c["inflight"][cand]
    # each rank's calls in order, with the pending state before the first
    o = np.lexsort((e_ord, e_r))
    er, eg, es, ew, ef, eb = e_r[o], e_g[o], e_s[o], e_wall[o], e_fl[o], before[o]
    first = np.append(True, er[1:] != er[:-1]) if len(er) else np.zeros(0, bool)
    g0 = np.asarray([plan.groups.id(f.progress.pending_group) for f in plan.folders], np.int64)
    s0 = np.asarray([f.progress.pending_seq for f in plan.folders], np.float64)
    pg = np.where(first, g0[er] if len(er) else eg, np.roll(eg, 1))
    ps = np.where(first, s0[er] if len(er) else es, np.roll(es, 1))
    same = (eg == pg) & (es == ps)
    replaces = ((eg != pg) | (es >= ps)) & ((ew >= eb) | (es > ps))
    plan.pending = {}
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
                in_flight = in_flight and plan.folders[rr].progress.pending_in_flight
            plan.pending[rr] = (int(eg[z]), int(es[z]), bool(in_flight))
        # a call that neither repeats nor replaces the pending one leaves it: those ranks' calls in
        # turn (not when a batch is rejected: the chunk is planned again without it)
        for a, z in [] if plan.rejected.any() else _runs(er, ~(same | replaces)):
            p = plan.folders[int(er[a])].progress
            state = (plan.groups.id(p.pending_group), p.pending_seq, p.pending_in_flight)
            for k in range(a, z + 1):
                state = _note_entry(state, int(eg[k]), int(es[k]), float(ew[k]), int(eb[k]), bool(ef[k]))
            plan.pending[int(er[a])] = state


def _runs(r: np.ndarray, mark: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) position of each run of equal ``r`` (sorted) holding a ``mark``."""
    out = []
    for rr in np.unique(r[mark]).tolist():
        at = np.flatnonzero(r == rr)
        out.append((int(at[0]), int(at[-1])))
    return out


def _note_entry(state: tuple[int, int, bool], group: int, seq: int, wall: float, last_event: int,
                in_flight: bool) -> tuple[int, int, bool]:
    """``RankProgress.note_entry`` on (group, seq, in flight), with the rank's latest event time
    before the call (``last_event``)."""
    g, s, fl = state
    if group == g and seq == s:
        return g, s, in_flight and fl
    if (group != g or seq >= s) and (wall >= last_event or seq > s):
        return group, seq, in_flight
    return state


def plan_crowding(plan: Plan) -> None:
    """The windows each rank may not open: one more than ``max_open_windows`` would be open.
    ``RankWindows.open_slot`` opens a window on its first kept event, in the fold's order --
    a batch's collectives, spans, iterations, then its host evidence, batch after batch -- so the
    windows a rank may still open are the first new ones in that order; the events of the others
    are counted and dropped (``crowded``), and a batch's host evidence in one goes with them."""
    c, s, i = plan.c, plan.s, plan.i
    for part in (c, s, i):
        part["crowded"] = np.zeros(len(part["r"]), bool)
    plan.crowded_host = set()
    host = np.flatnonzero(np.asarray(plan.has_cpu, bool))
    host_r, host_w = plan.batch_rank[host], plan.B_bw[host] // plan.wms
    opens = host_w >= plan.NW[host_r]  # a late batch's evidence opens nothing
    host, host_r, host_w = host[opens], host_r[opens], host_w[opens]
    ik = np.flatnonzero(i["kept"])
    r = np.concatenate([c["r"][c["kept"]], s["r"][s["kept"]], i["r"][ik], host_r])
    wid = np.concatenate([c["wid"][c["kept"]], s["wid"][s["kept"]], i["wid"][ik], host_w])
    if not len(r):
        return
    pairs = np.unique(r * RANK_SHIFT + np.clip(wid, 0, RANK_SHIFT - 1))
    per_rank = np.bincount(pairs // RANK_SHIFT, minlength=plan.R)
    crowded = []
    for rr in np.flatnonzero(per_rank).tolist():
        windows, most = plan.folders[rr].windows.windows, plan.folders[rr].policy.max_open_windows
        if per_rank[rr] + len(windows) > most:  # then check exactly: the new windows and the open ones
            wids = set((pairs[pairs // RANK_SHIFT == rr] % RANK_SHIFT).tolist())
            if len(wids | set(windows)) > most:
                crowded.append(rr)
    if not crowded:
        return
    ordv = np.concatenate([c["ord"][c["kept"]], s["ord"][s["kept"]], i["ord"][ik] + ik, host * ORD_SHIFT + (3 << 30)])
    blocked: set[tuple[int, int]] = set()
    for rr in crowded:
        mine = np.flatnonzero(r == rr)
        open_now = set(plan.folders[rr].windows.windows)
        room = plan.folders[rr].policy.max_open_windows - len(open_now)
        for w in dict.fromkeys(wid[mine[np.argsort(ordv[mine], kind="stable")]].tolist()):  # by first event
            if w not in open_now:
                if room > 0:
                    room -= 1
                else:
                    blocked.add((rr, w))
    for part in (c, s, i):
        at = np.flatnonzero(part["kept"] & np.isin(part["r"], crowded))
        hit = [(rr, w) in blocked for rr, w in zip(part["r"][at].tolist(), part["wid"][at].tolist(), strict=True)]
        part["crowded"][at[np.asarray(hit, bool)]] = True
        part["kept"] = part["kept"] & ~part["crowded"]
    plan.crowded_host = {p for p, rr, w in zip(host.tolist(), host_r.tolist(), host_w.tolist(), strict=True)
                         if (rr, w) in blocked}
