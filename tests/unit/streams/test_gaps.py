"""Worker metrics: per-job gaps and drops with bounded labels, latencies, consumer lag."""

from __future__ import annotations

from typing import NamedTuple

from perftracker_ml.streams.context import StreamContext, StreamCounters, now_ms
from perftracker_ml.streams.detect import RankSummarizer
from perftracker_ml.streams.gaps import GapMetrics, SummarizerGaps, event_count
from perftracker_ml.streams.metrics import consumer_lag

# batch_in(job, rank, lost batches so far, dropped events total, batch)
BATCH = {"spans": {"kind": [0, 1, 2]}, "comms": {"op": [0]}, "iterations": {"step": [1, 2]}}


def test_gaps_and_drops_add_up_per_job_and_the_worst_rank_is_one_series():
    c = StreamCounters()
    h = GapMetrics(c)
    h.batch_in("j", 0, 0, 0, BATCH)
    h.batch_in("j", 0, 2, 10, BATCH)
    h.batch_in("j", 1, 1, 5, BATCH)
    h.batch_in("j", 1, 5, 5, BATCH)  # rank 1 becomes the worst
    h.batch_in("k", 0, 1, 0, BATCH)
    assert c.value(StreamCounters.events_in) == 5 * 6
    assert c.series(StreamCounters.batches_lost) == {("j",): 7, ("k",): 1}
    assert c.series(StreamCounters.events_dropped) == {("j",): 15}
    assert c.series(StreamCounters.worst_rank_batches_lost) == {("j", "1"): 5, ("k", "0"): 1}
    h.batch_in("j", 0, 2, 3, BATCH)  # collector restarted: counts anew from 3
    assert c.value(StreamCounters.events_dropped, "j") == 18


def test_a_jobs_series_go_with_its_last_rank():
    c = StreamCounters()
    h = GapMetrics(c)
    h.batch_in("j", 0, 1, 1, BATCH)
    h.batch_in("j", 1, 0, 0, BATCH)
    h.forget("j", 0)
    assert c.series(StreamCounters.batches_lost) == {("j",): 1}
    h.forget("j", 1)
    h.forget("j", 1)
    for counter in (StreamCounters.batches_lost, StreamCounters.events_dropped,
                    StreamCounters.worst_rank_batches_lost):
        assert c.series(counter) == {}


def test_the_summarize_stage_observer_feeds_event_batches_only_and_forgets_dropped_ranks():
    c = StreamCounters()
    gaps, s = SummarizerGaps(c), RankSummarizer("j", 3)
    s.health.lost_batches = 2
    gaps.fed(s, "EventBatch", BATCH)
    gaps.fed(s, "HardwareBatch", BATCH)
    assert c.value(StreamCounters.events_in) == 6 and c.series(StreamCounters.batches_lost) == {("j",): 2}
    gaps.dropped(s)
    assert c.series(StreamCounters.batches_lost) == {}


def test_event_count_of_a_bad_batch_is_zero():
    assert event_count(BATCH) == 6 and event_count({"spans": None}) == 0


def test_window_close_delay_and_detection_latency():
    ctx = StreamContext(names=None, policy=None)  # type: ignore[arg-type]
    now = now_ms()
    ctx.window_closed({"window_start_ms": now - 7000, "window_s": 5.0})
    ctx.anomaly_sent({"status": "OPEN", "last_seen_ms": now - 3000})
    ctx.anomaly_sent({"status": "RESOLVED", "last_seen_ms": now - 600_000})
    series = {s.suffix: s.value for s in ctx.counters.samples()
              if s.name == "window_close_delay_seconds" and dict(s.labels).get("le") in (None, "1.0", "5.0")}
    assert series["_count"] == 1 and 2.0 <= series["_sum"] < 4.0  # seconds, observed in ms
    latency = ctx.counters.series(StreamCounters.detection_latency_seconds)
    assert latency == {("OPEN",): 1}  # a resolution is not a detection


class TP(NamedTuple):
    topic: str
    partition: int


class FakeFaustConsumer:
    def __init__(self) -> None:
        self._read_offset = {TP("pt.events", 0): 9, TP("pt.events", 1): 4, TP("pt.events", 2): None}
        self.high = {TP("pt.events", 0): 15, TP("pt.events", 1): 3, TP("pt.events", 2): 7,
                     TP("pt.events", 3): None}

    def assignment(self) -> set[TP]:
        return set(self.high)

    def highwater(self, tp: TP) -> int | None:
        return self.high[tp]


def test_worker_lag_from_the_fetched_high_watermark_clamped_at_zero():
    lag = consumer_lag(FakeFaustConsumer())
    assert lag == {("pt.events", "0"): 5, ("pt.events", "1"): 0}  # unread and unfetched: no series
    assert consumer_lag(None) == {}


def test_final_batches_and_the_windows_they_close_are_counted():
    from .detect.test_summarize import POL, batch

    c = StreamCounters()
    obs, s = SummarizerGaps(c), RankSummarizer("job", 0, POL)
    for b in (batch(iters=[(0, 1.0, 40)]), {**batch(seq=2, iters=[(1, 6.0, 40)], wall_at_s=6.5), "final": True}):
        s.add_events(b)
        obs.fed(s, "EventBatch", b)
    assert c.value(StreamCounters.ranks_ended) == 1 and c.value(StreamCounters.windows_closed_at_end) == 2
    assert s.final_closed == 2 and len([n for n, _ in s.poll(0) if n == "RankWindow"]) == 2
