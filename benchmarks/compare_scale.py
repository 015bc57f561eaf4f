"""One comparison window at scale: ``python -m benchmarks.compare_scale [--json]``.

100,000 ranks x 100 functions (ms per step, lognormal jitter, a few slow ranks, two peer
groups) scored by :func:`perftracker_ml.streams.detect.columnar.peer_scores`, plus one
100,000-member collective over 20 seqs through ``collective_lateness``: the vectorized
math FunctionComparator runs, on one core. Prints ranks, functions, seconds (best of two
untraced runs) and peak_mb = input arrays + tracemalloc peak of the computation (MB),
plus the process's max RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import tracemalloc

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core

import numpy as np  # noqa: E402
from perftracker_ml.streams.detect import DetectionPolicy  # noqa: E402
from perftracker_ml.streams.detect.columnar import collective_lateness, peer_scores  # noqa: E402


def build(ranks: int, functions: int, seqs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.5, 50.0, size=(functions, 1))
    values = base * rng.lognormal(-0.00125, 0.05, size=(functions, ranks))
    values[:, rng.integers(ranks, size=5)] *= 1.5
    peer = (np.arange(ranks) >= ranks // 2).astype(np.int64)
    durs = rng.uniform(1e6, 5e6, size=(ranks, seqs))
    return values, peer, durs


def score(values: np.ndarray, peer: np.ndarray, durs: np.ndarray) -> tuple:
    pol = DetectionPolicy()
    scores = peer_scores(values, peer, min_peers=pol.min_peers, mad_threshold=pol.mad_threshold,
                         min_excess=pol.min_excess, min_cost=pol.min_cost_ms_per_step,
                         floor_rel=pol.noise_floor_rel, floor_ms=pol.noise_floor_ms)
    return scores, collective_lateness(durs)


def run(ranks: int, functions: int, seqs: int) -> dict:
    """Time one window (best of two runs, no tracing), then trace one more for peak memory."""
    values, peer, durs = build(ranks, functions, seqs)
    seconds = float("inf")
    for _ in range(2):
        t = time.perf_counter()
        scores, late = score(values, peer, durs)
        seconds = min(seconds, time.perf_counter() - t)
        del scores, late
    tracemalloc.start()
    scores, late = score(values, peer, durs)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    inputs_mb = (values.nbytes + peer.nbytes + durs.nbytes) / 2**20
    return {"ranks": ranks, "functions": functions, "seconds": round(seconds, 3),
            "peak_mb": round(peak / 2**20 + inputs_mb, 1), "compute_peak_mb": round(peak / 2**20, 1),
            "input_mb": round(inputs_mb, 1), "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "outliers": int(scores.outlier.sum()), "collective_seqs": seqs,
            "late_arrivers": int((late.late_seqs > 0).sum())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ranks", type=int, default=100_000)
    ap.add_argument("--functions", type=int, default=100)
    ap.add_argument("--seqs", type=int, default=20)
    args = ap.parse_args(argv)
    out = run(args.ranks, args.functions, args.seqs)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
