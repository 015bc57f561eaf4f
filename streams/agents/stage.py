"""One Faust agent and one timer per stage of :mod:`..topology` (thin wiring, no logic).

The agent takes the messages of the stage's topic in chunks (up to ``TAKE_MESSAGES``, or
what came within ``TAKE_WITHIN_S``: Faust's ``take_events``, which acks them once the
chunk is done), decodes each (a bundle's records one by one), hands each record to the
core of its key and, for a stage that polls on input, polls that core right away; what
the chunk's polls closed is sent at the chunk's end. A stage with ``feed_chunk`` (the
summarizers: :mod:`...detect.chunk_fold` folds a chunk's EventBatches column-wise) gets
the chunk's records at once, and each core fed is polled once, at the end. The timer polls the cores with
something due (``Cores.due``: not every core) each ``POLL_INTERVAL_S`` and sends what they
return. Sending puts the records of one key on the patterns and findings topics in
bundles (:mod:`...schemas.bundle`), so a chunk of 500 input messages of 512 ranks makes a
bundle per function and one per job instead of a message per rank, window and function.
A record or tick that raises is counted and skipped.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from ...schemas import bundle, record_sets
from ...schemas.records import Anomaly, RankWindow, RecordSet
from ...schemas.vocabulary import ANOMALY, RANK_WINDOW
from ..context import StreamContext, StreamCounters, now_ms
from ..metrics import consumer_lag
from ..topology import POLL_INTERVAL_S, TOPIC_OF, Cores, Routed, Stage, TopicRole, message_key

SKIPPED_REFRESH_MS = 2000  # the cores' skip counts reach ``records_skipped`` this often (a sum over cores)
TAKE_MESSAGES = 500  # an agent takes up to this many messages at once (Faust ``take_events``) ...
TAKE_WITHIN_S = 0.05  # ... or what came within this long, and sends what they closed together
# the topics whose records of one key go out bundled (not anomalies and control: read by others)
BUNDLED = frozenset({TopicRole.PATTERNS, TopicRole.FINDINGS})


class Observer(Protocol):
    """Worker metrics taken from a stage's cores (e.g. :class:`..gaps.SummarizerGaps`)."""

    def fed(self, core: Any, name: str, record: Mapping[str, Any]) -> None: ...

    def dropped(self, core: Any) -> None: ...


