"""The end of a job: a rank's final batch closes its windows at once, and the job's end
resolves its open incidents once, "job finished" (every rank ended cleanly) or "job died"
(silence past idle_after_s without final batches); a hang in progress never ends a job."""

from __future__ import annotations

from collections import Counter

from perftracker_ml.schemas.vocabulary import (
    RANK_WINDOW,
    RESOLVED_JOB_DIED,
    RESOLVED_JOB_FINISHED,
    Status,
)
from perftracker_ml.streams.detect import DetectionPolicy, JobDiagnoser, RankSummarizer
from perftracker_ml.streams.detect.incidents import Track
from perftracker_ml.streams.detect.job_windows import ReadyWindow

from .test_summarize import MS, POL, WALL0, batch

WINDOW_MS = 5000
W0 = WALL0 // MS // WINDOW_MS  # the first window of the batches of test_summarize


def rank_windows(out):
    return [r for n, r in out if n == RANK_WINDOW]


def test_final_batch_closes_every_open_window_at_once_and_marks_the_last():
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(iters=[(0, 1.0, 40), (1, 2.0, 40)]))
    # steps in the next window, then the final batch: nothing later will close that window
    s.add_events(batch(seq=2, iters=[(2, 6.0, 40), (3, 7.0, 40)], wall_at_s=7.5))
    rws = rank_windows(s.poll(now_wall_ms=0))  # W0 closes: the rank's data is past its end
    s.add_events({**batch(seq=3, iters=[(4, 7.6, 40)], wall_at_s=7.7), "final": True})
    rws += rank_windows(s.poll(now_wall_ms=0))  # no clock progress at all: only the final batch closes
    assert [rw["window_id"] for rw in rws] == [W0, W0 + 1]
    assert [rw["steps"] for rw in rws] == [2, 3]  # every step sent is in a closed window
    assert [rw["ended_cleanly"] for rw in rws] == [False, True]
    assert s.final_closed == 1  # W0 closed by the data, W0 + 1 by the final batch
    assert s.poll(now_wall_ms=10**15) == []  # an ended rank emits no empty windows
    s.add_events(batch(seq=4, iters=[(5, 8.0, 40)], wall_at_s=8.5))  # the same process after its end
    assert s.skipped["after_final"] == 1 and s.poll(now_wall_ms=10**15) == []


def test_without_a_final_batch_the_last_window_waits_for_the_clock():
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(iters=[(0, 1.0, 40)]))
    assert rank_windows(s.poll(now_wall_ms=0)) == []
    assert s.final_closed == 0


def test_a_new_process_of_an_ended_rank_reports_again():
    s = RankSummarizer("job", 0, POL)
    s.add_events({**batch(iters=[(0, 1.0, 40)]), "final": True})
    assert [rw["ended_cleanly"] for rw in rank_windows(s.poll(now_wall_ms=0))] == [True]
    restarted = {**batch(seq=0, iters=[(0, 11.0, 40)], wall_at_s=11.5), "pid": 8}
    s.add_events(restarted)
    s.add_events({**batch(seq=1, iters=[(1, 12.0, 40)], wall_at_s=12.5), "pid": 8, "final": True})
    rws = rank_windows(s.poll(now_wall_ms=0))
    assert rws[-1]["ended_cleanly"] and sum(rw["steps"] for rw in rws) == 2
    assert rws[-1]["restarts"] == 1  # the new process is marked, under the same job id


# ---- the diagnoser's end rules ---------------------------------------------------------
DPOL = DetectionPolicy(window_s=5.0, window_grace_s=3.0, idle_after_s=60.0)
T0 = 1_700_000_000_000  # caller clock, ms


def rw(rank, wid, *, steps=10, batches=2, ended=False, world=2):
    return {"job": "j", "window_id": wid, "window_start_ms": wid * WINDOW_MS, "window_s": 5.0, "rank": rank,
            "world_size": world, "host": "h", "gpu": -1, "steps": steps, "batches": batches,
            "step_time_ns": [100 * MS] * steps, "last_step": wid * 10, "ended_cleanly": ended}


def open_incident(d: JobDiagnoser) -> None:
    """An open incident, as the lifecycle leaves it (its first record sent)."""
    rec = {"incident_id": "inc-1", "job": "j", "status": Status.OPEN.value, "last_seen_ms": T0,
           "impact_ms_per_step": 5.0, "resolved_reason": ""}
    d.tracks["slow|1"] = Track(streak=3, open=True, incident_id="inc-1", last_seen_ms=T0, last=rec)  # type: ignore[arg-type]
    d.tracks["candidate"] = Track(streak=1)  # not open: ends silently


def feed(d: JobDiagnoser, wid: int, now: int, *rws):
    for r in rws:
        d.add(RANK_WINDOW, r, now)
    return d.poll(now + 10 * 3000 + 2000)[0]  # past two graces + 1 s: the window is ready


