"""Fewer, larger messages: a send cycle with fewer than ``batch_min_events`` events keeps them
for a later one, at most ``batch_max_delay_s`` after the last send; entry markers, profile
summaries and the exit flush never wait."""

import time

from perftracker_ml.collectors.batch import BatchBuilder, event_count
from perftracker_ml.collectors.events import OpSummary
from perftracker_ml.collectors.identity import RankIdentity
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.collectors.transport import NullSink, Sender
from perftracker_ml.schemas.settings import CollectorSettings
from perftracker_ml.schemas.vocabulary import OpKind, SpanKind

IDENT = RankIdentity("j", 1, 1, 2, "h", -1, "", 7)


class Kept(NullSink):
    def __init__(self, counters):
        super().__init__(counters, lambda n: None)
        self.batches: list[int] = []  # events per message

    def send(self, key, payload, n_events):
        self.batches.append(n_events)


def _sender(**settings):
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    sink = Kept(rec.counters)
    sender = Sender(rec, BatchBuilder(IDENT), lambda record: b"x" * event_count(record), sink,
                    CollectorSettings(flush_interval_s=1.0, **settings), b"k")
    return rec, sink, sender


def _spans(rec, n):
    for i in range(n):
        rec.span(SpanKind.USER, "f", i, 1)


def test_small_cycles_are_held_until_the_size_or_the_delay_is_reached():
    rec, sink, sender = _sender(batch_min_events=5, batch_max_delay_s=3.0)
    _spans(rec, 2)
    sender.flush_once()  # nothing sent yet: the first batch goes at once
    assert sink.batches == [2]
    _spans(rec, 2)
    sender.flush_once()  # 2 < 5 and just sent: kept
    assert sink.batches == [2] and rec.counters.cycles_held == 1
    _spans(rec, 3)
    sender.flush_once()  # 5 buffered: one larger message
    assert sink.batches == [2, 5]
    _spans(rec, 1)
    sender.flush_once()
    assert sink.batches == [2, 5]
    sender._last_send = time.monotonic() - 2.6  # the delay reached at this cycle
    sender.flush_once()
    assert sink.batches == [2, 5, 1] and rec.counters.cycles_held == 2


def test_profile_summaries_and_the_exit_flush_never_wait():
    rec, sink, sender = _sender(batch_min_events=100, batch_max_delay_s=5.0)
    sender.flush_once()  # the first (empty) heartbeat
    _spans(rec, 1)
    sender.add_kernels([OpSummary(OpKind.CUDA_KERNEL, "k", "p", 1, 1, 1, 1, 1)])
    sender.flush_once()
    assert sink.batches[-1] == 1
    _spans(rec, 2)
    sender.flush_once()
    assert sink.batches[-1] == 1  # held
    sender.close(0.5)
    assert sink.batches[-1] == 2


def test_a_collective_still_entered_goes_out_at_once():
    """An entry marker (the evidence of a hang) is never held for a larger message."""
    from perftracker_ml.collectors.events import GroupRef

    rec, sink, sender = _sender(batch_min_events=100, batch_max_delay_s=5.0)
    sender.flush_once()
    _spans(rec, 1)
    sender.flush_once()
    assert sink.batches == [0]  # held
    rec.blocking = ("all_reduce", GroupRef("pg0-2-x", (0, 1)), 3, 8, 0, time.perf_counter_ns() - 2_000_000_000)
    sender.flush_once()
    assert sink.batches == [0, 2]  # the held span and the marker


def test_the_default_sends_every_cycle():
    rec, sink, sender = _sender()
    for n in (1, 2, 3):
        _spans(rec, n)
        sender.flush_once()
    assert sink.batches == [1, 2, 3] and rec.counters.cycles_held == 0


def test_the_largest_default_message_fits_kafkas_one_megabyte():
    """EventBatch v8's columns are fixed-width (a collective 48 bytes): a full message of the
    widest events stays well under librdkafka's and the broker's 1,000,000-byte default."""
    from perftracker_ml.collectors.events import COMM, GroupRef
    from perftracker_ml.schemas import Codec

    limit = CollectorSettings().max_batch_events
    group = GroupRef("pg0-2-0123abcd", (0, 1))
    events = [(COMM, "all_gather_into_tensor", group, 10**9 + i, 1 << 40, 10**6 + i, 10**15 + i, 10**9)
              for i in range(limit)]
    assert len(Codec("EventBatch").encode(BatchBuilder(IDENT).build(events, 0))) < 600_000


def test_with_window_batching_only_the_cycle_that_closes_a_window_sends():
    """``batch_window_s``: cycles at 0.7 s past each second (the flush phase) send only once a
    window's end plus the 0.5 s close lag has passed since the last send: one batch per window,
    sent at the cycle that would have closed it anyway."""
    rec, sink, sender = _sender(batch_window_s=5.0)
    clock = [1_000_000.7]  # a cycle 0.7 s past a window's start (1,000,000 is a multiple of 5)
    sender.wall = lambda: clock[0]
    sent_at = []
    for second in range(12):
        clock[0] = 1_000_000.7 + second
        _spans(rec, 1)
        before = len(sink.batches)
        sender.flush_once()
        if len(sink.batches) > before:
            sent_at.append(second)
    assert sent_at == [0, 5, 10]  # 1,000,005.7 and 1,000,010.7: the first cycles past 5.5 and 10.5
    assert sink.batches == [1, 5, 5] and rec.counters.cycles_held == 9


def test_window_batching_never_holds_longer_than_a_window_nor_an_entered_collective():
    from perftracker_ml.collectors.events import GroupRef

    rec, sink, sender = _sender(batch_window_s=5.0)
    clock = [2_000_001.7]
    sender.wall = lambda: clock[0]
    _spans(rec, 1)
    sender.flush_once()
    _spans(rec, 1)
    clock[0] += 1
    sender.flush_once()
    assert sink.batches == [1]  # held: the same window slot
    rec.blocking = ("all_reduce", GroupRef("pg0-2-x", (0, 1)), 3, 8, 0, time.perf_counter_ns() - 2_000_000_000)
    sender.flush_once()
    assert sink.batches == [1, 2]  # the entry marker goes at once, with the held span
    rec.blocking = None
    _spans(rec, 1)
    sender._last_send = time.monotonic() - 5.0  # a stalled clock: no more than a window held
    sender.flush_once()
    assert sink.batches == [1, 2, 1]
