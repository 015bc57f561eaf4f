"""The Faust wiring of a stage, driven with a stand-in app: keys, topics and counters."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from perftracker_ml.schemas import MultiCodec, bundle
from perftracker_ml.schemas.topics import TopicNames
from perftracker_ml.schemas.vocabulary import FUNCTION_COMPARISON, FUNCTION_PATTERN, RANK_WINDOW
from perftracker_ml.streams.agents import stage as wiring
from perftracker_ml.streams.context import StreamContext
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.topology import COMPARE, Stage, TopicRole

from ..detect.synth import T0_WINDOW, W_MS, pattern, rank_window

POLICY = DetectionPolicy(window_s=5.0)


class FakeTopic:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    async def send(self, key: bytes, value: bytes, headers: list | None = None) -> None:
        self.sent.append((key, value))


class FakeApp:
    """Collects what ``register`` declares: agents by name and timers."""

    def __init__(self) -> None:
        self.agents: dict[str, object] = {}
        self.timers: list[tuple[float, str, object]] = []

    def agent(self, topic: FakeTopic, name: str):
        return lambda fn: self.agents.setdefault(name, fn)

    def timer(self, interval: float, name: str):
        return lambda fn: self.timers.append((interval, name, fn)) or fn


class FakeMessage:
    def __init__(self, partition: int) -> None:
        self.partition = partition


class FakeEvent:
    def __init__(self, value: bytes, partition: int = 0) -> None:
        self.value, self.message = value, FakeMessage(partition)


class FakeStream:
    """What the agent uses of a Faust stream: ``take_events`` (here: chunks of ``chunk`` events)."""

    def __init__(self, messages: tuple[bytes, ...], chunk: int) -> None:
        self.messages, self.chunk = messages, chunk
        self.processors: list = []

    def add_processor(self, fn) -> None:
        self.processors.append(fn)

    async def take_events(self, max_: int, within: float):
        """Chunks of ``chunk`` events; each message goes through the processors as it is taken."""
        step = min(self.chunk, max_)
        for i in range(0, len(self.messages), step):
            chunk = self.messages[i:i + step]
            for m in chunk:
                for fn in self.processors:
                    fn(m)
            yield [FakeEvent(m) for m in chunk]


def stream_of(*messages: bytes, chunk: int = 2) -> FakeStream:
    return FakeStream(messages, chunk)


@pytest.fixture
def ctx() -> StreamContext:
    c = StreamContext(names=TopicNames.for_prefix("pt"), policy=POLICY)
    c.topics = {role: FakeTopic() for role in (TopicRole.INPUTS, TopicRole.PATTERNS, TopicRole.FINDINGS,
                                               TopicRole.ANOMALIES, TopicRole.CONTROL, "deadletter")}
    return c


def test_compare_agent_feeds_by_key_and_its_timer_sends_comparisons_keyed_by_job(ctx, monkeypatch):
    app = FakeApp()
    wiring.register(app, ctx, COMPARE)
    assert list(app.agents) == ["perftracker.compare"]
    ((interval, name, tick),) = app.timers
    assert (interval, name) == (0.5, "perftracker.compare.tick")
    clock = [T0_WINDOW * W_MS]
    monkeypatch.setattr(wiring, "now_ms", lambda: clock[0])
    msgs = [ctx.encode(FUNCTION_PATTERN, pattern(r, "Model.forward", 10.0)) for r in range(4)]
    asyncio.run(app.agents["perftracker.compare"](stream_of(*msgs, b"not avro")))
    counted = ctx.counters.snapshot()
    assert counted["records_in.FunctionPattern"] == 4 and counted["dead_lettered.patterns"] == 1
    clock[0] += POLICY.grace_ms + 1
    asyncio.run(tick())
    ((key, value),) = ctx.topics[TopicRole.FINDINGS].sent
    name, record = MultiCodec([FUNCTION_COMPARISON]).decode(value)
    assert key == b"job" and name == FUNCTION_COMPARISON and record["ranks_seen"] == 4
    assert ctx.counters.snapshot()["records_out.FunctionComparison"] == 1


class Boom:
    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()

    def idle(self, now_wall_ms: int) -> bool:
        return True


def _raise(*args):
    raise RuntimeError("boom")


def test_errors_are_counted_per_stage_and_idle_cores_dropped_after_a_tick(ctx):
    app = FakeApp()
    probe = Stage(name="probe", topic=TopicRole.PATTERNS, create=lambda rec, policy: Boom(), feed=_raise,
                  poll=_raise)
    wiring.register(app, ctx, probe)
    msg = ctx.encode(FUNCTION_PATTERN, pattern(0, "f", 1.0))
    asyncio.run(app.agents["perftracker.probe"](stream_of(msg)))
    counted = ctx.counters.snapshot()
    assert counted["errors.probe"] == 1 and "records_in.FunctionPattern" not in counted
    ((_, _, tick),) = app.timers
    asyncio.run(tick())
    asyncio.run(tick())  # the idle core was dropped by the first tick: no second error
    assert ctx.counters.snapshot()["errors.probe.tick"] == 1


class Watch:
    """An observer that records what it is shown."""

    def __init__(self) -> None:
        self.fed_records: list[tuple[object, str, str]] = []
        self.dropped_cores: list[object] = []

    def fed(self, core, name, record) -> None:
        self.fed_records.append((core, name, record["function"]))

    def dropped(self, core) -> None:
        self.dropped_cores.append(core)


def test_the_observer_sees_each_record_fed_and_each_core_dropped(ctx):
    app, watch = FakeApp(), Watch()
    probe = Stage(name="probe", topic=TopicRole.PATTERNS, create=lambda rec, policy: Boom(),
                  feed=lambda core, name, rec, now: None, poll=lambda core, now, flush: [])
    wiring.register(app, ctx, probe, watch)
    msg = ctx.encode(FUNCTION_PATTERN, pattern(0, "f", 1.0))
    asyncio.run(app.agents["perftracker.probe"](stream_of(msg)))
    ((core, name, function),) = watch.fed_records
    assert isinstance(core, Boom) and (name, function) == (FUNCTION_PATTERN, "f")
    ((_, _, tick),) = app.timers
    asyncio.run(tick())
    assert watch.dropped_cores == [core]  # idle: dropped after the tick's poll


class Skips:
    """A core that sets aside every record it is fed (as a late one), idle once ``done``."""

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()
        self.done = False

    def idle(self, now_wall_ms: int) -> bool:
        return self.done


def test_what_cores_set_aside_reaches_the_worker_counters_also_after_they_are_dropped(ctx, monkeypatch):
    app = FakeApp()
    cores: list[Skips] = []

    def create(rec, policy):
        cores.append(Skips())
        return cores[-1]

    def feed(core, name, rec, now):
        core.skipped["late_pattern"] += 1

    probe = Stage(name="probe", topic=TopicRole.PATTERNS, create=create, feed=feed, poll=lambda core, now, flush: [])
    wiring.register(app, ctx, probe)
    msgs = [ctx.encode(FUNCTION_PATTERN, pattern(r, f, 1.0)) for r in range(3) for f in ("f", "g")]
    asyncio.run(app.agents["perftracker.probe"](stream_of(*msgs)))
    ((_, _, tick),) = app.timers
    asyncio.run(tick())
    assert len(cores) == 2 and ctx.counters.snapshot()["records_skipped.probe.late_pattern"] == 6
    cores[0].done = True  # dropped on the next tick: what it set aside is still counted
    asyncio.run(tick())
    cores[1].skipped["window_evicted"] += 2
    monkeypatch.setattr(wiring, "SKIPPED_REFRESH_MS", 0)
    asyncio.run(tick())
    counted = ctx.counters.snapshot()
    assert counted["records_skipped.probe.late_pattern"] == 6 and counted["records_skipped.probe.window_evicted"] == 2


class Consumer:
    """A Faust consumer as ``input_pending`` reads it: assignment, high watermarks, read offsets."""

    def __init__(self, high: dict, read: dict) -> None:
        self._high, self._read_offset = high, read

    def assignment(self):
        return set(self._high)

    def highwater(self, tp):
        return self._high[tp]


class Topic:
    topics = ("t.events",)


def test_input_is_pending_with_lag_or_while_the_group_rebalances():
    from faust.types import TP
    tp = TP("t.events", 0)
    app = type("App", (), {})()
    app.rebalancing = False
    app.consumer = Consumer({tp: 10}, {tp: 9})  # everything read
    assert wiring.input_pending(app, Topic()) is False
    app.consumer = Consumer({tp: 10}, {tp: 4})
    assert wiring.input_pending(app, Topic()) is True
    app.consumer = Consumer({tp: 10}, {tp: 9})
    app.rebalancing = True  # reading paused while partitions move: not the job's input stopping
    assert wiring.input_pending(app, Topic()) is True


def test_a_partition_not_read_from_yet_counts_as_pending_for_a_bounded_time():
    """A backlog: partition 0 read to its end, partition 1 not delivered a message yet (its
    messages are unread, not absent); past UNKNOWN_PENDING_S it no longer holds windows open
    (a partition whose messages all expired is never read from)."""
    from faust.types import TP
    read, unread = TP("t.events", 0), TP("t.events", 1)
    consumer = Consumer({read: 10, unread: 10}, {read: 9})
    consumer._committed_offset = {}
    names = {"t.events"}
    assert wiring._unread_unknown(consumer, names, 100.0) is True
    assert wiring._unread_unknown(consumer, names, 100.0 + wiring.UNKNOWN_PENDING_S + 1) is False
    fresh = Consumer({read: 10, unread: None}, {read: 9})  # its high watermark not known yet
    fresh._committed_offset = {}
    assert wiring._unread_unknown(fresh, names, 5.0) is True
    caught_up = Consumer({read: 10, unread: 10}, {read: 9})
    caught_up._committed_offset = {unread: 10}  # the group read it all before this worker
    assert wiring._unread_unknown(caught_up, names, 5.0) is False
    app = type("App", (), {"rebalancing": False, "consumer": Consumer({read: 10, unread: 10}, {read: 9})})()
    app.consumer._committed_offset = {}
    assert wiring.input_pending(app, Topic()) is True


def test_records_of_one_key_go_out_as_one_bundle_and_the_next_stage_feeds_each(ctx, monkeypatch):
    """Five patterns (three ranks of ``f``, two of ``g``) leave as two bundles keyed job|f and
    job|g; the compare agent reading them feeds all five, as if each had been a message."""
    records = [(FUNCTION_PATTERN, pattern(r, "f", 10.0)) for r in range(3)]
    records += [(FUNCTION_PATTERN, pattern(r, "g", 5.0)) for r in range(2)]
    asyncio.run(wiring.send(ctx, records))
    sent = ctx.topics[TopicRole.PATTERNS].sent
    assert [key for key, _ in sent] == [b"job|f", b"job|g"]
    assert [len(bundle.records_in(value)) for _, value in sent] == [3, 2]
    assert all(bundle.is_bundle(value) for _, value in sent)
    counted = ctx.counters.snapshot()
    assert counted["records_out.FunctionPattern"] == 5 and counted["bundles_out.patterns"] == 2

    app = FakeApp()
    wiring.register(app, ctx, COMPARE)
    clock = [T0_WINDOW * W_MS]
    monkeypatch.setattr(wiring, "now_ms", lambda: clock[0])
    asyncio.run(app.agents["perftracker.compare"](stream_of(*(value for _, value in sent))))
    assert ctx.counters.snapshot()["records_in.FunctionPattern"] == 5
    clock[0] += POLICY.grace_ms + 1
    ((_, _, tick),) = app.timers
    asyncio.run(tick())
    (key, value), = ctx.topics[TopicRole.FINDINGS].sent  # both comparisons keyed by job: one bundle
    seen = sorted((r["function"], r["ranks_seen"]) for r in map(lambda m: MultiCodec([FUNCTION_COMPARISON]).decode(m)[1],
                                                                  bundle.records_in(value)))
    assert key == b"job" and seen == [("f", 3), ("g", 2)]


def test_a_bad_record_in_a_bundle_is_dead_lettered_alone_and_a_corrupt_bundle_whole(ctx):
    app = FakeApp()
    wiring.register(app, ctx, COMPARE)
    good = [ctx.encode(FUNCTION_PATTERN, pattern(r, "f", 10.0)) for r in range(2)]
    mixed = bundle.pack([good[0], b"not avro", good[1]])
    corrupt = mixed[:-7]  # cut short: the array cannot be read
    asyncio.run(app.agents["perftracker.compare"](stream_of(mixed, corrupt, bundle.pack([mixed]))))
    counted = ctx.counters.snapshot()
    # the two good records fed; the bad item, the corrupt bundle and a bundle inside a bundle parked
    assert counted["records_in.FunctionPattern"] == 2 and counted["dead_lettered.patterns"] == 3
    parked = [value for _, value in ctx.topics["deadletter"].sent]
    assert parked[0] == b"not avro" and parked[1] == corrupt


def test_records_of_one_key_are_split_into_bundles_within_the_limits(ctx, monkeypatch):
    monkeypatch.setattr(bundle, "MAX_RECORDS", 2)
    records = [(FUNCTION_PATTERN, pattern(r, "f", 10.0)) for r in range(5)]
    asyncio.run(wiring.send(ctx, records))
    sent = ctx.topics[TopicRole.PATTERNS].sent
    assert [len(bundle.records_in(v)) for _, v in sent] == [2, 2, 1]
    assert not bundle.is_bundle(sent[-1][1])  # one record alone is sent as itself
    items = [item for _, v in sent for item in bundle.records_in(v)]
    assert [MultiCodec([FUNCTION_PATTERN]).decode(i)[1]["rank"] for i in items] == [0, 1, 2, 3, 4]


def test_a_record_its_schema_refuses_is_counted_and_the_others_still_go_out(ctx):
    bad = {**pattern(1, "f", 10.0), "rank": "not a number"}
    records = [(FUNCTION_PATTERN, pattern(0, "f", 10.0)), (FUNCTION_PATTERN, bad), (FUNCTION_PATTERN, pattern(2, "f", 10.0))]
    asyncio.run(wiring.send(ctx, records))
    ((key, value),) = ctx.topics[TopicRole.PATTERNS].sent
    assert key == b"job|f" and [MultiCodec([FUNCTION_PATTERN]).decode(i)[1]["rank"] for i in bundle.records_in(value)] == [0, 2]
    counted = ctx.counters.snapshot()
    assert counted["errors.patterns.encode"] == 1 and counted["records_out.FunctionPattern"] == 2


def test_messages_taken_but_not_processed_and_records_being_sent_count_as_input_to_come(ctx, monkeypatch):
    """A chunk filling (or waiting for the agent) is in neither the consumer's lag nor the
    stream's queue: the timer must still count it as the stage's input to come, or it closes a
    job's windows on the wall clock while the job's data waits in the chunk."""
    app = FakeApp()
    seen: list[tuple[int, int]] = []

    def feed(core, name, rec, now):
        seen.append((ctx.held[TopicRole.PATTERNS], ctx.held[TopicRole.FINDINGS]))

    probe = Stage(name="probe", topic=TopicRole.PATTERNS, create=lambda rec, policy: Boom(), feed=feed,
                  poll=lambda core, now, flush: [])
    wiring.register(app, ctx, probe)
    msgs = [ctx.encode(FUNCTION_PATTERN, pattern(r, "f", 1.0)) for r in range(5)]
    ctx.held[TopicRole.PATTERNS] = 7  # left by an agent that crashed with a chunk: gone with it
    asyncio.run(app.agents["perftracker.probe"](stream_of(*msgs, chunk=3)))
    assert seen == [(3, 0)] * 3 + [(2, 0)] * 2  # the chunk's messages held while it is processed
    assert ctx.held[TopicRole.PATTERNS] == 0

    class Watching(FakeTopic):
        async def send(self, key, value, headers=None):
            seen.append((ctx.held[TopicRole.PATTERNS], ctx.held[TopicRole.FINDINGS]))
            await super().send(key, value, headers)

    ctx.topics[TopicRole.FINDINGS] = Watching()
    seen.clear()
    records = [(RANK_WINDOW, rank_window(r)) for r in range(3)] + [(RANK_WINDOW, {**rank_window(0), "job": "other"})]
    asyncio.run(wiring.send(ctx, records))
    assert seen == [(0, 4), (0, 4)]  # two keys (two jobs): all four records held until both are sent
    assert ctx.held[TopicRole.FINDINGS] == 0


class Decides(Skips):
    """A core whose diagnosis rules decided something (as JobDiagnoser.decisions counts them)."""

    def __init__(self) -> None:
        super().__init__()
        self.decisions: Counter[tuple[str, str]] = Counter()


def test_the_rules_decisions_reach_the_worker_counters_also_after_their_core_is_dropped(ctx, monkeypatch):
    app = FakeApp()
    cores: list[Decides] = []

    def create(rec, policy):
        cores.append(Decides())
        return cores[-1]

    def feed(core, name, rec, now):
        core.decisions[("stragglers", "cleared")] += 1
        core.decisions[("late_entries", "added")] += 2

    probe = Stage(name="probe", topic=TopicRole.PATTERNS, create=create, feed=feed, poll=lambda core, now, flush: [])
    wiring.register(app, ctx, probe)
    msgs = [ctx.encode(FUNCTION_PATTERN, pattern(r, f, 1.0)) for r in range(3) for f in ("f", "g")]
    asyncio.run(app.agents["perftracker.probe"](stream_of(*msgs)))
    ((_, _, tick),) = app.timers
    asyncio.run(tick())
    counted = ctx.counters.snapshot()
    assert counted["rule_decisions.stragglers.cleared"] == 6 and counted["rule_decisions.late_entries.added"] == 12
    cores[0].done = True  # dropped on the next tick: its decisions still count
    asyncio.run(tick())
    monkeypatch.setattr(wiring, "SKIPPED_REFRESH_MS", 0)
    asyncio.run(tick())
    assert ctx.counters.snapshot()["rule_decisions.stragglers.cleared"] == 6


def test_overload_sheds_the_job_holding_the_most_records_whole_and_counts_the_loss(ctx, monkeypatch):
    """Past ``shed_backlog_records`` records waiting over the diagnose stage's jobs, the job holding
    the most is dropped whole; ``jobs_shed`` and ``records_shed`` count it (topology.Cores.shed)."""
    from perftracker_ml.streams.topology import DIAGNOSE

    ctx.policy = DetectionPolicy(window_s=5.0, shed_backlog_records=10)
    app = FakeApp()
    wiring.register(app, ctx, DIAGNOSE)
    monkeypatch.setattr(wiring, "now_ms", lambda: T0_WINDOW * W_MS)
    small = [ctx.encode(RANK_WINDOW, dict(rank_window(r, world=64), job="small")) for r in range(4)]
    giant = [ctx.encode(RANK_WINDOW, dict(rank_window(r, world=64), job="giant")) for r in range(8)]
    asyncio.run(app.agents["perftracker.diagnose"](stream_of(*small, *giant, chunk=12)))
    counted = ctx.counters.snapshot()
    assert counted["records_in.RankWindow"] == 12  # every window waits for its 64 ranks
    assert counted["jobs_shed.diagnose"] == 1 and counted["records_shed.diagnose"] == 8


def test_no_shedding_under_the_bound_or_when_off():
    from perftracker_ml.streams.topology import DIAGNOSE, Cores

    for bound in (12, 0):
        cores = Cores(DIAGNOSE, DetectionPolicy(window_s=5.0, shed_backlog_records=bound))
        for job, n in (("a", 4), ("b", 8)):
            for r in range(n):
                rec = dict(rank_window(r, world=64), job=job)
                DIAGNOSE.feed(cores.for_record(rec), RANK_WINDOW, rec, 0)
        assert cores.shed() == [] and set(cores.by_key) == {"a", "b"}
    cores.policy = DetectionPolicy(window_s=5.0, shed_backlog_records=11)
    assert cores.shed() == [("b", 8)] and set(cores.by_key) == {"a"}


def test_the_diagnose_agent_reads_a_rank_window_set_as_its_rank_windows_each_checked_alone(ctx):
    """A RankWindowSet (schemas/record_sets.py) is read as if each RankWindow had come alone: the
    valid ones fed, one breaking the RankWindow rules dead-lettered with a reason naming its rank,
    a set whose columns are ragged dead-lettered whole; sent, it counts as its RankWindows."""
    from perftracker_ml.schemas import record_sets
    from perftracker_ml.schemas.vocabulary import RANK_WINDOW_SET
    from perftracker_ml.streams.topology import DIAGNOSE

    rws = [{**rank_window(r, world=4), "schema_version": 6} for r in range(4)]
    rws[2]["restarts"] = -1
    good = record_sets.FORMATS[RANK_WINDOW].pack(rws)
    ragged = {**good, "rank": good["rank"][:-4]}
    asyncio.run(wiring.send(ctx, [(RANK_WINDOW_SET, good), (RANK_WINDOW_SET, ragged)]))
    assert ctx.counters.snapshot()["records_out.RankWindow"] == 8
    ((key, value),) = ctx.topics[TopicRole.FINDINGS].sent  # both sets keyed by job: one bundle
    assert key == b"job" and len(bundle.records_in(value)) == 2
    app = FakeApp()
    wiring.register(app, ctx, DIAGNOSE)
    asyncio.run(app.agents["perftracker.diagnose"](stream_of(value)))
    counted = ctx.counters.snapshot()
    assert counted["records_in.RankWindow"] == 3 and counted["dead_lettered.findings"] == 2
    assert counted["invalid.findings"] == 1 and counted["decode_errors.findings"] == 1
