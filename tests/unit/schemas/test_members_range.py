"""A process group's members as a range (EventBatch v9, FunctionPattern v3): what is sent as one
reads back as the same members, and anything else is sent listed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from perftracker_ml.schemas.records import group_members, group_size, members_range


@given(st.lists(st.integers(0, 10_000), max_size=12))
def test_a_range_reads_back_as_the_members_and_anything_else_is_listed(ranks: list[int]) -> None:
    span = members_range(ranks)
    if span is None:
        group = {"ranks": ranks}
        step = ranks[1] - ranks[0] if len(ranks) >= 2 else 0
        assert len(ranks) < 3 or step < 1 or ranks != list(range(ranks[0], ranks[0] + step * len(ranks), step))
    else:
        group = {"ranks": [], "ranks_first": span[0], "ranks_step": span[1], "ranks_count": span[2]}
    assert group_members(group) == ranks
    assert group_size(group) == len(set(ranks))


def test_data_and_tensor_parallel_groups_are_ranges_and_a_range_without_a_step_has_no_members() -> None:
    assert members_range(list(range(3, 100_000, 32))) == (3, 32, 3125)  # a DP group, TP 8 x PP 4
    assert members_range([8, 9, 10, 11, 12, 13, 14, 15]) == (8, 1, 8)  # a TP group
    assert members_range([0, 4]) is None and members_range([5, 3, 1]) is None and members_range([1, 1, 1]) is None
    assert group_members({"ranks": [], "ranks_first": 4, "ranks_step": 0, "ranks_count": 3}) == []
    prefixed = {"group_ranks": [], "group_ranks_first": 1, "group_ranks_step": 2, "group_ranks_count": 3}
    assert group_members(prefixed, "group_ranks") == [1, 3, 5] and group_size(prefixed, "group_ranks") == 3
