"""``benchmarks.catch_up`` compares the real worker's windows with the live run's from each run's
own first window: the worker's job is produced later, so its window ids are higher."""

from __future__ import annotations

from benchmarks.catch_up import Outcome


def test_runs_of_the_same_job_at_different_times_compare_window_for_window() -> None:
    live, later = Outcome(), Outcome()
    for rank in range(3):
        for w in range(4):
            live.windows[(rank, 100 + w)] = 4
            later.windows[(rank, 250 + w)] = 4
    later.windows[(0, 254)] = 0  # past the job's last window: a silent rank's empty window
    assert live.upto(103) != later.upto(253)  # absolute ids: never equal
    assert live.relative(100, 103) == later.relative(250, 253)
    later.windows[(2, 251)] = 3
    assert live.relative(100, 103) != later.relative(250, 253)
