"""The window percentiles are numpy's, to the last integer, from a cheaper path."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker_ml.streams.detect.histogram import grouped_histograms, histogram
from perftracker_ml.streams.detect.quantiles import grouped_percentiles, percentiles


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


@pytest.mark.parametrize("low, high", [(0, 5), (0, 10**7), (10**9, 4 * 10**12), (2**60, 2**62)])
def test_grouped_percentiles_and_histograms_equal_one_call_per_group(low: int, high: int) -> None:
    """A window's functions closed together (rank_records.pattern_records) get each function's
    numbers: groups of every size, empty ones included, sorted as the caller sorts them."""
    rng = np.random.default_rng(11)
    for _ in range(30):
        counts = rng.choice([0, 1, 2, 3, 7, 10, 100, 101], size=rng.integers(1, 12))
        groups = [np.sort(rng.integers(low, high, n, dtype=np.int64)) for n in counts]
        s = np.concatenate(groups) if len(groups) else np.zeros(0, np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        q = grouped_percentiles(s, starts, np.asarray(counts))
        hists = grouped_histograms(s, starts, np.asarray(counts))
        for i, g in enumerate(groups):
            assert q[:, i].tolist() == percentiles(g)
            assert hists[i] == histogram(g)
