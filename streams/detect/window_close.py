"""Closing many ranks' windows at once into their records, column-wise.

The windows a timer tick closes are closed together, in runs of about :data:`CLOSE_EVENTS`
events: their events grouped by (window, function) in one pass (:func:`.window_columns.group_events`), then each window's
FunctionPatterns -- its functions in name order, with the per-kind aggregates
(:data:`.rank_records.ALWAYS_AGGREGATED`: ``kind:<name>``, the sum of that kind's spans, even
when zero, on a window with any function or step) and, on a rank with device spans, their
sums per phase (:data:`.device_evidence.DEVICE_AGGREGATES`), an aggregate taking the place of a
function of its name -- and its RankWindow. One sort of every value of every pattern by
(pattern, value) gives each pattern's count, total, max and exact p50/p90/p99
(:func:`.quantiles.grouped_percentiles`), one bincount its histogram. The numbers, lists and
order are those of closing each window's accumulators one function at a time
(tests/unit/streams/detect/reference_close.py, the oracle, and test_window_close.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ...schemas.records import NO_MEMBERS_RANGE, FunctionPattern, members_range
from ...schemas.vocabulary import FUNCTION_PATTERN, FUNCTION_PATTERN_VERSION, RANK_WINDOW, SpanKind
from .device_evidence import DEVICE_AGGREGATES, DEVICE_PREFIX, device_phase
from .histogram import grouped_histograms
from .model import COMM_PREFIX, KIND_PREFIX, kind_function
from .quantiles import grouped_percentiles
from .rank_records import (
    ALWAYS_AGGREGATED,
    Closing,
    Routed,
    rank_window_record,
    signature_token,
    window_fields,
)
from .step_gating import recorded_steps
from .window_columns import Grouped, group_events

DEVICE = int(SpanKind.DEVICE)
KIND_AGGREGATES = {int(k): kind_function(k) for k in ALWAYS_AGGREGATED}
CLOSE_EVENTS = 1 << 20  # events of the windows closed together, at most (past one window's own)


def close_windows(closing: Sequence[Closing]) -> list[Routed]:
    """Each closed window's records, in order: [("FunctionPattern", rec), ..., ("RankWindow", rec)],
    the windows closed together in runs of about :data:`CLOSE_EVENTS` events (the close's arrays
    are a few times its events' bytes: a giant job's tick closes one window of every rank)."""
    out: list[Routed] = []
    start = held = 0
    for i, c in enumerate(closing):
        held += c.w.pending_events
        if held >= CLOSE_EVENTS or i == len(closing) - 1:
            out += _close(closing[start:i + 1])
            start, held = i + 1, 0
    return out


def _close(closing: Sequence[Closing]) -> list[Routed]:
    """:func:`close_windows` of windows closed together."""
    g = group_events([c.w for c in closing])
    names = list(g.names)
    ids = {n: i for i, n in enumerate(names)}
    for n in [*KIND_AGGREGATES.values(), *DEVICE_AGGREGATES.values()]:
        if n not in ids:
            ids[n] = len(names)
            names.append(n)
    win, gid, kind = g.win.tolist(), g.gid.tolist(), g.kind.tolist()
    signatures = _signatures(len(closing), g, win, gid, kind)
    # the aggregates' sources: a kind's spans (not a collective's), a device span's phase
    is_comm = np.asarray([n.startswith(COMM_PREFIX) for n in g.names], bool)
    phase_of = np.asarray([ids.get(DEVICE_AGGREGATES.get(device_phase(n), ""), -1) if n.startswith(DEVICE_PREFIX)
                           else -1 for n in g.names], np.int64)
    kind_id = np.full(max(DEVICE, *KIND_AGGREGATES) + 1, -1, np.int64)
    for k, n in KIND_AGGREGATES.items():
        kind_id[k] = ids[n]
    gk = np.clip(g.kind, 0, len(kind_id) - 1)
    kind_src = np.where((g.kind == gk) & ~is_comm[g.gid], kind_id[gk], -1)
    device = (g.kind == DEVICE) & np.asarray([n.startswith(DEVICE_PREFIX) for n in g.names], bool)[g.gid]
    dev_src = np.where(device, phase_of[g.gid], -1)
    # the patterns: each function, then each window's aggregates in place of a function of their name
    has = np.zeros(len(closing), bool)
    has[g.win] = True
    has |= np.asarray([bool(c.w.steps) for c in closing])
    dev_win = np.unique(g.win[device])
    agg_w = np.concatenate([np.repeat(np.flatnonzero(has), len(KIND_AGGREGATES)), np.repeat(dev_win, len(DEVICE_AGGREGATES))])
    agg_n = np.concatenate([np.tile(np.asarray([ids[n] for n in KIND_AGGREGATES.values()], np.int64), int(has.sum())),
                            np.tile(np.asarray([ids[n] for n in DEVICE_AGGREGATES.values()], np.int64), len(dev_win))])
    agg_kind = np.concatenate([np.tile(np.asarray(list(KIND_AGGREGATES), np.int64), int(has.sum())),
                               np.full(len(dev_win) * len(DEVICE_AGGREGATES), DEVICE, np.int64)])
    width = len(names)
    real_key, agg_key = g.win * width + g.gid, agg_w * width + agg_n
    real = ~np.isin(real_key, agg_key)
    rank_of = np.empty(width, np.int64)
    rank_of[np.argsort(np.asarray(names, dtype=object))] = np.arange(width)
    p_win = np.concatenate([g.win[real], agg_w])
    p_name = np.concatenate([g.gid[real], agg_n])
    p_group = np.concatenate([np.flatnonzero(real), np.full(len(agg_w), -1, np.int64)])
    p_kind = np.concatenate([g.kind[real], agg_kind])
    order = np.lexsort((rank_of[p_name], p_win))
    p_win, p_name, p_group, p_kind = p_win[order], p_name[order], p_group[order], p_kind[order]
    p_key = p_win * width + p_name
    by_key = np.argsort(p_key)
    # each pattern's values: its function's kept events; an aggregate's, its sources' kept spans
    # (a source is never a collective: collective calls are named comm:..., never a source)
    row_of_group = np.full(len(g.win), -1, np.int64)
    row_of_group[p_group[p_group >= 0]] = np.flatnonzero(p_group >= 0)
    eg = np.repeat(np.arange(len(g.win)), g.z - g.a)
    pieces = [(row_of_group[eg], g.kept & (row_of_group[eg] >= 0))]
    for src in (kind_src, dev_src):
        found = np.searchsorted(p_key[by_key], g.win * width + src)  # the aggregate's row (src -1: none)
        target = by_key[np.minimum(found, len(by_key) - 1)]
        pieces.append((target[eg], g.kept & (src[eg] >= 0)))
    rows = np.concatenate([r[k] for r, k in pieces])
    vals = np.concatenate([g.val[k] for _, k in pieces])
    return _records(closing, g, names, signatures, p_win, p_name, p_group, p_kind, *_stats(rows, vals, len(p_win)))


def _stats(rows: np.ndarray, vals: np.ndarray, n_rows: int) -> tuple[np.ndarray, list[int], list[int],
                                                                      list[list[int]], list[tuple[int, list[int]]]]:
    """Each row's count, total, max, p50/p90/p99 and histogram (trimmed) of the values given it (``rows[i]``
    holds ``vals[i]``): one sort of every value by (row, value)."""
    s = vals[np.lexsort((vals, rows))]
    counts = np.bincount(rows, minlength=n_rows).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(s)])
    totals = (cum[starts + counts] - cum[starts]).tolist()
    maxima = (np.where(counts > 0, s[np.maximum(starts + counts - 1, 0)], 0) if len(s)
              else np.zeros(len(counts), np.int64)).tolist()
    return counts, totals, maxima, grouped_percentiles(s, starts, counts).tolist(), grouped_histograms(s, starts, counts)


class _MembersForm:
    """A group's members as a pattern carries them (FunctionPattern v3): a range when they are
    equally spaced (:func:`members_range`), else listed; worked out once per group's member list
    (the fold shares one list per group)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[list[int], list[int], tuple[int, int, int]]] = {}

    def __call__(self, ranks: list[int]) -> tuple[list[int], tuple[int, int, int]]:
        known = self._seen.get(id(ranks))
        if known is None or known[0] is not ranks:
            span = members_range(ranks)
            known = self._seen[id(ranks)] = (ranks, [] if span else list(ranks), span or NO_MEMBERS_RANGE)
        return list(known[1]), known[2]