def register(app: Any, ctx: StreamContext, stage: Stage[Any], observer: Observer | None = None,
             upstream: tuple[str, ...] = ()) -> None:
    """Add ``stage``'s agent (``perftracker.<name>``) and timer to ``app``; ``observer`` sees
    every record fed to a core and every core dropped. ``upstream``: the topic roles of the
    stages that feed this one: messages pending there are this stage's input to come (a
    backlog of events is read by the summarizers in bursts of patterns and windows, seconds
    apart, each drained at once: its own topic alone would say the job's input stopped)."""
    cores = Cores(stage, ctx.policy)
    refreshed = [0]  # when the skip counts were last copied into the worker's counters

    def feed(name: str, record: Mapping[str, Any], partition: int | None) -> list[Routed]:
        """Feed one decoded record to the core of its key: what a poll right after returns."""
        core = None
        try:
            key = cores.key_of(record)
            core = cores.for_record(record, partition)
            now = now_ms()
            stage.feed(core, name, record, now)
            if observer is not None:
                observer.fed(core, name, record)
            ctx.count_in(name)
            out = stage.poll(core, now, False) if stage.poll_on_input else []
            cores.schedule(key, core)  # for the tick at which it is next due
            return out
        except Exception as exc:
            ctx.failed(stage.name, exc)
            if core is not None:
                cores.schedule(key, core)
            return []

    def feed_chunk(records: Sequence[tuple[str, Mapping[str, Any], int | None]]) -> list[Routed]:
        """Feed a chunk's records at once (``Stage.feed_chunk``), then poll each core fed once."""
        assert stage.feed_chunk is not None
        now = now_ms()
        items: list[tuple[Any, str, Any]] = []
        fed: dict[str, Any] = {}
        for name, record, partition in records:
            try:
                key = cores.key_of(record)
                core = cores.for_record(record, partition)
            except Exception as exc:
                ctx.failed(stage.name, exc)
                continue
            items.append((core, name, record))
            fed.setdefault(key, core)
        try:
            result = stage.feed_chunk(items, now)
            failure = getattr(result, "failure", None)
            if failure is not None:  # recovered from (folded a batch at a time), but a defect to see
                ctx.failed(f"{stage.name}.chunk", failure)
            for error in getattr(result, "failed", None) or ():  # records left out, as one by one
                ctx.failed(stage.name, error)
            one_at_a_time, folded = getattr(result, "sequential", 0), getattr(result, "folded", 0)
            if folded:
                ctx.counters.inc(StreamCounters.batches_folded, "columnar", by=folded - one_at_a_time)
                ctx.counters.inc(StreamCounters.batches_folded, "one_at_a_time", by=one_at_a_time)
        except Exception as exc:
            ctx.failed(stage.name, exc)
        for core, name, record in items:
            if observer is not None:
                observer.fed(core, name, record)
            ctx.count_in(name)
        out: list[Routed] = []
        if stage.poll_on_input:
            out, failed = stage.poll_all(list(fed.values()), now, False)
            for error in failed:
                ctx.failed(stage.name, error)
        for key, core in fed.items():
            cores.schedule(key, core)
        return out

    def taken(value: Any) -> Any:
        """A stream processor, run as each message enters the agent's chunk: counted as held."""
        ctx.held[stage.topic] += 1
        return value

    @app.agent(ctx.topics[stage.topic], name=f"perftracker.{stage.name}")
    async def consume(stream: Any) -> None:
        ctx.held[stage.topic] = 0  # a restarted agent: what its last chunk held is gone with it
        stream.add_processor(taken)  # before take_events adds its own: runs first
        async for events in stream.take_events(TAKE_MESSAGES, within=TAKE_WITHIN_S):
            out: list[Routed] = []
            try:
                records = []
                for event in events:
                    partition = partition_of(event)
                    for name, record in await ctx.decode_all(ctx.codecs[stage.topic], stage.topic, event.value):
                        records.append((name, record, partition))
                if stage.feed_chunk is not None:
                    out = feed_chunk(records)
                else:
                    for name, record, partition in records:
                        out += feed(name, record, partition)
            finally:
                ctx.held[stage.topic] -= len(events)
            for _key, lost in cores.shed():  # overload: whole jobs dropped, counted (topology.Cores.shed)
                ctx.counters.inc(StreamCounters.jobs_shed, stage.name)
                ctx.counters.inc(StreamCounters.records_shed, stage.name, by=lost)
            try:
                await send(ctx, out)
            except Exception as exc:
                ctx.failed(stage.name, exc)

    @app.timer(POLL_INTERVAL_S, name=f"perftracker.{stage.name}.tick")
    async def tick() -> None:
        pending = {role: ctx.held[role] > 0 or input_pending(app, ctx.topics[role]) for role in (stage.topic, *upstream)}
        cores.clocks.input_pending(any(pending.values()),
                                   relayed=any(v for role, v in pending.items() if role != TopicRole.INPUTS))
        now = now_ms()
        due = cores.due(now)  # the cores with something due (topology.Cores.due)
        out, failed = stage.poll_all([core for _, core in due], now, False)
        for error in failed:
            ctx.failed(f"{stage.name}.tick", error)
        for key, core in due:
            if cores.polled(key, core, now) and observer is not None:
                observer.dropped(core)
        try:
            await send(ctx, out)
        except Exception as exc:
            ctx.failed(f"{stage.name}.tick", exc)
        if now - refreshed[0] >= SKIPPED_REFRESH_MS:
            refreshed[0] = now
            for reason, n in cores.skipped().items():
                ctx.counters.set(StreamCounters.records_skipped, n, stage.name, reason)
            for (rule, outcome), n in cores.decisions().items():
                ctx.counters.set(StreamCounters.rule_decisions, n, rule, outcome)


def partition_of(event: Any) -> int | None:
    """The partition a stream event's message was read from (None: unknown)."""
    message = getattr(event, "message", None)
    partition = getattr(message, "partition", None)
    return int(partition) if isinstance(partition, int) else None


def input_pending(app: Any, topic: Any) -> bool:
    """Whether messages of ``topic`` wait for the stage: unread by the worker's consumer (its lag
    on one of the topic's partitions it is assigned), or read and queued for the agent (Faust
    hands up to ``stream_buffer_maxsize`` messages ahead to the agent's queue, which the lag no
    longer counts; those taken into the agent's chunk, and records being sent, are counted
    apart in ``StreamContext.held``): a backlog not processed yet, whatever the wall clock says. While the consumer
    group rebalances (Faust's ``app.rebalancing``: consumption stops, seconds with tansu's slow
    group joins) the input counts as pending: a pause of reading is not the job's input stopping
    (a 512-rank backlog read by the real worker had 1,932 events dropped as late when its windows
    closed on the wall clock during such a pause). So does an assigned partition this worker
    has not read from yet while its messages may be unread (:func:`_unread_unknown`)."""
    names = set(getattr(topic, "topics", ()) or ())
    if getattr(app, "rebalancing", False):
        return True  # consumption paused while partitions move: what is unread is not known
    try:
        if _queued(topic):
            return True
        consumer = app.consumer
        if any(lag > 0 for (name, _p), lag in consumer_lag(consumer).items() if name in names):
            return True
        return _unread_unknown(consumer, names, time.monotonic())
    except Exception:  # a consumer between assignments: as if nothing were pending
        return False


UNKNOWN_PENDING_S = 60.0  # how long a partition never read from counts as pending at most
_first_seen: dict[tuple[int, Any], float] = {}  # (id(consumer), tp) -> when first seen assigned


