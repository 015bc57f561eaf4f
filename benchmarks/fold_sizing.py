"""The summarizer's fold, one batch at a time against a chunk at once: ``python -m benchmarks.fold_sizing --json``.

Builds the batches of ``benchmarks.throughput``'s workload (512 ranks, 12 s by default),
decodes them once, then times on this process's CPU, each on fresh summarizers (one per
rank, as the agent keeps them; no window closing):

* ``event_fold_us_per_event``: ``RankSummarizer.add_events`` batch by batch (the chunk fold of
  a chunk of one: what the trace importer and one-record callers pay);
* ``chunk_fold_us_per_event``: ``summarize.add_batches`` over chunks of ``--chunk`` batches
  (the agent's ``TAKE_MESSAGES``): ``streams/detect/chunk_fold.py``, the chunk's columns
  folded with numpy, Python per distinct name, (rank, window, function) group and rank.
  ``sequential_batches``: those it folded alone (none on this clean job).

Both leave the same state (``tests/unit/streams/detect/test_chunk_fold.py``). Before the chunk
fold was built, this benchmark timed a prototype of it (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import time

from perftracker_ml.collectors.batch import event_count
from perftracker_ml.deploy.workloads.batches import Workload
from perftracker_ml.streams.detect import DetectionPolicy, RankSummarizer
from perftracker_ml.streams.detect.summarize import add_batches

from .throughput import decode_all, encode_job


def event_fold(decoded: list[dict], policy: DetectionPolicy) -> float:
    """CPU seconds of ``add_events`` over every batch, one summarizer per rank."""
    summarizers: dict[int, RankSummarizer] = {}
    now = time.time_ns() // 1_000_000
    start = time.process_time()
    for b in decoded:
        s = summarizers.get(b["rank"])
        if s is None:
            s = summarizers[b["rank"]] = RankSummarizer(b["job"], b["rank"], policy)
        s.add_events(b, now)
    return time.process_time() - start


def chunk_fold(decoded: list[dict], policy: DetectionPolicy, chunk: int) -> tuple[float, int]:
    """(CPU seconds, batches folded one at a time) of ``add_batches`` over chunks of ``chunk``."""
    summarizers: dict[int, RankSummarizer] = {}
    now = time.time_ns() // 1_000_000
    sequential = 0
    start = time.process_time()
    for i in range(0, len(decoded), chunk):
        items = []
        for b in decoded[i:i + chunk]:
            s = summarizers.get(b["rank"])
            if s is None:
                s = summarizers[b["rank"]] = RankSummarizer(b["job"], b["rank"], policy)
            items.append((s, False, b))
        sequential += add_batches(items, now).sequential
    return time.process_time() - start, sequential


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output is the same)")
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--chunk", type=int, default=500, help="batches per chunk (the agent's TAKE_MESSAGES)")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many timings of each, alternated")
    args = parser.parse_args(argv)
    policy = DetectionPolicy()
    job = encode_job(Workload(ranks=args.ranks, seconds=args.seconds), time.time_ns() - (args.seconds + 5) * 10**9)
    decoded = [r for _n, r in decode_all(job)]
    events = sum(event_count(b) for b in decoded)
    event_runs, chunk_runs = [], []
    for _ in range(args.repeat):
        event_runs.append(event_fold(decoded, policy))
        chunk_runs.append(chunk_fold(decoded, policy, args.chunk))
    event_s = min(event_runs)
    chunk_s, sequential = min(chunk_runs)
    print(json.dumps({
        "event_fold_us_per_event": round(event_s / events * 1e6, 3),
        "chunk_fold_us_per_event": round(chunk_s / events * 1e6, 3),
        "ratio": round(event_s / chunk_s, 2), "events": events, "batches": len(decoded),
        "sequential_batches": sequential, "ranks": args.ranks, "chunk": args.chunk}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
