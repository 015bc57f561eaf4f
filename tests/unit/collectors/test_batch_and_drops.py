from perftracker_ml.collectors.batch import BatchBuilder, event_count
from perftracker_ml.collectors.counters import CollectorCounters
from perftracker_ml.collectors.events import GroupRef, OpSummary
from perftracker_ml.collectors.identity import RankIdentity
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.collectors.transport import NullSink, Sender
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.columns import as_lists
from perftracker_ml.schemas.settings import CollectorSettings
from perftracker_ml.schemas.vocabulary import EVENT_BATCH, OpKind, SpanKind

IDENT = RankIdentity("j", 2, 2, 4, "h", -1, "", 123)
WORLD = GroupRef("pg0-4-x", (0, 1, 2, 3))


def recorder(capacity=100):
    return Recorder(capacity, IterationDetector(), ErrorBudget())


def test_equally_spaced_members_travel_as_a_range_and_read_back_whole():
    """EventBatch v9: a group of equally spaced members (a DP group of a big job: thousands) is
    sent as (first, step, count) with ``ranks`` empty, others listed; the entry is built once."""
    from perftracker_ml.schemas.records import group_members

    rec = recorder()
    dp = GroupRef("pgdp-4-y", (1, 9, 17, 25))
    odd = GroupRef("pgodd-3-z", (0, 1, 5))
    for seq, g in enumerate((dp, odd, dp)):
        rec.comm("all_reduce", g, seq, 64, 0, 10 * seq, 5)
    builder = BatchBuilder(IDENT, compact_groups=True)
    record = builder.build(rec.drain(100), dropped=0)
    decoded = Codec(EVENT_BATCH).decode(Codec(EVENT_BATCH).encode(record))
    by_id = {g["group_id"]: g for g in decoded["groups"]}
    assert by_id["pgdp-4-y"] == {"group_id": "pgdp-4-y", "ranks": [], "ranks_first": 1, "ranks_step": 8,
                                 "ranks_count": 4}
    assert by_id["pgodd-3-z"]["ranks"] == [0, 1, 5] and by_id["pgodd-3-z"]["ranks_count"] == 0
    assert [group_members(g) for g in decoded["groups"]] == [[1, 9, 17, 25], [0, 1, 5]]
    rec.comm("all_reduce", dp, 3, 64, 0, 40, 5)
    again = builder.build(rec.drain(100), dropped=0)
    assert again["groups"][0] is record["groups"][0]  # one entry per group, shared by its batches


def test_batch_is_columnar_dictionary_encoded_and_decodes():
    rec = recorder()
    rec.span(SpanKind.FORWARD, "M.forward", 10, 5)
    rec.span(SpanKind.FORWARD, "M.forward", 20, 6)
    rec.comm("all_reduce", WORLD, 0, 4096, 3, 30, 7)
    rec.mark_step(0)
    rec.mark_step(100)
    kernels = [OpSummary(OpKind.CPU_OP, "aten::mm", "p1", 3, 30, 10, 12, 12)]
    record = BatchBuilder(IDENT).build(rec.drain(100), dropped=5, kernels=kernels)
    decoded = as_lists(Codec(EVENT_BATCH).decode(Codec(EVENT_BATCH).encode(record)))  # v8: arrays
    assert decoded["names"] == ["M.forward", "all_reduce", "aten::mm"]
    assert decoded["spans"]["name"] == [0, 0] and decoded["spans"]["path"] == [-1, -1]
    assert decoded["comms"] == {"op": [1], "group": [0], "seq": [0], "bytes": [4096], "step": [3],
                                "start_ns": [30], "dur_ns": [7]}
    assert decoded["groups"] == [{"group_id": "pg0-4-x", "ranks": [0, 1, 2, 3], "ranks_first": 0, "ranks_step": 0,
                                  "ranks_count": 0}]
    assert decoded["iterations"] == {"step": [0], "start_ns": [0], "dur_ns": [100]}
    assert decoded["kernels"][0]["name"] == 2
    assert decoded["dropped_events"] == 5 and decoded["rank"] == 2
    assert event_count(record) == 4