def _unread_unknown(consumer: Any, names: set[str], now_s: float) -> bool:
    """Whether an assigned partition of ``names`` has no lag to say (:func:`.metrics.consumer_lag`
    leaves it out) but may hold unread messages: its high watermark not known yet, or nothing
    read from it while it holds messages past the group's committed offset (none committed:
    any message). A 512-rank backlog lost one rank's first events per partition (8 ranks, 8
    partitions) when the first partitions read made the input look drained while the others
    had not delivered a message yet. Counted pending for at most ``UNKNOWN_PENDING_S`` after
    this worker first saw the partition assigned: a partition whose messages are all past
    retention is never read from, and must not hold every job's windows open."""
    read = getattr(consumer, "_read_offset", {})
    committed = getattr(consumer, "_committed_offset", {})
    for tp in consumer.assignment():
        if tp.topic not in names or read.get(tp) is not None:
            continue
        first = _first_seen.setdefault((id(consumer), tp), now_s)
        if now_s - first > UNKNOWN_PENDING_S:
            continue
        high, base = consumer.highwater(tp), committed.get(tp)
        if high is None or int(high) > (int(base) if base is not None else 0):
            return True
    return False


def _queued(topic: Any) -> int:
    """Messages waiting in the queues of the channels iterating a Faust topic (its agent's)."""
    root = getattr(topic, "_root", None) or topic
    return sum(int(sub.queue.qsize()) for sub in list(getattr(root, "_subscribers", ())))


def encode_all(ctx: StreamContext, records: Sequence[Routed]) -> list[bytes | Exception]:
    """Each record framed by its topic's codec, or the exception encoding it raised, in order.
    The records of one name are encoded together (:meth:`StreamContext.encode_many`: a window's
    thousands of FunctionPatterns column-wise); a group with a record its schema refuses is
    encoded again one record at a time, so that only that record is lost."""
    positions: dict[str, list[int]] = {}
    for i, (name, _) in enumerate(records):
        positions.setdefault(name, []).append(i)
    out: list[bytes | Exception] = [b""] * len(records)
    for name, where in positions.items():
        group = [records[i][1] for i in where]
        try:
            encoded: list[bytes | Exception] = list(ctx.encode_many(name, group))
        except Exception:
            encoded = [_encode_one(ctx, name, record) for record in group]
        for i, value in zip(where, encoded, strict=True):
            out[i] = value
    return out


def _encode_one(ctx: StreamContext, name: str, record: Mapping[str, Any]) -> bytes | Exception:
    try:
        return ctx.encode(name, record)
    except Exception as exc:
        return exc


def _unwrap(encoded: bytes | Exception) -> bytes:
    """The bytes :func:`encode_all` made of a record; the exception it met, raised."""
    if isinstance(encoded, Exception):
        raise encoded
    return encoded


async def send(ctx: StreamContext, records: list[Routed]) -> None:
    """Produce each record to its topic with its key, and count it (Anomalies by status);
    a RankWindow and an Anomaly also time how long after their window they went out. The
    records of one key on a topic of :data:`BUNDLED` go out together, in order, as
    :mod:`RecordBundle <...schemas.bundle>` messages (one record alone as itself). The
    records are encoded by name, many at once (:func:`encode_all`)."""
    groups: dict[tuple[str, str], list[bytes]] = {}
    for (name, record), encoded in zip(records, encode_all(ctx, records), strict=True):
        role = TOPIC_OF[name]
        try:
            key = message_key(name, record)
            value = _unwrap(encoded)
        except Exception as exc:  # a record its schema refuses: that record is lost, not its chunk's others
            ctx.failed(f"{role}.encode", exc)
            continue
        if role in BUNDLED:
            groups.setdefault((role, key), []).append(value)
        else:
            await ctx.topics[role].send(key=key.encode(), value=value)
        if name == RANK_WINDOW:
            ctx.window_closed(cast(RankWindow, record))
            ctx.count_out(name)
        elif name in record_sets.SET_NAMES:  # its records counted (and timed) as if each had gone alone
            count, member = record_sets.size(record), record_sets.member(name)
            if member == RANK_WINDOW:
                ctx.window_closed(cast(RecordSet, record), count)
            ctx.count_out(member, by=count)
            ctx.count_out(name)
        elif name == ANOMALY:
            anomaly = cast(Anomaly, record)
            ctx.count_out(name, anomaly["status"])
            ctx.anomaly_sent(anomaly)
        else:
            ctx.count_out(name)
    sending: collections.Counter[str] = collections.Counter()
    for (role, _), items in groups.items():
        sending[role] += len(items)
    ctx.held.update(sending)  # input to come for the stages reading these topics, until sent
    try:
        for (role, key), items in groups.items():
            for value in bundle.bundled(items):
                await ctx.topics[role].send(key=key.encode(), value=value)
                if len(items) > 1 and bundle.is_bundle(value):
                    ctx.counters.inc(StreamCounters.bundles_out, role)
    finally:
        ctx.held.subtract(sending)
