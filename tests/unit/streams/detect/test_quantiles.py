"""The window percentiles are numpy's, to the last integer, from a cheaper path."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.streams.detect.histogram import histogram
from perftracker.streams.detect.quantiles import percentiles


@pytest.mark.parametrize("low, high", [(0, 5), (0, 10**7), (2**60, 2**62), (-(2**62), 2**62)])
def test_percentiles_equal_numpy_linear_method(low: int, high: int) -> None:
    rng = np.random.default_rng(7)
    for n in [1, 2, 3, 4, 5, 10, 11, 99, 100, 101, 257]:
        for _ in range(20):
            d = rng.integers(low, high, n, dtype=np.int64)
            assert percentiles(d) == [int(x) for x in np.percentile(d, [50, 90, 99])]


def test_percentiles_of_nothing_are_zero() -> None:
    assert percentiles(np.zeros(0, np.int64)) == [0, 0, 0]


def test_histogram_counts_are_plain_ints() -> None:
    counts = histogram(np.asarray([1_000_000, 1_000_000, 5], dtype=np.int64))
    assert counts[79] == 2 and counts[9] == 1 and sum(counts) == 3
    assert all(type(c) is int for c in counts)