def test_batch_sequence_numbers_count_up():
    builder = BatchBuilder(IDENT)
    assert [builder.build([], 0)["seq"] for _ in range(3)] == [0, 1, 2]


def test_full_buffer_drops_oldest_and_counts():
    rec = recorder(capacity=3)
    for i in range(5):
        rec.span(SpanKind.USER, "x", i, 1)
    assert rec.dropped == 2
    assert [ev[4] for ev in rec.drain(10)] == [2, 3, 4]


def test_lost_batches_are_counted_and_the_count_travels_in_the_next_header():
    rec = recorder()
    counters = CollectorCounters()
    sent = []

    class FlakySink(NullSink):
        def send(self, key, payload, n_events):
            sent.append(Codec(EVENT_BATCH).decode(payload))
            if len(sent) == 1:
                super().send(key, payload, n_events)  # the first batch is lost

    sender = Sender(rec, BatchBuilder(IDENT), Codec(EVENT_BATCH).encode, FlakySink(counters, rec.lost),
                    CollectorSettings(), b"j|2")
    for i in range(4):
        rec.span(SpanKind.USER, "x", i, 1)
    sender.flush_once()
    rec.span(SpanKind.USER, "x", 9, 1)
    sender.flush_once()
    assert sent[0]["dropped_events"] == 0 and sent[1]["dropped_events"] == 4
    assert counters.batches_failed == 1


def test_sender_survives_an_exception():
    rec = recorder()
    rec.span(SpanKind.USER, "x", 0, 1)

    def broken(_record):
        raise ValueError("boom")

    sender = Sender(rec, BatchBuilder(IDENT), broken, NullSink(CollectorCounters(), lambda n: None),
                    CollectorSettings(), b"k")
    sender.flush_once()
    assert rec.errors.count == 1


def test_wire_bytes_follow_each_broker_connection_through_resets_and_disconnects():
    from perftracker_ml.collectors.transport import WireBytes

    wire = WireBytes()
    assert wire.add({"b/bootstrap": {"txbytes": 100}}) == 100
    assert wire.add({"b/bootstrap": {"txbytes": 150}, "b/1": {"txbytes": 1000}}) == 1150
    assert wire.add({"b/bootstrap": {"txbytes": 0}}) == 1150  # broker gone: what was sent stays
    assert wire.add({"b/1": {"txbytes": 300}}) == 1450  # reconnected: its counter started again
    assert wire.add({"b/1": {"txbytes": 350}, "b/bootstrap": {"state": "INIT"}}) == 1500


def test_every_loss_is_counted_by_the_recorder_with_its_reason():
    from perftracker_ml.collectors.counters import DropReason

    rec = recorder(capacity=1)
    rec.span(SpanKind.USER, "x", 0, 1)
    rec.span(SpanKind.USER, "x", 1, 1)  # the buffer is full: the first one falls out
    rec.lost(3)
    rec.lost(1, DropReason.CUDA_QUEUE_FULL)
    assert rec.dropped == 5
    assert rec.counters.series(CollectorCounters.events_dropped) == {
        ("buffer_full",): 1, ("undelivered",): 3, ("cuda_queue_full",): 1}


class _Keep(NullSink):
    """Delivers every batch (decoded, kept) instead of losing it."""

    def __init__(self) -> None:
        super().__init__(CollectorCounters(), lambda n: None)
        self.sent: list[dict] = []

    def send(self, key, payload, n_events):
        self.sent.append(Codec(EVENT_BATCH).decode(payload))


def test_only_the_last_batch_of_the_exit_flush_is_final():
    from dataclasses import replace

    rec = recorder(capacity=1000)
    sink = _Keep()
    sender = Sender(rec, BatchBuilder(IDENT), Codec(EVENT_BATCH).encode, sink,
                    replace(CollectorSettings(), max_batch_events=4), b"j|2")
    for i in range(3):
        rec.span(SpanKind.USER, "x", i, 1)
    sender.flush_once()  # a periodic flush is never final
    for i in range(8):  # two full batches left at exit: the buffer is drained in three sends
        rec.span(SpanKind.USER, "x", 10 + i, 1)
    sender.close(timeout_s=1.0)
    assert [b["final"] for b in sink.sent] == [False, False, False, True]
    assert [len(b["spans"]["kind"]) for b in sink.sent] == [3, 4, 4, 0]  # an empty final batch ends it
    assert sum(len(b["spans"]["kind"]) for b in sink.sent) == 11


