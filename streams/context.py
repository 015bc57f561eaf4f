"""What every stream agent shares: topics, codecs, the detection policy and counters."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..deploy.topics import TopicNames
from ..schemas import (
    ANOMALY,
    CONTROL,
    EVENT_BATCH,
    FUNCTION_PATTERN,
    HARDWARE_BATCH,
    RANK_WINDOW,
    Codec,
    MultiCodec,
    SchemaError,
)
from ..schemas.rules import limits_for
from ..schemas.validate import validate

log = logging.getLogger("perftracker.streams")

FUNCTION_COMPARISON = "FunctionComparison"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class StreamContext:
    """Wiring shared by the agents of one worker process (plain attributes, no logic)."""

    names: TopicNames
    policy: Any  # perftracker.streams.detect.DetectionPolicy
    topics: dict[str, Any] = field(default_factory=dict)  # name -> faust topic
    counters: Counter = field(default_factory=Counter)
    inputs: MultiCodec = field(default_factory=lambda: MultiCodec([EVENT_BATCH, HARDWARE_BATCH]))
    pattern_codec: Codec = field(default_factory=lambda: Codec(FUNCTION_PATTERN))
    findings: MultiCodec = field(default_factory=lambda: MultiCodec([RANK_WINDOW, FUNCTION_COMPARISON]))
    anomaly_codec: Codec = field(default_factory=lambda: Codec(ANOMALY))
    control_codec: Codec = field(default_factory=lambda: Codec(CONTROL))

    async def dead_letter(self, source: str, raw: Any, reason: str) -> None:
        """Park an undecodable message on the dead-letter topic with the reason; never raise."""
        self.counters[f"deadletter.{source}"] += 1
        if self.counters[f"deadletter.{source}"] <= 5 or self.counters[f"deadletter.{source}"] % 1000 == 0:
            log.warning("dead-lettered a message from %s: %s", source, reason)
        value = raw if isinstance(raw, (bytes, bytearray)) else repr(raw).encode()
        try:
            await self.topics["deadletter"].send(
                key=source.encode(), value=bytes(value),
                headers=[("reason", reason[:1000].encode()), ("source", source.encode())])
        except Exception as exc:  # the dead-letter path itself must never kill an agent
            self.counters["deadletter.send_failed"] += 1
            log.error("could not dead-letter a message from %s: %s", source, exc)

    def failed(self, source: str, exc: BaseException) -> None:
        """Count an exception raised while processing one message or tick; log it at most now and then."""
        key = f"error.{source}"
        self.counters[key] += 1
        if self.counters[key] <= 3 or self.counters[key] % 1000 == 0:
            log.exception("error #%d in %s (message skipped): %s", self.counters[key], source, exc)

    async def decode(self, codec: Any, source: str, raw: Any) -> tuple[str, dict] | None:
        """Decode with a (Multi)Codec and validate the content (:mod:`perftracker.schemas.validate`);
        bad bytes and absurd records go to the dead-letter topic with the reason and return None."""
        try:
            decoded = codec.decode(raw)
        except SchemaError as exc:
            await self.dead_letter(source, raw, str(exc))
            return None
        name, record = decoded if isinstance(decoded, tuple) else (codec.name, decoded)
        reason = validate(name, record, limits_for(self.policy.max_duration_s))
        if reason is not None:
            self.counters[f"invalid.{source}"] += 1
            await self.dead_letter(source, raw, f"invalid: {reason}")
            return None
        return name, record
