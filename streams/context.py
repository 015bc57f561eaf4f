"""What every stream agent shares: topics, codecs, the detection policy and counters."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ..schemas import Codec, MultiCodec, SchemaError, bundle, record_sets
from ..schemas.counters import Counter, CounterSet, Histogram, Kind
from ..schemas.records import Anomaly, RankWindow, RecordSet
from ..schemas.registry import (
    Registry,
    RegistryCodec,
    RegistryMultiCodec,
    RegistryUnavailable,
    fetch_writer,
)
from ..schemas.rules import limits_for
from ..schemas.topics import TopicNames
from ..schemas.validate import validate
from ..schemas.vocabulary import (
    DEADLETTER_REASON,
    DEADLETTER_REASON_MAX_CHARS,
    DEADLETTER_SOURCE,
    Status,
)
from .topology import TOPIC_OF, records_on

log = logging.getLogger("perftracker_ml.streams")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


LATENCY_BUCKETS_MS = (500, 1000, 2000, 5000, 10_000, 15_000, 20_000, 30_000, 60_000, 120_000, 300_000)


class StreamCounters(CounterSet):
    """A stream worker's counters (``GET /perftracker/stats/`` shows their snapshot)."""

    component = "stream"

    records_in = Counter("records decoded and processed", labels=("record",))
    records_out = Counter("records produced (Anomaly records by status)", labels=("record", "status"))
    dead_lettered = Counter("messages parked on the dead-letter topic, by where they were read",
                            labels=("source",))
    dead_letter_failures = Counter("messages that could not be parked on the dead-letter topic")
    invalid = Counter("records that decoded but failed content validation (dead-lettered), by source",
                      labels=("source",))
    errors = Counter("exceptions while processing one message or one tick (the message is skipped)",
                     labels=("source",))
    records_skipped = Counter("records and events a stage's cores set aside (late for their window, window "
                              "evicted, malformed, after a rank's final batch ...), by stage and reason; "
                              "refreshed every few seconds", labels=("stage", "reason"))
    events_in = Counter("events (spans, collectives, iterations) in the EventBatches processed")
    rule_decisions = Counter("decisions of the diagnosis rules (streams/detect/pipeline.py): ranks a rule "
                             "flagged, added to a finding or cleared, by rule and outcome; refreshed every "
                             "few seconds", labels=("rule", "outcome"))
    decode_errors = Counter("messages that could not be decoded (dead-lettered), by where they were read",
                            labels=("source",))
    batches_lost = Counter("EventBatches missing from a rank's sequence numbers (gaps), summed over the "
                           "job's ranks", labels=("training_job",))
    events_dropped = Counter("events the job's collectors reported dropped before sending (from the "
                             "running totals in their batch headers)", labels=("training_job",))
    worst_rank_batches_lost = Counter("batches lost by the job's worst rank (one series per job: "
                                      "the rank label names it)", labels=("training_job", "rank"),
                                      kind=Kind.GAUGE)
    bundles_out = Counter("messages produced that carried several records of one key (RecordBundle), by "
                          "topic role (records_out counts the records in them)", labels=("topic",))
    batches_folded = Counter("EventBatches the summarizers folded, by how: 'columnar' (a chunk's batches "
                             "at once, detect/chunk_fold.py) or 'one_at_a_time' (a rank's first batch, "
                             "calls out of order, values beyond the chunk fold's range)", labels=("how",))
    jobs_shed = Counter("keys a stage dropped whole under overload (the diagnose stage: jobs, the largest "
                        "backlog first, when its cores held more than shed_backlog_records records waiting)",
                        labels=("stage",))
    records_shed = Counter("records waiting in the keys shed under overload, lost with them", labels=("stage",))
    ranks_ended = Counter("ranks whose collector's final batch (clean exit) came")
    windows_closed_at_end = Counter("windows closed by a rank's final batch instead of by later data "
                                    "or the clock (a finished job's last, partial windows)")
    consumer_lag = Counter("messages in a partition not yet processed: the high watermark seen in the "
                           "consumer's fetches minus the next offset to process, at least 0",
                           labels=("topic", "partition"), kind=Kind.GAUGE)
    window_close_delay_seconds = Histogram("from a window's end to its RankWindow being sent, in seconds "
                                           "(observed in ms)", buckets=LATENCY_BUCKETS_MS, per_unit=1000)
    detection_latency_seconds = Histogram("from the end of the window whose data raised or updated an "
                                          "incident to the Anomaly being sent, in seconds (observed in ms)",
                                          labels=("status",), buckets=LATENCY_BUCKETS_MS, per_unit=1000)


