"""Fixed log-bucket histogram of durations (ns): mergeable across ranks and windows.

Bucket i holds durations in [2^(i/4), 2^((i+1)/4)) ns (quarter-octaves, ~19% wide),
so a 1 ms duration lands in bucket 79 and an hour in bucket 167. Durations < 1 ns go
to bucket 0. A histogram travels trimmed, as FunctionPattern v3 carries it: ``(first, counts)``,
the counts of buckets ``first .. first + len(counts) - 1`` from the lowest to the highest bucket
holding a duration (a window's durations of one function span a few buckets of the ~170, so
the zeros below them were most of a pattern's bytes and of its decoding;
``schemas.records.full_histogram`` gives a pattern's whole list from bucket 0).
"""

from __future__ import annotations

import numpy as np

BUCKETS_PER_OCTAVE = 4


def bucket_of(dur_ns: np.ndarray) -> np.ndarray:
    """Bucket index of each duration."""
    d = np.maximum(np.asarray(dur_ns, dtype=np.float64), 1.0)
    return np.floor(np.log2(d) * BUCKETS_PER_OCTAVE).astype(np.int64)


def histogram(dur_ns: np.ndarray) -> tuple[int, list[int]]:
    """``(first, counts)``: the counts per bucket from the lowest bucket holding a duration to the
    highest; ``(0, [])`` for no durations."""
    if len(dur_ns) == 0:
        return 0, []
    b = bucket_of(dur_ns)
    first = int(b.min())
    return first, np.bincount(b - first).tolist()


def merge(a: list[int], b: list[int]) -> list[int]:
    """Sum of two histograms of any lengths."""
    n = max(len(a), len(b))
    out = np.zeros(n, dtype=np.int64)
    out[: len(a)] += np.asarray(a, dtype=np.int64)
    out[: len(b)] += np.asarray(b, dtype=np.int64)
    return [int(c) for c in out]


def quantile(hist: list[int], q: float) -> float:
    """Approximate q-quantile (ns): geometric middle of the bucket holding it."""
    counts = np.asarray(hist, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return 0.0
    idx = int(np.searchsorted(np.cumsum(counts), q * total, side="left"))
    return float(2.0 ** ((idx + 0.5) / BUCKETS_PER_OCTAVE))


def grouped_histograms(s: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> list[tuple[int, list[int]]]:
    """:func:`histogram` of many groups at once (``s``: each group's values sorted, group ``i``
    at ``s[starts[i]:starts[i] + counts[i]]``): one bucketing and one bincount for all."""
    groups = len(counts)
    if len(s) == 0:
        return [(0, []) for _ in range(groups)]
    bucket = bucket_of(s)
    held = counts > 0
    lo = np.zeros(groups, np.int64)
    hi = np.zeros(groups, np.int64)
    # sorted values: a group's first value has its lowest bucket, its last its highest
    lo[held] = bucket[starts[held]]
    hi[held] = bucket[(starts + counts - 1)[held]]
    group = np.repeat(np.arange(groups), counts)
    rel = bucket - lo[group]  # each value's bucket from its group's lowest: a narrow table
    width = int(rel.max()) + 1
    table = np.bincount(group * width + rel, minlength=groups * width).reshape(groups, width)
    lens = np.where(held, hi - lo + 1, 0)
    flat = table[np.arange(width) < lens[:, None]].tolist()  # row by row, each group's own buckets
    ends = np.cumsum(lens).tolist()
    firsts = lo.tolist()
    return [(firsts[i], flat[e - n:e]) for i, (e, n) in enumerate(zip(ends, lens.tolist(), strict=True))]
