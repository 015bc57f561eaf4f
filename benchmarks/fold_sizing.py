"""Sizing a chunk-wide fold: what folding 500 batches at once into today's accumulators could gain.

``python -m benchmarks.fold_sizing --json`` builds the batches of ``benchmarks.throughput``'s
workload (512 ranks, 12 s by default), decodes them once, then times on this process's CPU:

* ``event_fold_us_per_event``: ``RankSummarizer.add_events`` batch by batch, as the
  summarize agent calls it (the fold the worker runs; no window closing);
* ``chunk_fold_us_per_event``: a *prototype*: the spans and collectives of ``--chunk``
  batches (the agent's chunk) concatenated into columns, wall time, window and function
  computed with numpy, the span time net of nested collective time by one ``covered_ns`` over
  the whole chunk (the rank in the time key), then one sort by (batch, window, function)
  and one ``list.extend`` per group into the same ``WindowAcc``/``FunctionAcc`` objects the
  closing code reads. On the benchmark's batches (all plausible, no in-flight markers) it
fills the same (rank, window, function) accumulators with the same durations as the real
fold (checked in tests/unit/benchmarks/test_fold_sizing.py).

The prototype leaves out what the real fold also does (plausibility and duration checks,
the rank's sticky progress: last function, pending collective, the open-window cap, late
events, iterations and CPU samples), so its figure is a *lower bound* on the cost of a
chunk-wide fold that keeps today's accumulators. ``groups`` / ``events_per_group``: the
(batch, window, function) groups it appends, the Python work left per group
(docs/benchmarks.md, "What would lift it next").
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from perftracker.collectors.batch import event_count
from perftracker.schemas.vocabulary import SpanKind
from perftracker.streams.detect import DetectionPolicy
from perftracker.streams.detect.accumulate import WindowAcc
from perftracker.streams.detect.model import comm_function
from perftracker.streams.detect.rank_events import covered_ns

from .throughput import AgentCalls, decode_all, encode_job
from .workload import Workload

COLLECTIVE_KIND = int(SpanKind.COLLECTIVE)


def event_fold(decoded: list[dict]) -> float:
    """CPU seconds of ``add_events`` over every batch, one summarizer per rank (as the agent keeps them)."""
    calls = AgentCalls.create()
    now = time.time_ns() // 1_000_000
    start = time.process_time()
    for batch in decoded:
        calls.summarizer_for(batch).add_events(batch, now)
    return time.process_time() - start


def _columns(chunk: list[dict], part: str, keys: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    cols = tuple(np.concatenate([np.asarray(b[part][k], dtype=np.int64) for b in chunk]) for k in keys)
    which = np.concatenate([np.full(len(b[part][keys[0]]), i, dtype=np.int64) for i, b in enumerate(chunk)])
    return (*cols, which)


def _groups(keys: tuple[np.ndarray, ...]) -> tuple[np.ndarray, list[int]]:
    """Sort order by the key columns (last is primary) and the group boundaries in it."""
    order = np.lexsort(keys)
    stacked = np.stack([k[order] for k in keys])
    cuts = np.flatnonzero(np.any(stacked[:, 1:] != stacked[:, :-1], axis=0)) + 1
    return order, [0, *cuts.tolist(), len(order)]


def chunk_fold(chunk: list[dict], windows: dict[tuple[int, int], WindowAcc], window_ms: int) -> int:
    """Fold one chunk (see the module docstring); returns the groups appended."""
    offset = np.array([b["wall_ns"] - b["mono_ns"] for b in chunk], dtype=np.int64)
    base = np.cumsum([0] + [len(b["names"]) for b in chunk[:-1]])
    names = [n for b in chunk for n in b["names"]]
    kind, name, start, dur, sb = _columns(chunk, "spans", ("kind", "name", "start_ns", "dur_ns"))
    op, grp, seq, cstart, cdur, cb = _columns(chunk, "comms", ("op", "group", "seq", "start_ns", "dur_ns"))
    shift = np.int64(1) << 40  # the batch in the time key: one covered_ns for the chunk
    net = dur - covered_ns(cb * shift + cstart, cb * shift + cstart + cdur, sb * shift + start,
                           sb * shift + start + dur)
    wid = (offset[sb] + start) // 1_000_000 // window_ms
    cwid = (offset[cb] + cstart + np.maximum(cdur, 0)) // 1_000_000 // window_ms
    gbase = np.cumsum([0] + [len(b["groups"]) for b in chunk[:-1]])
    group_ids = [str(g["group_id"]) for b in chunk for g in b["groups"]]
    comm_names: dict[tuple[int, int], str] = {}  # (name index, group index) -> comm:<op>:<group>
    appended = 0
    for batch, win, fn, fn2, values, extra, k in (
            (sb, wid, base[sb] + name, np.zeros_like(sb), net, None, kind),
            (cb, cwid, base[cb] + op, gbase[cb] + grp, cdur, seq, None)):
        order, cuts = _groups((fn2, fn, win, batch))
        b_l, w_l, f_l, g_l = batch[order].tolist(), win[order].tolist(), fn[order].tolist(), fn2[order].tolist()
        v_l = values[order].tolist()
        k_l = k[order].tolist() if k is not None else None
        x_l = extra[order].tolist() if extra is not None else None
        for a, z in zip(cuts[:-1], cuts[1:], strict=True):
            key = (int(chunk[b_l[a]]["rank"]), w_l[a])
            w = windows.get(key)
            if w is None:
                w = windows[key] = WindowAcc()
            if k_l is not None:
                acc = w.fn(names[f_l[a]], k_l[a])
            else:
                function = comm_names.get((f_l[a], g_l[a]))
                if function is None:
                    function = comm_names[(f_l[a], g_l[a])] = comm_function(names[f_l[a]], group_ids[g_l[a]])
                acc = w.fn(function, COLLECTIVE_KIND)
            if x_l is None:
                acc.durations.extend(v_l[a:z])
            else:
                acc.seqs.extend(x_l[a:z])
                acc.seq_durs.extend(v_l[a:z])
            appended += 1
    return appended


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output is the same)")
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--chunk", type=int, default=500, help="batches per chunk (the agent's TAKE_MESSAGES)")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many timings of each")
    args = parser.parse_args(argv)
    policy = DetectionPolicy()
    job = encode_job(Workload(ranks=args.ranks, seconds=args.seconds), time.time_ns() - (args.seconds + 5) * 10**9)
    decoded = [r for _n, r in decode_all(job)]
    events = sum(event_count(b) for b in decoded)
    event_s = min(event_fold(decoded) for _ in range(args.repeat))
    chunk_runs = []
    for _ in range(args.repeat):
        windows: dict[tuple[int, int], WindowAcc] = {}
        start = time.process_time()
        groups = sum(chunk_fold(decoded[i:i + args.chunk], windows, policy.window_ms)
                     for i in range(0, len(decoded), args.chunk))
        chunk_runs.append((time.process_time() - start, groups))
    chunk_s, groups = min(chunk_runs)
    print(json.dumps({
        "event_fold_us_per_event": round(event_s / events * 1e6, 3),
        "chunk_fold_us_per_event": round(chunk_s / events * 1e6, 3),
        "ratio": round(event_s / chunk_s, 2), "events": events, "batches": len(decoded),
        "groups": groups, "events_per_group": round(events / max(groups, 1), 2),
        "ranks": args.ranks, "chunk": args.chunk}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