def topic_codecs(client: Registry | None = None, topics: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The codec of each topic role: it decodes what the role's topic carries and encodes what
    the worker writes to it (a topic of one record type: :class:`Codec`; of several:
    :class:`MultiCodec`, dispatching on the writer schema). With a schema registry ``client``,
    their registry-framed versions, ``topics`` naming each role's topic (its subject)."""
    codecs: dict[str, Any] = {}
    for role in dict.fromkeys(TOPIC_OF.values()):
        names = records_on(role)
        if client is None or topics is None:
            codecs[role] = Codec(names[0]) if len(names) == 1 else MultiCodec(names)
        elif len(names) == 1:
            codecs[role] = RegistryCodec(names[0], topics[role], client)
        else:
            codecs[role] = RegistryMultiCodec(names, topics[role], client)
    return codecs


def plain_codec(codec: Any, name: str, several: bool) -> Codec | None:
    """The single-object :class:`Codec` that :meth:`StreamContext.encode` encodes ``name`` with
    in a topic's ``codec`` (itself, or, on a topic of ``several`` record types, its member of a
    :class:`MultiCodec`); None for a registry-framed one or anything else."""
    if several:
        codec = codec.codecs.get(name) if type(codec) is MultiCodec else None
    return codec if type(codec) is Codec else None


@dataclass
class StreamContext:
    """Wiring shared by the agents of one worker process (plain attributes, no logic)."""

    names: TopicNames
    policy: Any  # perftracker_ml.streams.detect.DetectionPolicy
    topics: dict[str, Any] = field(default_factory=dict)  # name -> faust topic
    counters: StreamCounters = field(default_factory=StreamCounters)
    codecs: dict[str, Any] = field(default_factory=topic_codecs)  # topic role -> its codec
    # per topic role: messages an agent has taken from its stream but not processed yet (a chunk
    # filling, or waiting for the agent), and records being sent to it; neither is in the
    # consumer's lag nor in a stream's queue, and both are input to come for the stage
    held: collections.Counter[str] = field(default_factory=collections.Counter)

    def encode(self, name: str, record: Mapping[str, Any]) -> bytes:
        """A record the worker writes, framed by the codec of its topic."""
        role = TOPIC_OF[name]
        codec = self.codecs[role]
        return codec.encode(name, record) if len(records_on(role)) > 1 else codec.encode(record)

    def encode_many(self, name: str, records: Sequence[Mapping[str, Any]]) -> list[bytes]:
        """``[self.encode(name, r) for r in records]``, the records encoded together by a plain
        :class:`Codec` (:meth:`Codec.encode_many`); registry-framed codecs encode one by one.
        A record its schema refuses raises, as :meth:`encode` does (the whole call)."""
        role = TOPIC_OF[name]
        codec = plain_codec(self.codecs[role], name, len(records_on(role)) > 1)
        if codec is None:
            return [self.encode(name, r) for r in records]
        return codec.encode_many(cast(Sequence[dict], records))

    async def dead_letter(self, source: str, raw: Any, reason: str) -> None:
        """Park an undecodable message on the dead-letter topic with the reason; never raise."""
        n = self.counters.inc(StreamCounters.dead_lettered, source)
        if n <= 5 or n % 1000 == 0:
            log.warning("dead-lettered a message from %s: %s", source, reason)
        value = raw if isinstance(raw, (bytes, bytearray)) else repr(raw).encode()
        try:
            await self.topics["deadletter"].send(
                key=source.encode(), value=bytes(value),
                headers=[(DEADLETTER_REASON, reason[:DEADLETTER_REASON_MAX_CHARS].encode()),
                         (DEADLETTER_SOURCE, source.encode())])
        except Exception as exc:  # the dead-letter path itself must never kill an agent
            self.counters.inc(StreamCounters.dead_letter_failures)
            log.error("could not dead-letter a message from %s: %s", source, exc)

    def failed(self, source: str, exc: BaseException) -> None:
        """Count an exception raised while processing one message or tick; log it at most now and then."""
        n = self.counters.inc(StreamCounters.errors, source)
        if n <= 3 or n % 1000 == 0:
            log.exception("error #%d in %s (message skipped): %s", n, source, exc)

    def count_in(self, record: str) -> None:
        """One ``record`` (a record name) consumed and processed."""
        self.counters.inc(StreamCounters.records_in, record)

    def count_out(self, record: str, status: str = "", by: int = 1) -> None:
        """``by`` ``record`` produced (an Anomaly with its ``status``)."""
        self.counters.inc(StreamCounters.records_out, record, status, by=by)

    def window_closed(self, rank_window: RankWindow | RecordSet, ranks: int = 1) -> None:
        """``ranks`` RankWindows of one window are sent (one, or a RankWindowSet's): how long after
        the window's end."""
        end_ms = rank_window["window_start_ms"] + round(rank_window["window_s"] * 1000)
        self.counters.observe(StreamCounters.window_close_delay_seconds, max(0, now_ms() - end_ms), times=ranks)

    def anomaly_sent(self, anomaly: Anomaly) -> None:
        """An Anomaly is sent: how long after the end of the window that raised (or updated) it."""
        if anomaly["status"] != Status.RESOLVED.value:  # a resolution's last window is long past
            self.counters.observe(StreamCounters.detection_latency_seconds,
                                  max(0, now_ms() - int(anomaly["last_seen_ms"])), anomaly["status"])

    async def decode(self, codec: Any, source: str, raw: Any) -> tuple[str, dict] | None:
        """Decode with a (Multi)Codec and validate the content (:mod:`perftracker_ml.schemas.validate`);
        bad bytes and absurd records go to the dead-letter topic with the reason and return None.
        A registry-framed message waits while the schema registry is away (:meth:`writer_ready`)."""
        await self.writer_ready(getattr(codec, "client", None), raw)
        try:
            decoded = codec.decode(raw)
        except SchemaError as exc:
            self.counters.inc(StreamCounters.decode_errors, source)
            await self.dead_letter(source, raw, str(exc))
            return None
        name, record = decoded if isinstance(decoded, tuple) else (codec.name, decoded)
        reason = validate(name, record, limits_for(self.policy.max_duration_s))
        if reason is not None:
            self.counters.inc(StreamCounters.invalid, source)
            await self.dead_letter(source, raw, f"invalid: {reason}")
            return None
        return name, record

    async def decode_all(self, codec: Any, source: str, raw: Any) -> list[tuple[str, dict]]:
        """The records of one message (:meth:`decode`): a :mod:`RecordBundle <..schemas.bundle>`'s
        items in order, each decoded, validated and dead-lettered on its own (a corrupt bundle
        is dead-lettered whole), and a :mod:`record set <..schemas.record_sets>`'s records in
        order, as if each had been a message (:meth:`set_members`)."""
        try:
            items = bundle.records_in(raw)
        except SchemaError as exc:
            self.counters.inc(StreamCounters.decode_errors, source)
            await self.dead_letter(source, raw, str(exc))
            return []
        out: list[tuple[str, dict]] = []
        for item in items:
            decoded = await self.decode(codec, source, item)
            if decoded is not None and decoded[0] in record_sets.SET_NAMES:
                out += await self.set_members(source, item, *decoded)
            elif decoded is not None:
                out.append(decoded)
        return out

    async def set_members(self, source: str, raw: Any, name: str, record: dict) -> list[tuple[str, dict]]:
        """A record set's records, each checked with its record's content rules: a set whose columns
        do not hold one value per record is dead-lettered whole, a record that fails its rules alone
        (the set's bytes, with the reason naming its rank)."""
        try:
            members = record_sets.read(name, record, limits_for(self.policy.max_duration_s))
        except SchemaError as exc:
            self.counters.inc(StreamCounters.decode_errors, source)
            await self.dead_letter(source, raw, f"unreadable {name}: {exc}")
            return []
        member = record_sets.member(name)
        out: list[tuple[str, dict]] = []
        for one, reason in members:
            if reason is None:
                out.append((member, one))
                continue
            self.counters.inc(StreamCounters.invalid, source)
            await self.dead_letter(source, raw, record_sets.problem(name, one, reason))
        return out

    async def writer_ready(self, client: Any, raw: Any) -> None:
        """Fetch the writer schema of a Confluent-framed message, retrying with backoff while the
        registry cannot be reached (the message is held, not dead-lettered)."""
        delay = 0.5
        while True:
            try:
                return fetch_writer(client, raw)
            except RegistryUnavailable as exc:
                log.warning("%s; retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
