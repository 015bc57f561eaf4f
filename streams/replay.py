"""Replay: a recording's input messages through the stream topology, on the recorded clock.

The worker's path for each message is kept: the value is split into its records (a
RecordBundle's items, else the message itself), each decoded by the input topic's codec
and validated (:mod:`perftracker_ml.schemas.validate`); what the worker would dead-letter is
counted here by reason. The records then go through :class:`..topology.LocalRunner` (the
summarize -> compare -> diagnose stages the Faust agents run) in the order they were
appended, with the clock driven by the recorded timestamps:

* messages are taken in chunks as the agent takes them: those within ``TAKE_WITHIN_S`` of
  the chunk's first, at most ``TAKE_MESSAGES``; a chunk is fed at its last message's time
  plus ``delivery_ms`` (the broker-to-worker delay, fixed so the replay is deterministic);
* the timers tick every ``POLL_INTERVAL_S`` of recorded time between chunks, and on for
  ``tail_s`` after the last message (what a worker sees after a job stops: its windows
  close, a silent job's ranks are named dead, a finished job's incidents are resolved).

Nothing reads the wall clock or a random source, so two replays of one recording give the
same anomalies, byte for byte (:func:`canonical`). The findings are the Anomaly records the
diagnose stage emits (every state of every incident, in order).
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..schemas import Codec, MultiCodec, SchemaError, bundle, bundled_schemas, columns
from ..schemas.recording import RecordedMessage
from ..schemas.rules import limits_for
from ..schemas.validate import validate
from ..schemas.vocabulary import ANOMALY, EVENT_BATCH
from .agents.stage import TAKE_MESSAGES, TAKE_WITHIN_S
from .detect import DetectionPolicy
from .topology import POLL_INTERVAL_S, LocalRunner, TopicRole, records_on

TICK_MS = round(POLL_INTERVAL_S * 1000)
TAKE_WITHIN_MS = round(TAKE_WITHIN_S * 1000)
DELIVERY_MS = 20  # a message reaches the worker this long after its timestamp, in a replay
TAIL_S = 90.0  # ticks go on this long after the last message (hangs are named >= 30 s after they start)


@dataclass
class ReplayResult:
    """What a replay produced: the Anomaly records in the order emitted, and what was set aside."""

    anomalies: list[dict[str, Any]] = field(default_factory=list)
    emitted_ms: list[int] = field(default_factory=list)  # the replay clock when each anomaly left
    messages: int = 0
    records: int = 0
    rejected: collections.Counter[str] = field(default_factory=collections.Counter)  # reason -> count
    first_ms: int | None = None
    last_ms: int | None = None

    def canonical(self) -> bytes:
        """The anomalies as canonical JSON lines (sorted keys): what "identical findings" compares."""
        return canonical(self.anomalies)


def canonical(anomalies: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(json.dumps(a, sort_keys=True, default=str).encode() + b"\n" for a in anomalies)


def decode_inputs(messages: Iterable[RecordedMessage], policy: DetectionPolicy,
                  rejected: collections.Counter[str]) -> list[tuple[RecordedMessage, list[tuple[str, dict]]]]:
    """Each input message with its valid records, in replay order; rejects counted by reason
    (the worker dead-letters them)."""
    codec = MultiCodec(records_on(TopicRole.INPUTS))
    limits = limits_for(policy.max_duration_s)
    out = []
    for msg in sorted((m for m in messages if m.role == TopicRole.INPUTS), key=lambda m: m.order):
        try:
            items = bundle.records_in(msg.value)
        except SchemaError:
            rejected["undecodable bundle"] += 1
            continue
        records = []
        for item in items:
            try:
                name, record = codec.decode(item)
            except SchemaError:
                rejected["undecodable"] += 1
                continue
            reason = validate(name, record, limits)
            if reason is not None:
                rejected["invalid"] += 1
                continue
            records.append((name, record))
        out.append((msg, records))
    return out


def reencoded(messages: Iterable[RecordedMessage], version: int) -> Iterator[RecordedMessage]:
    """``messages`` with every EventBatch re-encoded as EventBatch ``version`` (single-object,
    ``schema_version`` set to it), in bundles where the original was one; any other record,
    and one that does not decode, is kept byte for byte. What a replay of recordings made
    by older collectors through the columnar (v8) path, or back through lists, is made of."""
    schemas = bundled_schemas()
    codec = MultiCodec(records_on(TopicRole.INPUTS))
    writer = Codec(EVENT_BATCH, schemas.restricted(EVENT_BATCH, version))
    if writer.version != version:
        raise ValueError(f"no EventBatch v{version} (known up to v{schemas.latest(EVENT_BATCH).version})")
    packs = columns.is_packed(EVENT_BATCH, version)

    def item_as(item: bytes) -> bytes:
        try:
            name, record = codec.decode(item)
        except SchemaError:
            return item
        if name != EVENT_BATCH:
            return item
        record = {**(record if packs else columns.as_lists(record)), "schema_version": version}
        return writer.encode(record)

    for msg in messages:
        if msg.role != TopicRole.INPUTS:
            yield msg
            continue
        try:
            items = bundle.records_in(msg.value)
        except SchemaError:
            yield msg
            continue
        values = [item_as(item) for item in items]
        value = bundle.pack(values) if bundle.is_bundle(msg.value) else values[0]
        yield dataclasses.replace(msg, value=value)


def replay(messages: Iterable[RecordedMessage], policy: DetectionPolicy | None = None,
           delivery_ms: int = DELIVERY_MS, tail_s: float = TAIL_S) -> ReplayResult:
    """Feed the recorded input ``messages`` through the topology on their own clock."""
    policy = policy or DetectionPolicy()
    result = ReplayResult()
    decoded = decode_inputs(messages, policy, result.rejected)
    runner = LocalRunner(policy)
    next_tick: int | None = None

    def keep(routed: list[tuple[str, Any]], at_ms: int) -> None:
        for name, r in routed:
            if name == ANOMALY:
                result.anomalies.append(dict(r))
                result.emitted_ms.append(at_ms)

    def tick_until(now: int) -> None:
        nonlocal next_tick
        while next_tick is not None and next_tick <= now:
            keep(runner.tick(next_tick), next_tick)
            next_tick += TICK_MS

    i = 0
    now = 0
    while i < len(decoded):
        first = decoded[i][0].timestamp_ms
        chunk: list[tuple[str, Mapping[str, Any]]] = []
        j = i
        while j < len(decoded) and j - i < TAKE_MESSAGES and decoded[j][0].timestamp_ms < first + TAKE_WITHIN_MS:
            chunk += decoded[j][1]
            j += 1
        now = decoded[j - 1][0].timestamp_ms + delivery_ms
        if next_tick is None:
            next_tick = now + TICK_MS
            result.first_ms = first
        tick_until(now)
        if chunk:
            keep(runner.feed_chunk(chunk, now), now)
        result.messages += j - i
        result.records += len(chunk)
        i = j
    if next_tick is not None:
        result.last_ms = now
        tick_until(now + round(tail_s * 1000))
    return result