def test_exit_flush_with_nothing_left_still_sends_a_final_batch():
    rec = recorder()
    sink = _Keep()
    sender = Sender(rec, BatchBuilder(IDENT), Codec(EVENT_BATCH).encode, sink, CollectorSettings(), b"j|2")
    rec.span(SpanKind.USER, "x", 0, 1)
    sender.close(timeout_s=1.0)
    assert [(b["final"], len(b["spans"]["kind"])) for b in sink.sent] == [(True, 1)]



def test_exit_does_not_wait_for_a_task_the_sender_thread_is_inside():
    """A periodic task can run for a minute (summarizing a profiling window's trace took 30 s+
    on a loaded host in the live fault suite and held the ranks' exit up until the launcher
    interrupted them): close sends the last batch without waiting for it, and the sender's
    cycle, once its task returns, sends nothing after that batch."""
    import threading

    rec = recorder()
    sink = _Keep()
    sender = Sender(rec, BatchBuilder(IDENT), Codec(EVENT_BATCH).encode, sink, CollectorSettings(), b"j|2")
    exiting = threading.current_thread()
    inside, release = threading.Event(), threading.Event()

    def long_task():
        if threading.current_thread() is not exiting:
            inside.set()
            release.wait(60)

    sender.add_task(long_task)
    rec.span(SpanKind.USER, "x", 0, 1)
    cycle = threading.Thread(target=sender.flush_once)  # the sender thread's periodic cycle
    cycle.start()
    assert inside.wait(10)
    closing = threading.Thread(target=sender.close, args=(1.0,))
    closing.start()
    closing.join(30)  # a guard against a hang, not a timing bound
    try:
        assert not closing.is_alive(), "close waited for the sender thread's task"
        assert [(b["final"], len(b["spans"]["kind"])) for b in sink.sent] == [(True, 1)]
        assert rec.counters.exit_tasks_skipped == 1
    finally:
        release.set()
        cycle.join(10)
    assert len(sink.sent) == 1  # the cycle's send, after its task, found the final batch sent


def test_a_suspected_hang_sends_the_flight_recorders_pending_entries_with_the_entry_markers():
    import json
    import time

    from perftracker_ml.collectors.events import GroupRef
    from perftracker_ml.collectors.flight_recorder import FlightRecorder
    from perftracker_ml.collectors.safety import ErrorBudget

    dump = json.dumps({"entries": [{"collective_seq_id": 3, "process_group": ["0", "default_pg"],
                                    "profiling_name": "gloo:all_reduce", "state": "scheduled", "retired": False,
                                    "time_created_ns": time.time_ns() - 12 * 10**9, "timeout_ms": 1800000}],
                       "pg_status": {"0": {"last_completed_collective": "2", "last_enqueued_collective": "3"}}})
    rec = recorder()
    sink = _Keep()
    sender = Sender(rec, BatchBuilder(IDENT), Codec(EVENT_BATCH).encode, sink, CollectorSettings(), b"j|2")
    sender.flight = FlightRecorder(lambda: dump, ErrorBudget(), after_s=10.0)
    group = GroupRef("pg0-4-x", (0, 1, 2, 3))
    rec.blocking = ("all_reduce", group, 2, 16, 5, time.perf_counter_ns() - 12 * 10**9)  # 12 s inside
    sender.flush_once()
    rec.blocking = None
    sender.flush_once()
    (marked, *rest) = sink.sent
    assert marked["comms"]["dur_ns"] == [-1] and marked["flight_records"][0]["seq"] == 3
    assert marked["flight_records"][0]["op"] == "gloo:all_reduce" and marked["flight_records"][0]["age_ms"] >= 12000
    assert all(b["flight_records"] == [] for b in rest)
