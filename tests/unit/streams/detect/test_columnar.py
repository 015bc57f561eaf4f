import numpy as np
from perftracker_ml.streams.detect.columnar import (
    binomial_tail,
    collective_lateness,
    peer_scores,
    seq_matrix,
)

KW = dict(min_peers=4, mad_threshold=5.0, min_excess=0.1, min_cost=1.0, floor_rel=0.02, floor_ms=0.05)


def test_one_slow_rank_is_the_only_outlier():
    rng = np.random.default_rng(0)
    v = 100 * rng.lognormal(0, 0.03, size=(3, 64))
    v[1, 17] *= 1.4
    s = peer_scores(v, np.zeros(64, dtype=np.int64), **KW)
    assert np.argwhere(s.outlier).tolist() == [[1, 17]]
    assert s.cost[1, 17] > 30 and s.z[1, 17] > 5


def test_identical_values_are_not_outliers_small_differences_floored():
    v = np.full((1, 8), 50.0)
    v[0, 3] = 50.4  # below the 2% noise floor and the 1 ms cost
    assert not peer_scores(v, np.zeros(8, dtype=np.int64), **KW).outlier.any()


def test_groups_scored_separately_and_small_groups_skipped():
    v = np.array([[10, 10, 10, 10, 20, 20, 20, 20, 99.0]])
    peer = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2])
    s = peer_scores(v, peer, **KW)
    assert not s.outlier.any()  # legitimate difference between groups; group 2 too small
    assert np.isnan(s.median[0, 8])


def test_nan_values_are_ignored():
    v = np.array([[10, 10, np.nan, 10, 10, 30.0]])
    s = peer_scores(v, np.zeros(6, dtype=np.int64), **KW)
    assert s.outlier[0].tolist() == [False] * 5 + [True]


def test_late_arriver_has_the_shortest_time_inside():
    # member 2 arrives 20 ms late every time: its time inside is pure transfer (5 ms)
    d = np.array([[25.0, 26, 24], [25, 25, 25], [5, 5, 5], [24, 25, 26]]) * 1e6
    late = collective_lateness(d)
    assert late.late_seqs.tolist() == [0, 0, 3, 0]
    assert late.caused_ns[2] / 1e6 > 55  # ~20 ms wait per seq, 3 seqs
    assert np.allclose(late.transfer_ns, 5e6)


def test_binomial_tail():
    assert binomial_tail(0, 10, 0.1) == 1.0
    assert abs(binomial_tail(10, 10, 0.5) - 0.5 ** 10) < 1e-12
    assert binomial_tail(11, 10, 0.5) == 0.0


def test_seq_matrix_keeps_only_common_seqs():
    a = (np.array([1, 2, 3]), np.array([10.0, 20, 30]))
    b = (np.array([2, 3, 4]), np.array([21.0, 31, 41]))
    common, d = seq_matrix([a, b])
    assert common.tolist() == [2, 3] and d.tolist() == [[20, 30], [21, 31]]