def test_clean_exit_of_every_rank_resolves_open_incidents_once_as_job_finished():
    d = JobDiagnoser("j", DPOL)
    open_incident(d)
    assert feed(d, 1, T0, rw(0, 1, ended=True), rw(1, 1)) == []  # rank 1 still runs
    out = feed(d, 2, T0 + 5000, rw(1, 2, steps=3, ended=True))
    assert [(a["incident_id"], a["status"], a["resolved_reason"]) for a in out] == [
        ("inc-1", "RESOLVED", RESOLVED_JOB_FINISHED)]
    assert d.tracks == {} and d.end_reason == RESOLVED_JOB_FINISHED
    assert d.poll(T0 + 10**7)[0] == []  # once: nothing later resolves it again


def test_silence_without_final_batches_resolves_as_job_died_after_the_idle_limit():
    d = JobDiagnoser("j", DPOL)
    open_incident(d)
    feed(d, 1, T0, rw(0, 1, ended=True), rw(1, 1))  # rank 1 vanishes mid-step: no final batch
    last_alive = T0 + 32_000
    assert d.poll(last_alive + 59_000)[0] == []  # within idle_after_s: still open
    assert d.tracks["slow|1"].open
    out = d.poll(last_alive + 61_000)[0]
    assert [(a["status"], a["resolved_reason"]) for a in out] == [("RESOLVED", RESOLVED_JOB_DIED)]
    assert d.poll(last_alive + 10**7)[0] == []


def test_empty_windows_of_silent_ranks_do_not_count_as_life():
    d = JobDiagnoser("j", DPOL)
    open_incident(d)
    out = feed(d, 1, T0, rw(0, 1), rw(1, 1))
    last_alive = T0 + 32_000
    for wid in range(2, 30):  # the summarizers keep closing empty windows of the silent ranks
        now = T0 + (wid - 1) * 5000
        got = feed(d, wid, now, rw(0, wid, steps=0, batches=0), rw(1, wid, steps=0, batches=0))
        assert not got or now + 32_000 - last_alive > 60_000  # not before the idle limit
        out += got
    assert [a["resolved_reason"] for a in out] == [RESOLVED_JOB_DIED]


def test_a_hang_in_progress_never_ends_the_job():
    """Hung ranks make no steps but keep heartbeating: their windows bring batches."""
    d = JobDiagnoser("j", DPOL)
    open_incident(d)
    for wid in range(1, 40):  # 195 s, three times the idle limit, without a step
        out = feed(d, wid, T0 + wid * 5000, rw(0, wid, steps=0, batches=1), rw(1, wid, steps=0, batches=1))
        assert all(a.get("resolved_reason") not in (RESOLVED_JOB_DIED, RESOLVED_JOB_FINISHED) for a in out)
    assert d.tracks["slow|1"].open and d.end_reason == ""


def test_a_job_end_without_open_incidents_sends_nothing():
    d = JobDiagnoser("j", DPOL)
    assert feed(d, 1, T0, rw(0, 1, ended=True), rw(1, 1, ended=True)) == []
    assert d.end_reason == RESOLVED_JOB_FINISHED


def test_a_final_batch_after_every_window_closed_still_marks_the_end():
    """The rank idled (its windows closed on the clock), then exited: an empty final batch."""
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(iters=[(0, 1.0, 40)], wall_at_s=1.5))
    before = rank_windows(s.poll(now_wall_ms=WALL0 // MS + 30_000))  # quiet: closed by the clock
    assert before and not any(rw["ended_cleanly"] for rw in before)
    s.add_events({**batch(seq=2, wall_at_s=31.0), "final": True})
    after = rank_windows(s.poll(now_wall_ms=WALL0 // MS + 31_000))
    assert after and after[-1]["ended_cleanly"] and after[-1]["steps"] == 0
    assert [rw["window_id"] for rw in after] == [before[-1]["window_id"] + 1] and s.final_closed == 1


def test_the_last_partial_windows_open_no_incident_but_keep_an_open_one():
    from perftracker_ml.schemas.causes import Cause
    from perftracker_ml.schemas.vocabulary import Kind
    from perftracker_ml.streams.detect.findings import Finding

    def finding(identity):
        return Finding(kind=Kind.STRAGGLER, cause=Cause.SLOW_FUNCTION, identity=identity, ranks=(0,), hosts=("h",),
                       gpus=(-1,), function="f", score=5.0, impact_ms=5.0, summary="s", evidence={})

    d = JobDiagnoser("j", DPOL)
    open_incident(d)
    d.tracks["new"] = Track(streak=1)  # one window more would open it
    end = {0: rw(0, 7, steps=1, ended=True), 1: rw(1, 7, steps=1, ended=True)}
    kept = d._open_only([finding("new"), finding("slow|1")])
    assert [f.identity for f in kept] == ["slow|1"]
    out = d._evaluate(ReadyWindow(7, end, [], Counter()), T0)[0]
    assert all(a["incident_id"] != "new" and a["status"] != "OPEN" for a in out)
