"""What the summarizer's RankWindows account for: real step numbers and dropped late events."""

import time

from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.sinks.rows import rank_window_rows
from perftracker_ml.streams.detect import DetectionPolicy, RankSummarizer

from .test_summarize import MS, POL, batch


def test_iterations_are_numbered_with_their_own_steps():
    """A window closes when a later batch arrived: its last_step is still its own, so the
    sink's iteration rows carry the steps that ran (none shifted onto the next window's)."""
    s = RankSummarizer("j", 0, DetectionPolicy(window_s=5.0, window_grace_s=2.0))
    sent, stored = [], []
    now = time.time_ns() // MS
    for rank, rec in batches(SyntheticJob("j", ranks=2, seconds=20)):
        if rank:
            continue
        sent += rec["iterations"]["step"]
        s.add_events(rec, now)
        for name, out in s.poll(now):
            if name == "RankWindow":
                stored += [row[2] for table, rows in rank_window_rows(out) if table == "iterations" for row in rows]
    assert len(stored) == len(set(stored)) > 0
    assert stored == sent[:len(stored)]


def test_a_job_that_ends_cleanly_has_every_step_sent_stored_without_waiting_for_the_clock():
    """The final batch closes the last, partial window: nothing sent stays behind."""
    s = RankSummarizer("j", 0, DetectionPolicy(window_s=5.0, window_grace_s=2.0))
    sent, stored, ended = [], [], []
    now = time.time_ns() // MS
    for rank, rec in batches(SyntheticJob("j", ranks=2, seconds=23, final=True)):
        if rank:
            continue
        sent += rec["iterations"]["step"]
        s.add_events(rec, now)  # the clock never moves: only data and the final batch close windows
        for name, out in s.poll(now):
            if name == "RankWindow":
                ended.append(out["ended_cleanly"])
                stored += [row[2] for table, rows in rank_window_rows(out) if table == "iterations" for row in rows]
    assert stored == sent and len(sent) > 300
    assert ended[-1] and not any(ended[:-1]) and s.final_closed >= 1


def test_events_too_late_for_their_window_are_counted_as_dropped():
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(spans=[(1, 0, 1.0, 10)], iters=[(5, 1.0, 40)]))
    s.add_events(batch(seq=2, spans=[(1, 0, 6.0, 10)], wall_at_s=7.0))
    assert [n for n, _ in s.poll(now_wall_ms=0)][-1] == "RankWindow"  # window 0 closed
    late = batch(seq=3, spans=[(1, 0, 2.0, 10), (1, 0, 6.5, 10)], iters=[(6, 2.0, 40)], wall_at_s=7.5)
    later = batch(seq=4, spans=[(1, 0, 11.0, 10)], wall_at_s=12.0)
    late["dropped_events"] = later["dropped_events"] = 4  # the collector's cumulative count travels on
    s.add_events(late)
    s.add_events(later)
    rw = [r for n, r in s.poll(now_wall_ms=0) if n == "RankWindow"][-1]
    assert s.skipped["late_event"] == 2
    assert rw["dropped_events"] == 4 + 2
