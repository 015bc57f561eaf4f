"""A backlog (data read long after it was sent) closes and evaluates windows exactly as live.

The stages' grace used to run on the caller's clock only: while a worker was behind, ranks
whose next batch was more than a grace of reading away looked silent, their windows were
closed empty by the timer and their data then dropped as late. The job's clock
(streams/detect/job_clock.py) closes on data time while behind, on the caller's clock
while caught up or once the input stopped.
"""

from __future__ import annotations

import itertools
from collections import Counter

from perftracker_ml.deploy.workloads.ranks import MS, SLOW_RANK
from perftracker_ml.schemas.records import FunctionPattern
from perftracker_ml.schemas.vocabulary import FUNCTION_COMPARISON, RANK_WINDOW
from perftracker_ml.streams.detect import DetectionPolicy, FunctionComparator, RankSummarizer
from perftracker_ml.streams.detect.job_clock import JobClock
from perftracker_ml.streams.detect.job_windows import JobWindows
from perftracker_ml.streams.detect.model import kind_function
from perftracker_ml.streams.detect.rank_records import ALWAYS_AGGREGATED

from benchmarks.catch_up import Outcome, last_window, run_backlog, run_live

from .synth import rank_window
from .test_summarize import WALL0, batch

POL = DetectionPolicy(window_s=5.0, window_grace_s=3.0)
T0 = WALL0 // MS  # ms, a window edge
HOUR = 3_600_000


def rank_batches(rank: int, seconds: int) -> list[dict]:
    """One batch per second, one 100 ms forward span and one step in each."""
    return [batch(rank, seq=s + 1, wall_at_s=s + 1.0, spans=[(3, 1, s + 0.2, 100)], iters=[(s, s + 0.1, 500)])
            for s in range(seconds)]


def steps_by_window(records) -> dict[tuple[int, int], int]:
    return {(r["rank"], r["window_id"]): r["steps"] for n, r in records if n == "RankWindow"}


def test_job_clock_wall_while_caught_up_data_while_behind():
    c = JobClock(POL)
    assert c.by_wall(T0)  # nothing yet
    c.note(T0, T0 + 100)  # live: data about now
    assert c.by_wall(T0 + 2_000) and c.behind_ms(T0 + 2_000) == 2_000
    c.note(T0 - HOUR, T0 + 2_000)  # an hour-old batch just read: data time stays the latest seen
    c2 = JobClock(POL)
    c2.note(T0 - HOUR, T0)  # behind by an hour and reading
    assert not c2.by_wall(T0 + 1_000)
    assert c2.by_wall(T0 + 1_000 + POL.grace_ms + 1)  # input stopped for a grace: the wall decides
    assert not c2.data_past(T0 - HOUR)
    c2.note(T0 - HOUR + POL.grace_ms + POL.catch_up_margin_ms + 1, T0 + 1_100)
    assert c2.data_past(T0 - HOUR)
    c3 = JobClock(POL)
    c3.note(T0 + HOUR, T0)  # a clock an hour ahead counts as now (+ the future slack)
    assert c3.data_ms == T0 + POL.future_slack_ms


def test_backlog_of_ranks_read_slowly_drops_nothing_and_closes_the_same_windows():
    """Four ranks, 20 s of batches an hour old, read one batch per second of wall clock: each rank's
    next batch is 4 s of reading away (more than the grace). Every window closes with all its data."""
    seconds = 20
    live_clock, backlog_clock = JobClock(POL), JobClock(POL)
    live = [RankSummarizer("job", r, POL, live_clock) for r in range(4)]
    back = [RankSummarizer("job", r, POL, backlog_clock) for r in range(4)]
    per_rank = [rank_batches(r, seconds) for r in range(4)]
    live_out, back_out = [], []
    now = T0 + HOUR
    for s in range(seconds):
        for r in range(4):
            live[r].add_events(per_rank[r][s], T0 + (s + 1) * 1000 + 20)
            live_out += live[r].poll(T0 + (s + 1) * 1000 + 20)
            now += 1000  # one batch read per second
            back[r].add_events(per_rank[r][s], now)
            for x in back:  # the timer ticks between batches
                back_out += x.poll(now)
        for x in live:
            live_out += x.poll(T0 + (s + 1) * 1000 + 500)
    assert sum(x.skipped["late_event"] for x in back) == 0
    last = (T0 + seconds * 1000 - 1) // POL.window_ms
    done = {k: v for k, v in steps_by_window(live_out).items() if k[1] < last}
    assert done and {k: v for k, v in steps_by_window(back_out).items() if k[1] < last} == done
    assert all(v == 5 for v in done.values())


