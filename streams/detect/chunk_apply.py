"""The chunk fold's changes (:mod:`.chunk_fold`): the plan (:mod:`.chunk_plan`) applied to the
ranks' folders -- skip counts and data time, each (rank, window, function) accumulator extended
once, steps, latest event and pending collective, each batch's host evidence."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...schemas.records import group_members
from .accumulate import WindowAcc
from .chunk_columns import COLLECTIVE, COMM, ERRORS, SPAN, ChunkResult, count_where
from .window_columns import SETTLE_EVENTS, PendingCols, new_chunk, settle

if TYPE_CHECKING:
    from .chunk_plan import Plan


def apply(plan: Plan, result: ChunkResult, at: list[int]) -> None:
    """Change the ranks' folders (a batch's error recorded under its position ``at``)."""
    for rr in np.flatnonzero(plan.fresh).tolist():
        first = plan.first_window(rr)
        if first is not None:
            plan.folders[rr].windows.next_window = first
    _apply_counts(plan)
    _apply_accumulators(plan)
    _apply_progress(plan)
    _apply_host(plan, result, at)


def _apply_counts(plan: Plan) -> None:
    c, s, i, R = plan.c, plan.s, plan.i, plan.R
    cr, sr, ir = c["r"], s["r"], i["r"]
    counts = {
        "bad_name_index": count_where(cr, ~c["valid"], R) + count_where(sr, s["ok"] & ~s["valid"], R),
        "bad_timestamp": (count_where(cr, c["valid"] & ~c["fin_start"], R) + count_where(cr, c["good"] & ~c["in_range"], R)
                          + count_where(sr, s["valid"] & ~s["in_range"], R)
                          + count_where(ir, i["good"] & ~i["in_range"], R)),
        "bad_duration": (count_where(cr, c["fin_start"] & ~c["cand"], R) + count_where(sr, ~s["ok"], R)
                         + count_where(ir, ~i["good"], R)),
        "in_flight_collective": count_where(cr, c["inflight"], R),
        "late_event": count_where(cr, c["late"], R) + count_where(sr, s["late"], R) + count_where(ir, i["late"], R),
        "too_many_open_windows": (count_where(cr, c["crowded"], R) + count_where(sr, s["crowded"], R)
                                  + count_where(ir, i["crowded"], R)),
    }
    ragged = np.bincount(plan.batch_rank, weights=np.asarray(plan.ragged, np.float64), minlength=R).astype(np.int64)
    counts["ragged_columns"] = ragged
    for reason, per_rank in counts.items():
        for rr in np.flatnonzero(per_rank).tolist():
            plan.folders[rr].skipped[reason] += int(per_rank[rr])
    dropped = counts["late_event"] + counts["too_many_open_windows"]
    for rr in np.flatnonzero(dropped).tolist():
        plan.folders[rr].windows.dropped += int(dropped[rr])
    # the rank's data time: every plausible event, and a batch with nothing completed in it
    kept_c = np.bincount(plan.cp[c["kept"]], minlength=len(plan.work))
    heartbeat = (np.asarray(plan.raw_events, np.int64) == 0) & (kept_c == 0)
    data_r = np.concatenate([cr[c["in_range"]], sr[s["in_range"]], ir[i["in_range"]], plan.batch_rank[heartbeat]])
    data_w = np.concatenate([c["wall_i"][c["in_range"]], s["wall"][s["in_range"]], i["wall_i"][i["in_range"]],
                             plan.B_bw[heartbeat]])
    if len(data_r):
        top = np.full(R, np.iinfo(np.int64).min)
        np.maximum.at(top, data_r, data_w)
        for rr in np.flatnonzero(top > np.iinfo(np.int64).min).tolist():
            w = plan.folders[rr].windows
            w.data_ms = max(w.data_ms, int(top[rr]))


def _apply_accumulators(plan: Plan) -> None:
    c, s, i = plan.c, plan.s, plan.i
    ck, sk = c["kept"], s["kept"]
    # comm and span events of each (rank, window, function), comms first, each in order
    r = np.concatenate([c["r"][ck], s["r"][sk]])
    wid = np.concatenate([c["wid"][ck], s["wid"][sk]])
    fid = np.concatenate([c["fid"][ck], s["fid"][sk]])
    typ = np.concatenate([np.full(int(ck.sum()), COMM), np.full(int(sk.sum()), SPAN)])
    ordv = np.concatenate([c["ord"][ck], s["ord"][sk]])
    val = np.concatenate([plan.cdur[ck].astype(np.int64), s["net"][sk]])
    wall = np.concatenate([c["wall_i"][ck], s["wall"][sk]])
    kind = np.concatenate([np.full(int(ck.sum()), COLLECTIVE), s["kind"][sk]])
    n_span = int(sk.sum())
    seq = np.concatenate([plan.cseq[ck].astype(np.int64), np.zeros(n_span, np.int64)])
    nbytes = np.concatenate([plan.cbytes[ck].astype(np.int64), np.zeros(n_span, np.int64)])
    grp = np.concatenate([c["group"][ck], np.zeros(n_span, np.int64)])
    if len(r):
        order = np.lexsort((ordv, typ, fid, wid, r))
        r, wid, fid, typ, ordv, val, wall, kind, seq, nbytes, grp = (
            x[order] for x in (r, wid, fid, typ, ordv, val, wall, kind, seq, nbytes, grp))
        new_window = np.append(True, (r[1:] != r[:-1]) | (wid[1:] != wid[:-1]))
        same_fn = np.append(False, ~new_window[1:] & (fid[1:] == fid[:-1]))
        starts = np.flatnonzero(~same_fn | np.append(True, typ[1:] != typ[:-1]))
        ends = np.append(starts[1:], len(r))
        # the kind a function's accumulator is created with: its first event's in order (a span
        # of the same name as a collective can come first: the group after, same function);
        # each event carries its group's (window_columns.settle takes a function's first)
        nxt = np.append(starts[1:], 0)  # the next group's start (the last group's: unused)
        span_first = np.append(same_fn[starts[1:]], False) & (ordv[nxt] < ordv[starts])
        g_kind = np.repeat(np.where(span_first, kind[nxt], kind[starts]), ends - starts)
        # each (rank, window): its accumulator, looked up once, and its slice of the columns
        wstarts = np.flatnonzero(new_window)
        wends = np.append(wstarts[1:], len(r))
        groups = _groups(plan, grp[typ == COMM])
        wins = _windows(plan, r[wstarts].tolist(), wid[wstarts].tolist(), np.maximum.reduceat(wall, wstarts).tolist())
        chunk = new_chunk(plan.funcs.names, fid, typ, val, g_kind, seq, nbytes, grp, groups)
        for acc_w, a, z in zip(wins, wstarts.tolist(), wends.tolist(), strict=True):
            acc_w.pending.append(PendingCols(chunk, a, z))
            acc_w.pending_events += z - a
            if acc_w.pending_events >= SETTLE_EVENTS:
                settle([acc_w])
    # iterations: steps of each (rank, window), in order
    ik = i["kept"]
    if ik.any():
        r, wid, ordv = i["r"][ik], i["wid"][ik], i["ord"][ik] + np.flatnonzero(ik)
        step = plan.istep[ik].astype(np.int64)
        dur = plan.idur[ik].astype(np.int64)
        order = np.lexsort((ordv, wid, r))
        r, wid, step, dur = r[order], wid[order], step[order], dur[order]
        cuts = np.flatnonzero((r[1:] != r[:-1]) | (wid[1:] != wid[:-1])) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.append(cuts, len(r))
        step_l, dur_l = step.tolist(), dur.tolist()
        for a, z in zip(starts.tolist(), ends.tolist(), strict=True):
            f = plan.folders[int(r[a])]
            windows = f.windows.windows
            w = windows.get(int(wid[a]))
            if w is None:
                w = windows[int(wid[a])] = WindowAcc()
            w.steps.extend(step_l[a:z])
            w.step_ns.extend(dur_l[a:z])
            f.progress.note_step(max(step_l[a:z]))


def _windows(plan: Plan, ranks: list[int], wids: list[int], latest: list[int]) -> list[WindowAcc]:
    """The accumulator of each (rank, window), opened when new; its latest event moved on."""
    out = []
    for rr, wd, m in zip(ranks, wids, latest, strict=True):
        windows = plan.folders[rr].windows.windows
        w = windows.get(wd)
        if w is None:
            w = windows[wd] = WindowAcc()
        if m > w.last_event_ms:
            w.last_event_ms = m
        out.append(w)
    return out


def _groups(plan: Plan, used: np.ndarray) -> list[list[int]]:
    """The ranks of each group the chunk's kept collective calls name, by the chunk's group index."""
    table: list[list[int]] = [[] for _ in range(len(plan.c_members))]
    for g in np.unique(used).tolist():
        table[g] = _members(plan, g)
    return table


def _members(plan: Plan, group: int) -> list[int]:
    """A group's ranks as ints (shared by the calls, never mutated): converted once per group id
    while its batches state the same ranks (listed, or as a range: EventBatch v9)."""
    sent = plan.c_members[group]
    gid = str(sent["group_id"])
    stated = (sent["ranks"], sent.get("ranks_first", 0), sent.get("ranks_step", 0), sent.get("ranks_count", 0))
    cached = plan.member_cache.get(gid)
    if cached is None or cached[0] != stated:
        cached = plan.member_cache[gid] = (stated, group_members(sent))
    return cached[1]


def _apply_progress(plan: Plan) -> None:
    for rr, (wall, fid) in plan.latest.items():
        plan.folders[rr].progress.note_event(wall, plan.funcs.names[fid])
    for rr, (gid, seq, in_flight) in plan.pending.items():
        p = plan.folders[rr].progress
        p.pending_group, p.pending_seq, p.pending_in_flight = plan.groups.names[gid], seq, in_flight


def _apply_host(plan: Plan, result: ChunkResult, at: list[int]) -> None:
    """Each batch's time in turn, and its CPU samples, stack rows and network samples (a few rows
    a batch, :meth:`.rank_events.RankFold.add_host_evidence`)."""
    for p, (folder, batch) in enumerate(plan.work):
        folder.windows.batch_wall_ms = plan.bw[p]
        if plan.has_cpu[p]:
            try:
                folder.add_host_evidence(batch, crowded=p in plan.crowded_host)
            except ERRORS as exc:
                result.errors[at[p]] = exc
