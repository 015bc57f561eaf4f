"""The window percentiles are numpy's, to the last integer, from a cheaper path."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker_ml.schemas.records import full_histogram
from perftracker_ml.streams.detect.histogram import bucket_of, grouped_histograms, histogram
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


def test_histogram_counts_are_plain_ints_from_the_lowest_bucket_held() -> None:
    first, counts = histogram(np.asarray([1_000_000, 1_000_000, 5], dtype=np.int64))
    assert first == 9 and len(counts) == 79 - 9 + 1 and counts[0] == 1 and counts[-1] == 2 and sum(counts) == 3
    assert all(type(c) is int for c in counts)
    full = full_histogram({"hist_first": first, "hist_counts": counts})
    assert full[79] == 2 and full[9] == 1 and sum(full) == 3 and len(full) == 80
    assert histogram(np.zeros(0, np.int64)) == (0, []) and full_histogram({"hist_first": 0, "hist_counts": []}) == []


@pytest.mark.parametrize("low, high", [(1, 2), (0, 10**7), (10**9, 4 * 10**12)])
def test_trimmed_histogram_is_the_bincount_from_bucket_0_without_its_zeros_at_either_end(low: int, high: int) -> None:
    rng = np.random.default_rng(3)
    for n in [1, 2, 5, 50]:
        d = rng.integers(low, high, n, dtype=np.int64)
        first, counts = histogram(d)
        whole = np.bincount(bucket_of(d)).tolist()
        assert full_histogram({"hist_first": first, "hist_counts": counts}) == whole and counts[0] > 0 and counts[-1] > 0


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