def test_rank_silent_in_a_backlog_still_closes_its_windows_once_the_jobs_data_moves_on():
    clock = JobClock(POL)
    alive, silent = RankSummarizer("job", 0, POL, clock), RankSummarizer("job", 1, POL, clock)
    now = T0 + HOUR
    silent.add_events(rank_batches(1, 1)[0], now)  # one batch, then nothing
    out = []
    for b in rank_batches(0, 20):
        now += 10  # reading fast: the wall clock barely moves
        alive.add_events(b, now)
        out += silent.poll(now)
    ids = sorted(r["window_id"] for n, r in out if n == "RankWindow")
    assert ids and ids[0] == T0 // POL.window_ms  # its first window, with its data, then empty ones
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    # data reached T0 + 20 s: windows ending a grace and a margin before that are closed
    assert ids[-1] == (T0 + 20_000 - POL.grace_ms - POL.catch_up_margin_ms - 1) // POL.window_ms - 1


def test_drained_backlog_closes_by_the_wall_clock():
    s = RankSummarizer("job", 0, POL)
    now = T0 + HOUR
    for b in rank_batches(0, 12):
        s.add_events(b, now)
        now += 10
    w0 = T0 // POL.window_ms
    assert [r["window_id"] for n, r in s.poll(now) if n == "RankWindow"] == [w0, w0 + 1]  # by its data
    assert s.poll(now + POL.grace_ms - 20) == []  # the last, partial one waits (the data is an hour old)
    later = now + POL.grace_ms  # no input for a grace: nothing more of the job is coming
    ids = [r["window_id"] for n, r in s.poll(later) if n == "RankWindow"]
    assert ids[:2] == [w0 + 2, w0 + 3]


def pattern(rank: int, wid: int, function: str = "Model.forward", world: int = 4) -> FunctionPattern:
    return FunctionPattern(schema_version=1, job="job", window_id=wid, window_start_ms=wid * POL.window_ms,
                           window_s=5.0, rank=rank, world_size=world, host="h", gpu=-1, signature="s",
                           function=function, kind=3, steps=10, count=10, total_ns=10 * 50 * MS,
                           p50_ns=50 * MS, p90_ns=50 * MS, p99_ns=50 * MS, max_ns=50 * MS, hist=[],
                           group_ranks=[], bytes=0, seqs=[], seq_dur_ns=[])


