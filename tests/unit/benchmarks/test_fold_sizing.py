"""The chunk-fold prototype of ``benchmarks.fold_sizing`` sizes the real fold's work only if it
fills the same accumulators: on the benchmark's batches, the same (rank, window, function)
keys with the same durations, collective seqs and kinds as ``RankSummarizer.add_events``."""

from __future__ import annotations

import time

from perftracker.streams.detect import DetectionPolicy, RankSummarizer

from benchmarks.fold_sizing import chunk_fold
from benchmarks.throughput import decode_all, encode_job
from benchmarks.workload import Workload


def test_the_prototype_fills_what_the_real_fold_fills():
    policy = DetectionPolicy()
    job = encode_job(Workload(ranks=32, seconds=3), time.time_ns() - 8 * 10**9)
    decoded = [r for _n, r in decode_all(job)]
    real, proto, summarizers, windows = {}, {}, {}, {}
    for b in decoded:
        s = summarizers.setdefault(int(b["rank"]), RankSummarizer(b["job"], int(b["rank"]), policy))
        s.add_events(b, time.time_ns() // 1_000_000)
    for i in range(0, len(decoded), 50):
        chunk_fold(decoded[i:i + 50], windows, policy.window_ms)
    for rank, s in summarizers.items():
        for wid, w in s.windows.windows.items():
            for f, a in w.functions.items():
                real[(rank, wid, f)] = (a.kind, sorted(a.durations), sorted(zip(a.seqs, a.seq_durs, strict=True)))
    for (rank, wid), w in windows.items():
        for f, a in w.functions.items():
            proto[(rank, wid, f)] = (a.kind, sorted(a.durations), sorted(zip(a.seqs, a.seq_durs, strict=True)))
    assert len(real) > 100 and proto == real
