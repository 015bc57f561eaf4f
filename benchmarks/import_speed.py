"""Kineto trace import speed and memory: ``python -m benchmarks.import_speed --json``.

Generates a data-parallel transformer job's profiler traces (:mod:`perftracker_ml.deploy.workloads.kineto`:
``--ranks`` files of ``--steps`` steps, ~1 MB per rank and step; 16 x 8 by default, ~150 MB)
into a temporary directory (or reads ``--dir``), then times the path of
``perftracker import-traces``: ``import_traces_with_report`` (read, JSON decode, event
table, EventBatch per rank, the detection core, diagnosis rows).

* ``mb_per_s``: uncompressed trace bytes / wall seconds of the whole import (best of
  ``--repeat``); ``parse_mb_per_s``: the same for reading and parsing alone
  (``load_batches``), without the detection core.
* ``peak_mb``: tracemalloc's peak over one more (traced) import: every Python and numpy
  allocation, the file's bytes included. ``trace_mb`` is the total uncompressed size,
  ``largest_trace_mb`` the largest single file: traces are parsed one at a time, so
  ``peak_over_largest`` (peak / largest file) is the ratio that matters for one big trace.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from perftracker_ml.deploy.workloads.kineto import TraceJob, write_job
from perftracker_ml.streams.traces.importer import import_traces_with_report, load_batches

from .throughput import cpu_model

GOAL_MB_PER_S = 50.0
GOAL_PEAK_RATIO = 3.0


def trace_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.json") if p.is_file())


def best_seconds(fn, repeat: int) -> tuple[float, float]:
    """(best wall s, its CPU s) over ``repeat`` calls."""
    runs = []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        runs.append((time.perf_counter() - w, time.process_time() - c))
    return min(runs)


def traced_peak(fn) -> int:
    """Peak bytes allocated while ``fn`` runs (tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def summary(total_bytes: int, largest_bytes: int, import_s: tuple[float, float], parse_s: float,
            peak_bytes: int) -> dict:
    mb = total_bytes / 1e6
    return {
        "mb_per_s": round(mb / import_s[0], 1) if import_s[0] > 0 else 0.0,
        "peak_mb": round(peak_bytes / 1e6, 1), "trace_mb": round(mb, 1),
        "parse_mb_per_s": round(mb / parse_s, 1) if parse_s > 0 else 0.0,
        "cpu_mb_per_s": round(mb / import_s[1], 1) if import_s[1] > 0 else 0.0,
        "largest_trace_mb": round(largest_bytes / 1e6, 1),
        "peak_over_largest": round(peak_bytes / largest_bytes, 2) if largest_bytes else 0.0,
        "peak_over_total": round(peak_bytes / total_bytes, 2) if total_bytes else 0.0,
        "import_s": round(import_s[0], 2), "import_cpu_s": round(import_s[1], 2), "parse_s": round(parse_s, 2),
        "goal_mb_per_s": GOAL_MB_PER_S, "goal_peak_over_trace": GOAL_PEAK_RATIO,
    }


def run(directory: Path, repeat: int) -> dict:
    files = trace_files(directory)
    sizes = [p.stat().st_size for p in files]
    rows: list = []

    def full() -> None:
        rows[:] = import_traces_with_report(directory, "bench")[0]

    import_s = best_seconds(full, repeat)
    parse_s = best_seconds(lambda: load_batches(directory, "bench"), repeat)[0]
    peak = traced_peak(full)
    out = summary(sum(sizes), max(sizes), import_s, parse_s, peak)
    out.update({"files": len(files), "anomalies": len(rows),
                "culprits": sorted({r for row in rows for r in row["ranks"]})})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", type=Path, help="import these traces instead of generating them")
    args = ap.parse_args(argv)
    tmp = None
    if args.dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="pt-import-bench-"))
        job = TraceJob(ranks=args.ranks, steps=args.steps, layers=args.layers)
        write_job(job, tmp)
    try:
        out = run(args.dir or tmp, args.repeat)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.dir is None:
        out.update({"ranks": args.ranks, "steps": args.steps, "layers": args.layers})
    out.update({"cpus": os.cpu_count(), "cpu_model": cpu_model(), "load_avg_1m": round(os.getloadavg()[0], 2),
                "date": time.strftime("%Y-%m-%d")})
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