def test_comparator_behind_waits_for_every_rank_however_long_the_reading_takes():
    clock = JobClock(POL, POL.window_ms + POL.grace_ms)
    c = FunctionComparator("job", "Model.forward", POL, clock)
    other = FunctionComparator("job", "Model.backward", POL, clock)  # the job's other patterns keep coming
    wid = (T0 - HOUR) // POL.window_ms
    now = T0
    for rank in range(3):
        c.add(pattern(rank, wid), now)
        for _ in range(2 * POL.grace_ms // 1000):  # the next rank's pattern is two graces of reading away
            now += 1000
            other.add(pattern(rank, wid, "Model.backward"), now)
            assert c.poll(now) == []
    c.add(pattern(3, wid), now)
    (rec,) = c.poll(now)
    assert rec["ranks_seen"] == 4 and c.skipped["late_pattern"] == 0


def test_comparator_behind_evaluates_a_partial_window_once_the_jobs_data_moved_on():
    clock = JobClock(POL, POL.window_ms + POL.grace_ms)
    gc, fwd = FunctionComparator("job", "gc", POL, clock), FunctionComparator("job", "Model.forward", POL, clock)
    wid = (T0 - HOUR) // POL.window_ms
    gc.add(pattern(0, wid, "gc"), T0)  # only rank 0 collected garbage in that window
    for later in (1, 2):
        for rank in range(4):  # every rank moved on to later windows
            fwd.add(pattern(rank, wid + later), T0 + later * 10)
        polled = gc.poll(T0 + later * 10)
        assert bool(polled) == (later == 2)  # two windows on: a grace and the margin past its close


def test_comparator_behind_does_not_wait_past_its_buffer_for_ranks_never_seen():
    clock = JobClock(POL, POL.window_ms + POL.grace_ms)
    gc, fwd = FunctionComparator("job", "gc", POL, clock), FunctionComparator("job", "Model.forward", POL, clock)
    wid = (T0 - HOUR) // POL.window_ms
    gc.add(pattern(0, wid, "gc"), T0)  # ranks 1-3 report nothing this partition carries
    waited = 0
    for later in range(1, POL.max_open_windows):
        fwd.add(pattern(0, wid + later), T0 + later * 10)
        if gc.poll(T0 + later * 10):
            break
        waited = later
    assert waited * POL.window_ms == clock.straggle_ms  # then they count as stragglers, left out
    assert clock.straggle_ms == (POL.max_open_windows - 2) * POL.window_ms  # behind: the buffer less two windows


def test_live_a_rank_half_the_buffer_behind_is_left_out():
    """Live (the data about now), a rank half the window buffer behind has stopped; behind the
    job, the same rank may be in a partition read later, and it is waited for."""
    live, behind = JobClock(POL, POL.window_ms + POL.grace_ms), JobClock(POL, POL.window_ms + POL.grace_ms)
    half = POL.window_ms * (POL.max_open_windows // 2)
    for clock, now in ((live, T0), (behind, T0 + HOUR)):
        clock.note(T0 - half - POL.window_ms, now, rank=1, world=2)  # more than half the buffer behind
        clock.note(T0, now, rank=0, world=2)
    assert live.low_watermark() == T0  # rank 1 left out
    assert behind.low_watermark() == T0 - half - POL.window_ms  # rank 1 waited for


def test_job_clock_behind_waits_for_the_ranks_of_a_slower_partition_not_for_a_straggler():
    """Ranks 0-1 come from a partition read ahead of rank 2's (partition skew, round robin
    reading), rank 3 stopped reporting long ago: a point closes by data once ranks 0-2 are past it."""
    c = JobClock(POL, POL.window_ms + POL.grace_ms)
    base, now = T0 - HOUR, T0
    c.note(base - c.straggle_ms - POL.window_ms, now, rank=3)  # far behind: left out
    c.note(base, now, rank=2)
    far = base + POL.grace_ms + POL.catch_up_margin_ms + POL.window_ms
    for rank in (0, 1):
        c.note(far, now, rank=rank)  # the job's data well past ``base`` + grace + margin
    assert c.low_watermark() == base and not c.data_past(base)  # rank 2's window may still come
    c.note(base + POL.window_ms, now + 10, rank=2)  # rank 2 sent its next window: nothing more of the last
    assert c.data_past(base)
    assert not c.data_past(base + POL.window_ms)  # its next one still waits for rank 2
    c.note(far, now + 20)  # an input of no one rank moves only the job's latest
    assert c.low_watermark() == base + POL.window_ms


def test_comparator_behind_waits_for_ranks_of_a_partition_read_seconds_later():
    """Live the grace decides; behind the job, patterns of ranks whose events partition is read
    several windows later than the others' come before their window is compared (none late)."""
    clock = JobClock(POL, POL.window_ms + POL.grace_ms)
    fwd = FunctionComparator("job", "Model.forward", POL, clock)
    wid, now, out = (T0 - HOUR) // POL.window_ms, T0, []
    for w in range(wid, wid + 4):  # ranks 0-1: four windows read ahead (more than a grace and the margin)
        for rank in (0, 1):
            fwd.add(pattern(rank, w), now)
            now += 50
            out += fwd.poll(now)
    assert out == []
    for w in range(wid, wid + 4):  # ranks 2-3, read later: every window complete when it goes
        for rank in (2, 3):
            fwd.add(pattern(rank, w), now)
            now += 50
            out += fwd.poll(now)
    assert [r["ranks_seen"] for r in out] == [4, 4, 4, 4] and fwd.skipped["late_pattern"] == 0


def test_job_windows_behind_wait_for_every_rank_window():
    jw = JobWindows("job", POL, Counter())
    wid = (T0 - HOUR) // POL.window_ms
    now = T0
    for rank in range(3):
        jw.add(RANK_WINDOW, rank_window(rank, window=wid, world=4, steps=0), now)
        for _ in range(3 * POL.grace_ms // 1000 + 2):  # the next one is three graces of reading away
            now += 1000
            jw.add(FUNCTION_COMPARISON, {"job": "job", "window_id": wid, "function": f"f{now}"}, now)  # type: ignore[arg-type]
            assert jw.take_ready(now) == []
    jw.add(RANK_WINDOW, rank_window(3, window=wid, world=4, steps=0), now)
    assert [w.window_id for w in jw.take_ready(now)] == [wid]


def test_topology_backlog_read_slowly_diagnoses_as_live():
    """32 ranks (rank 1's layer slower, its DP peers the victims) through summarize -> compare ->
    diagnose: 15 s of batches read 60 s late at 25 ms of wall clock per batch (a rank's next batch
    0.8 s of reading away, a window's patterns spread over 4 s: more than the grace)."""
    backlog, live, last = backlog_and_live(32, 15)
    assert sum(backlog.dropped.values()) == 0 and not +backlog.late
    assert backlog.upto(last) == live.upto(last) and len({r for r, _ in live.windows}) == 32
    assert backlog.incidents == live.incidents
    assert any(r == (SLOW_RANK,) for _, r, _ in live.incidents), live.incidents


def backlog_and_live(ranks: int, seconds: int) -> tuple[Outcome, Outcome, int]:
    """The job through the topology read 60 s late at 25 ms of wall clock per batch, and live;
    (backlog, live, the job's last window)."""
    wms = DetectionPolicy().window_ms
    start = T0 - (seconds + 60) * 1000
    wall0 = (start - start % wms) * MS
    ticks = itertools.count()
    backlog, _, _ = run_backlog(ranks, seconds, 10, wall0, clock=lambda: T0 + 25 * next(ticks) // 3)
    assert isinstance(backlog, Outcome)
    return backlog, run_live(ranks, seconds, 10, wall0), last_window(wall0, seconds, wms)


def _compared(jw: JobWindows, wid: int, now: int) -> None:
    """The comparisons of the per-kind aggregates every rank with steps sends patterns of."""
    for kind in ALWAYS_AGGREGATED:
        jw.add(FUNCTION_COMPARISON, {"job": "job", "window_id": wid, "function": kind_function(kind)}, now)  # type: ignore[arg-type]


def test_job_windows_behind_a_silent_ranks_empty_windows_make_no_one_a_straggler():
    """A drained backlog's last windows close on the caller's clock, several per rank in one poll:
    rank 0's empty windows (it sent nothing in them) reach the diagnoser before the other ranks'
    last window with data. They must not make those ranks stragglers (the 8,192-rank backlog's
    lost incident: its last window evaluated with one rank, every other rank's record late)."""
    jw = JobWindows("job", POL, Counter())
    wid, now, world = (T0 - HOUR) // POL.window_ms, T0, 8
    for rank in range(world):
        jw.add(RANK_WINDOW, rank_window(rank, window=wid, world=world), now)
    _compared(jw, wid, now)
    assert [w.window_id for w in jw.take_ready(now)] == [wid]
    jw.add(RANK_WINDOW, rank_window(0, window=wid + 1, world=world), now)  # its last window with data
    ahead = POL.max_open_windows // 2 + 2  # past the straggler bound
    for w in range(wid + 2, wid + 2 + ahead):
        jw.add(RANK_WINDOW, rank_window(0, window=w, world=world, steps=0, batches=0), now)
    for rank in range(1, world - 1):
        jw.add(RANK_WINDOW, rank_window(rank, window=wid + 1, world=world), now)
        assert jw.take_ready(now) == []  # rank 7's window with data is still to come
    jw.add(RANK_WINDOW, rank_window(world - 1, window=wid + 1, world=world), now)
    _compared(jw, wid + 1, now)
    assert [w.window_id for w in jw.take_ready(now)][:1] == [wid + 1] and jw.skipped["late_record"] == 0


def test_job_windows_behind_a_rank_that_stopped_is_left_out_once_the_data_moves_on():
    """The straggler rule still holds, measured on windows with data: ranks 0-6 report the window
    buffer less two windows past rank 7's last (behind the job's bound), and its window is
    evaluated without it."""
    jw = JobWindows("job", POL, Counter())
    wid, now, world = (T0 - HOUR) // POL.window_ms, T0, 8
    for rank in range(world):
        jw.add(RANK_WINDOW, rank_window(rank, window=wid, world=world), now)
    _compared(jw, wid, now)
    assert len(jw.take_ready(now)) == 1
    ready = []
    for w in range(wid + 1, wid + 2 + jw.clock.behind_straggle_ms // POL.window_ms):
        for rank in range(world - 1):
            jw.add(RANK_WINDOW, rank_window(rank, window=w, world=world), now)
        ready += jw.take_ready(now)
    assert ready and ready[0].window_id == wid + 1 and len(ready[0].rank_windows) == world - 1


def test_topology_drained_backlog_closing_many_windows_per_poll_diagnoses_as_live(monkeypatch):
    """A 10 s job (two windows: the incident needs its last one, closed only once the drained
    backlog's input stopped) whose ranks each close more windows in one poll than the stragglers'
    bound (a worker whose summarize ticks run ahead of its diagnose agent): same as live."""
    import perftracker_ml.streams.detect.rank_windows as rank_windows

    monkeypatch.setattr(rank_windows, "MAX_CLOSED_PER_POLL", POL.max_open_windows - 1)
    backlog, live, last = backlog_and_live(32, 10)
    assert not +backlog.late and backlog.upto(last) == live.upto(last)
    assert backlog.incidents == live.incidents and any(r == (SLOW_RANK,) for _, r, _ in live.incidents)


def test_job_windows_behind_wait_for_the_comparisons_every_ranks_window_announces():
    """Behind the job, later windows' RankWindows come straight from the summarizers while a
    window's comparisons are one hop further (the comparators collect every rank's pattern
    first): the window waits for them, up to half the window buffer of data time (a 512-rank
    backlog evaluated its windows without their comparisons, all 60 came late, no incident)."""
    world, now = 8, T0
    wid = (T0 - HOUR) // POL.window_ms

    def rank_windows_upto(jw: JobWindows, last: int) -> list[int]:
        ready = []
        for w in range(wid, last + 1):
            for rank in range(world):
                jw.add(RANK_WINDOW, rank_window(rank, window=w, world=world), now)
            ready += [r.window_id for r in jw.take_ready(now)]
        return ready

    jw = JobWindows("job", POL, Counter())
    assert rank_windows_upto(jw, wid + POL.max_open_windows // 2) == []  # the data is past its close, the comparisons still coming
    _compared(jw, wid, now)
    ready = jw.take_ready(now)
    assert [w.window_id for w in ready][:1] == [wid] and len(ready[0].comparisons) == len(ALWAYS_AGGREGATED)
    assert jw.skipped["late_record"] == 0

    bounded = JobWindows("job", POL, Counter())  # comparisons that never come hold it half the buffer at most
    assert rank_windows_upto(bounded, wid + POL.max_open_windows // 2 + 2)[:1] == [wid]
    assert bounded.skipped["window_evicted"] == 0
