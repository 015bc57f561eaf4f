"""The late-arriver culprit rule (:func:`is_late_culprit`) on both sides of each threshold."""

from perftracker_ml.schemas.records import Straggler
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.columnar import binomial_tail
from perftracker_ml.streams.detect.late_arrival import is_late_culprit

POL = DetectionPolicy(min_cost_ms_per_step=1.0)
STEP_MS = 100.0  # step-share floor: 3 ms per step


def late(k: int, n: int, members: int = 4, caused: float = 7.0) -> Straggler:
    return Straggler(rank=2, host="h", gpu=-1, late_seqs=k, late_fraction=k / n, caused_ms_per_step=caused,
                     p_value=binomial_tail(k, n, 1 / members))


def test_many_calls_rule_needs_only_the_strict_p_value():
    assert is_late_culprit(late(30, 60, caused=0.1), 0.0, POL)  # p = 3e-5: cost and majority not asked
    assert late(20, 60)["p_value"] > POL.late_p_value
    assert not is_late_culprit(late(20, 60, caused=0.1), STEP_MS, POL)  # 1/3: not a majority


def test_issue_case_four_of_six_among_four_ranks_is_a_culprit():
    s = late(4, 6)  # p = 0.038, causing 7 ms of a 100 ms step
    assert POL.late_p_value < s["p_value"] < POL.late_majority_p_value
    assert is_late_culprit(s, STEP_MS, POL)


def test_majority_must_be_more_than_half():
    assert not is_late_culprit(late(3, 6, members=8), STEP_MS, POL)  # half, p = 0.03 among 8
    assert is_late_culprit(late(4, 7, members=8), STEP_MS, POL)  # 4 of 7 > half


def test_majority_p_value_on_both_sides():
    # 2 members: chance is 1/2, last in 4 of 6 is p = 0.34 (no evidence); 6 of 6 is p = 0.016
    assert late(4, 6, members=2)["p_value"] > POL.late_majority_p_value
    assert not is_late_culprit(late(4, 6, members=2), STEP_MS, POL)
    assert is_late_culprit(late(6, 6, members=2), STEP_MS, POL)
    # 4 members: 3 of 5 is p = 0.104, 4 of 5 is p = 0.016
    assert not is_late_culprit(late(3, 5), STEP_MS, POL)
    assert is_late_culprit(late(4, 5), STEP_MS, POL)


def test_cost_floor_relative_to_the_step_on_both_sides():
    assert not is_late_culprit(late(4, 6, caused=2.9), STEP_MS, POL)  # < 3 % of 100 ms
    assert is_late_culprit(late(4, 6, caused=3.0), STEP_MS, POL)
    assert not is_late_culprit(late(4, 6, caused=5.0), 200.0, POL)  # < 3 % of 200 ms


def test_absolute_cost_floor_and_unknown_step():
    assert not is_late_culprit(late(4, 6, caused=0.9), 10.0, POL)  # step share 0.3 ms, absolute 1 ms
    assert is_late_culprit(late(4, 6, caused=1.0), 10.0, POL)
    assert not is_late_culprit(late(4, 6, caused=50.0), 0.0, POL)  # no step time: strict rule only


def test_a_clear_majority_is_beyond_chance_in_a_two_rank_group():
    """Live fault suite: a 2-rank pair group, 272 calls, one rank last in 60 % (p = 4e-4),
    causing 1.25 ms of an 8 ms step, before any fault: in a pair one rank is always last."""
    noise = late(163, 272, members=2, caused=1.25)
    assert POL.late_p_value < noise["p_value"] < POL.late_majority_p_value
    assert not is_late_culprit(noise, 8.0, POL, members=2)
    assert is_late_culprit(noise, 8.0, POL)  # group size unknown: more than half, as before
    assert is_late_culprit(late(6, 6, members=2), STEP_MS, POL, members=2)  # 6 of 6: p = 0.016
    # 4 members: more than 62.5 %; 8 members: more than 56 %
    assert is_late_culprit(late(4, 6), STEP_MS, POL, members=4)
    assert not is_late_culprit(late(5, 9), STEP_MS, POL, members=4)  # 56 %, p = 0.049
    assert is_late_culprit(late(4, 7, members=8), STEP_MS, POL, members=8)  # 57 %
