"""The collectors' pure-Python percentile agrees with numpy's default (linear) method."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker_ml.collectors.profiling import percentile


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
@pytest.mark.parametrize("q", [0, 50, 99, 100])
def test_matches_numpy_linear(n: int, q: float) -> None:
    rng = np.random.default_rng(n)
    values = sorted(int(v) for v in rng.integers(0, 10**9, size=n))
    assert percentile(values, q) == int(np.percentile(np.asarray(values, dtype=np.int64), q))