def _signatures(windows: int, g: Grouped, win: list[int], gid: list[int], kind: list[int]) -> list[str]:
    """Each window's signature (:func:`.rank_records.signature_token`) from its functions."""
    tokens: list[set[str]] = [set() for _ in range(windows)]
    for k, f, kd in zip(win, gid, kind, strict=True):
        t = signature_token(g.names[f], kd)
        if t:
            tokens[k].add(t)
    return [hashlib.sha1("\n".join(sorted(t)).encode()).hexdigest()[:12] for t in tokens]


def _records(closing: Sequence[Closing], g: Grouped, names: list[str], signatures: list[str], p_win: np.ndarray,
             p_name: np.ndarray, p_group: np.ndarray, p_kind: np.ndarray, counts: np.ndarray, totals: list[int],
             maxima: list[int], q: list[list[int]], hists: list[tuple[int, list[int]]]) -> list[Routed]:
    """The records of each window, its patterns (name order) then its RankWindow."""
    a, m = g.a.tolist(), g.m.tolist()
    overflow, nbytes = g.overflow.tolist(), g.nbytes.tolist()
    bounds = np.searchsorted(p_win, np.arange(len(closing) + 1)).tolist()
    name_l, group_l, kind_l, count_l = p_name.tolist(), p_group.tolist(), p_kind.tolist(), counts.tolist()
    p50, p90, p99 = q
    out: list[Routed] = []
    members = _MembersForm()
    for k, c in enumerate(closing):
        header = window_fields(FUNCTION_PATTERN_VERSION, c.meta, c.window_id, c.window_s, signatures[k])
        mesh = {str(key): int(v) for key, v in c.meta.mesh_coords.items()}
        steps = int(recorded_steps(c.w.steps, c.meta.functional_steps))
        functions = []
        for i in range(bounds[k], bounds[k + 1]):  # by index: no row tuples (fewer objects for the GC)
            name, grp = names[name_l[i]], group_l[i]
            if grp >= 0:
                functions.append(name)
                ranks, span = members(g.group_ranks[grp])
                nb, over = nbytes[grp], overflow[grp]
                seqs, durs = (g.seq[a[grp]:m[grp]].tolist(), g.val[a[grp]:m[grp]].tolist()) if m[grp] > a[grp] else ([], [])
            else:
                ranks, span, nb, over, seqs, durs = [], NO_MEMBERS_RANGE, 0, 0, [], []
            first, hist = hists[i]
            out.append((FUNCTION_PATTERN, FunctionPattern(
                **header, function=name, kind=kind_l[i], steps=steps, count=count_l[i] + over, total_ns=totals[i],
                p50_ns=p50[i], p90_ns=p90[i], p99_ns=p99[i], max_ns=maxima[i], hist=[],
                group_ranks=ranks, bytes=nb, seqs=seqs, seq_dur_ns=durs, mesh_coords=dict(mesh),
                hist_first=first, hist_counts=hist,
                group_ranks_first=span[0], group_ranks_step=span[1], group_ranks_count=span[2])))
        functions = [f for f in functions if not f.startswith(KIND_PREFIX)]
        out.append((RANK_WINDOW, rank_window_record(c.meta, c.window_id, c.window_s, signatures[k], c.w, c.progress,
                                                    c.health, functions, batches=c.batches, ended=c.ended)))
    return out
