"""The chunk fold's order-dependent part (:mod:`.chunk_fold`): each rank's latest event and its
pending collective worked out from the columns without a loop, and the ranks that would open
more windows than may be open (folded one batch at a time instead)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .chunk_columns import RANK_SHIFT

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
    plan.drop(e_r, ~np.isfinite(plan.cseq[cand]))
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
    plan.drop(er, ~(same | replaces))
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


def plan_windows(plan: Plan) -> None:
    """Ranks that would open more windows than may be open go one batch at a time."""
    c, s, i = plan.c, plan.s, plan.i
    cpu_p = np.flatnonzero(np.asarray(plan.has_cpu, bool))
    r = np.concatenate([c["r"][c["kept"]], s["r"][s["kept"]], i["r"][i["kept"]], plan.batch_rank[cpu_p]])
    wid = np.concatenate([c["wid"][c["kept"]], s["wid"][s["kept"]], i["wid"][i["kept"]],
                          plan.B_bw[cpu_p] // plan.wms])
    if not len(r):
        return
    pairs = np.unique(r * RANK_SHIFT + np.clip(wid, 0, RANK_SHIFT - 1))
    pr = (pairs // RANK_SHIFT).tolist()
    pw = (pairs % RANK_SHIFT).tolist()
    new: dict[int, set[int]] = {}
    for rr, w in zip(pr, pw, strict=True):
        new.setdefault(rr, set()).add(w)
    for rr, wids in new.items():
        f = plan.folders[rr]
        if len(wids | set(f.windows.windows)) > f.policy.max_open_windows:
            plan.sequential[rr] = True

