"""The collective wrappers, on stub functions with torch.distributed's signatures."""

from perftracker_ml.collectors.comm import OP_SPECS, CommTimer, nbytes_of
from perftracker_ml.collectors.events import COMM
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget


class FakeTensor:
    def __init__(self, nbytes):
        self.nbytes = nbytes


class FakeDist:
    class distributed_c10d:  # noqa: N801
        @staticmethod
        def _get_default_group():
            return "world"

    def __init__(self, rank):
        self.rank = rank

    def get_rank(self):
        return self.rank

    def get_process_group_ranks(self, group):
        return [0, 1]

    def get_global_rank(self, group, group_rank):
        return group_rank


class FakeFuture:
    def __init__(self):
        self.callbacks = []

    def add_done_callback(self, cb):
        self.callbacks.append(cb)


class FakeWork:
    def __init__(self):
        self.future = FakeFuture()

    def get_future(self):
        return self.future


def all_reduce(tensor, op=None, group=None, async_op=False):
    return FakeWork() if async_op else None


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    return None


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    return 0


def spec(name):
    return next(s for s in OP_SPECS if s.name == name)


def timer(rank=0):
    rec = Recorder(100, IterationDetector(), ErrorBudget())
    return CommTimer(FakeDist(rank), rec, None), rec


def test_sync_collective_records_op_seq_bytes_and_duration():
    t, rec = timer()
    wrapped = t.wrap(spec("all_reduce"), all_reduce)
    wrapped(FakeTensor(4096))
    wrapped(FakeTensor(16), group=None)
    events = rec.drain(10)
    assert [(e[0], e[1], e[3], e[4]) for e in events] == [(COMM, "all_reduce", 0, 4096),
                                                          (COMM, "all_reduce", 1, 16)]
    assert events[0][2].ranks == (0, 1) and events[0][7] >= 0


def test_keyword_and_positional_styles_share_one_sequence():
    t, rec = timer()
    wrapped = t.wrap(spec("all_reduce"), all_reduce)
    wrapped(tensor=FakeTensor(32), op="sum")
    wrapped(FakeTensor(64), "sum", None, False)
    work = wrapped(FakeTensor(8), "sum", None, True)  # async, positional
    work.future.callbacks[0](work.future)
    events = rec.drain(10)
    assert [(e[3], e[4]) for e in events] == [(0, 32), (1, 64), (2, 8)]


def test_async_collective_is_recorded_when_its_future_completes():
    t, rec = timer()
    wrapped = t.wrap(spec("all_reduce"), all_reduce)
    work = wrapped(FakeTensor(8), async_op=True)
    assert rec.drain(10) == []
    work.future.callbacks[0](work.future)
    (event,) = rec.drain(10)
    assert event[1] == "all_reduce" and event[3] == 0


def test_send_and_recv_get_matching_pair_sequences():
    sender, srec = timer(rank=0)
    receiver, rrec = timer(rank=1)
    do_send = sender.wrap(spec("send"), send)
    do_recv = receiver.wrap(spec("recv"), recv)
    for _ in range(2):
        do_send(FakeTensor(4), 1)
        do_recv(FakeTensor(4), src=0)
    sends, recvs = srec.drain(10), rrec.drain(10)
    assert [e[3] for e in sends] == [e[3] for e in recvs] == [0, 1]
    assert sends[0][2] == recvs[0][2]


def test_user_exception_passes_through_and_nothing_is_recorded():
    t, rec = timer()

    def failing(tensor, op=None, group=None, async_op=False):
        raise RuntimeError("connection reset")

    wrapped = t.wrap(spec("all_reduce"), failing)
    try:
        wrapped(FakeTensor(1))
    except RuntimeError as exc:
        assert "connection reset" in str(exc)
    else:
        raise AssertionError("the user's exception was swallowed")
    assert rec.drain(10) == [] and rec.errors.count == 0


def test_nbytes_of_lists():
    assert nbytes_of([FakeTensor(3), [FakeTensor(4)]]) == 7 and nbytes_of(None) == 0


def test_groups_keep_their_own_sequences_and_a_full_buffer_counts_drops():
    t, rec = timer()
    rec.capacity = 3
    rec.events = type(rec.events)(maxlen=3)
    wrapped = t.wrap(spec("all_reduce"), all_reduce)
    for _ in range(3):
        wrapped(FakeTensor(1))                  # default group
    wrapped(FakeTensor(2), group="tp")          # another group, keyword
    wrapped(FakeTensor(2), None, "tp")          # the same group, positional
    events = rec.drain(10)
    assert rec.dropped == 2
    assert [(e[3], e[4]) for e in events] == [(2, 1), (0, 2), (1, 2)]  # seq, bytes


def test_calls_not_completed_are_reported_as_entered_with_group_and_seq():
    """A sync call blocked in the collective and an issued async one are entry markers
    (dur_ns -1) until they complete; the markers carry op, group and seq."""
    t, rec = timer()
    seen = []

    def blocking(tensor, op=None, group=None, async_op=False):
        seen.extend(rec.in_flight_markers(10**19, 0))  # what the sender would add meanwhile
        return None

    barrier_like = t.wrap(spec("all_reduce"), blocking)
    barrier_like(FakeTensor(8))
    assert [(m[0], m[1], m[3], m[4], m[7]) for m in seen] == [(COMM, "all_reduce", 0, 8, -1)]
    assert rec.in_flight_markers(10**19, 0) == []
    work = t.wrap(spec("all_reduce"), all_reduce)(FakeTensor(16), async_op=True)
    (marker,) = rec.in_flight_markers(10**19, 0)
    assert (marker[1], marker[3], marker[7]) == ("all_reduce", 1, -1)
    assert rec.in_flight_markers(marker[6], 1) == []  # younger than the minimum age: none
    work.future.callbacks[0](work.future)
    assert rec.in_flight_markers(10**19, 0) == []
    assert [(e[3], e[7] >= 0) for e in rec.drain(10)] == [(0, True), (1, True)]


def test_general_path_sync_calls_are_entered_while_blocked():
    t, rec = timer(rank=0)
    seen = []

    def slow_send(tensor, dst=None, group=None, tag=0, group_dst=None):
        seen.extend(rec.in_flight_markers(10**19, 0))

    t.wrap(spec("send"), slow_send)(FakeTensor(4), 1)
    assert [(m[1], m[3], m[7]) for m in seen] == [("send", 0, -1)]
    assert rec.in_flight_markers(10**19, 0) == [] and rec.drain(10)[0][7] >= 0
