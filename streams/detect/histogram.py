"""Fixed log-bucket histogram of durations (ns): mergeable across ranks and windows.

Bucket i holds durations in [2^(i/4), 2^((i+1)/4)) ns (quarter-octaves, ~19% wide),
so a 1 ms duration lands in bucket 79 and an hour in bucket 167. Durations < 1 ns go
to bucket 0. Counts are trimmed of trailing zeros, as FunctionPattern.hist stores them.
"""

from __future__ import annotations

import numpy as np

BUCKETS_PER_OCTAVE = 4


def bucket_of(dur_ns: np.ndarray) -> np.ndarray:
    """Bucket index of each duration."""
    d = np.maximum(np.asarray(dur_ns, dtype=np.float64), 1.0)
    return np.floor(np.log2(d) * BUCKETS_PER_OCTAVE).astype(np.int64)


def histogram(dur_ns: np.ndarray) -> list[int]:
    """Counts per bucket, trailing zeros trimmed."""
    if len(dur_ns) == 0:
        return []
    return np.bincount(bucket_of(dur_ns)).tolist()  # type: ignore[no-any-return]


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


def grouped_histograms(s: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    """:func:`histogram` of many groups at once (``s``: each group's values sorted, group ``i``
    at ``s[starts[i]:starts[i] + counts[i]]``): one bucketing and one bincount for all."""
    groups = len(counts)
    if len(s) == 0:
        return [[] for _ in range(groups)]
    bucket = bucket_of(s)
    width = int(bucket.max()) + 1
    group = np.repeat(np.arange(groups), counts)
    table = np.bincount(group * width + bucket, minlength=groups * width).reshape(groups, width)
    ends = (starts + counts - 1).tolist()
    top = bucket.tolist()
    rows = table.tolist()
    # sorted values: a group's last value has its highest bucket (trailing zeros trimmed)
    return [row[:top[e] + 1] if c else [] for row, e, c in zip(rows, ends, counts.tolist(), strict=True)]
