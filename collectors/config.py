"""Collector settings: declared once, read from ``PERFTRACKER_COLLECTOR_*`` when attaching.

The variables follow the project's convention (``PERFTRACKER_<SECTION>_<NAME>``,
section ``collector``), so ``PERFTRACKER_COLLECTOR_FLUSH_INTERVAL_S=2`` sets
``flush_interval_s``. Kafka settings come from the ``kafka`` section of the
project config (``PERFTRACKER_KAFKA_*``). Nothing is read at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..deploy.config import KafkaSettings, _build

ENV_PREFIX = "PERFTRACKER_COLLECTOR_"


@dataclass(frozen=True)
class CollectorConfig:
    enabled: bool = field(default=True, metadata={"doc": "master switch; false = attach() does nothing"})
    job: str = field(default="", metadata={"doc": "job id; empty = TORCHELASTIC_RUN_ID or a generated one"})
    bootstrap_servers: str = field(default="", metadata={"doc": "Kafka bootstrap; empty = kafka.bootstrap_servers"})
    buffer_mb: float = field(default=32.0, metadata={"doc": "bound of the in-process event buffer; oldest dropped when full"})
    flush_interval_s: float = field(default=1.0, metadata={"doc": "a batch is built and sent this often"})
    exit_flush_s: float = field(default=2.0, metadata={"doc": "longest wait for delivery at process exit"})
    max_batch_events: int = field(default=20_000, metadata={"doc": "events per Kafka message at most"})
    functions: str = field(default="", metadata={"doc": "extra functions to time, 'module:qualname' comma-separated"})
    comms: bool = field(default=True, metadata={"doc": "time torch.distributed collectives and p2p calls"})
    ddp_hook: bool = field(default=True, metadata={"doc": "register a timed all-reduce comm hook in DDP models"})
    forward: bool = field(default=True, metadata={"doc": "time the root module's forward"})
    gc: bool = field(default=True, metadata={"doc": "time garbage-collector pauses"})
    gc_min_us: float = field(default=50.0, metadata={"doc": "GC pauses shorter than this are counted in stats, not sent"})
    stats_file: str = field(default="", metadata={"doc": "write the collector's stats as JSON here at exit ({rank}, {pid} expand)"})
    iteration_repeats: int = field(default=10, metadata={"doc": "identical repeats before an iteration pattern is locked"})
    iteration_relearn: int = field(default=200, metadata={"doc": "non-matching events before the pattern is re-learned"})
    control: bool = field(default=True, metadata={"doc": "follow pt.control profiling requests"})
    profile_every_s: float = field(default=300.0, metadata={"doc": "duty-cycle profiling window period; 0 = only on request"})
    profile_duration_s: float = field(default=3.0, metadata={"doc": "length of a duty-cycle profiling window"})
    nvml_interval_s: float = field(default=1.0, metadata={"doc": "NVML sampling period; 0 = off"})
    nvml_profile_interval_s: float = field(default=0.1, metadata={"doc": "NVML sampling period inside a profiling window"})
    log_every_s: float = field(default=60.0, metadata={"doc": "an instrumentation error is logged at most this often"})

    @property
    def buffer_events(self) -> int:
        return max(1024, int(self.buffer_mb * 1024 * 1024) // EVENT_COST_BYTES)


EVENT_COST_BYTES = 256  # measured size of one buffered event tuple with its ints


@dataclass(frozen=True)
class AttachSettings:
    """Everything :func:`attach` needs: collector settings plus the Kafka client settings."""

    collector: CollectorConfig
    kafka: KafkaSettings


def load_attach_settings(env: Mapping[str, str] | None = None, **overrides: object) -> AttachSettings:
    """Read ``PERFTRACKER_COLLECTOR_*`` and ``PERFTRACKER_KAFKA_*``; keyword overrides win."""
    env = os.environ if env is None else env
    collector = _build(CollectorConfig, "collector", {}, env)
    if overrides:
        collector = CollectorConfig(**{**collector.__dict__, **overrides})
    kafka = _build(KafkaSettings, "kafka", {}, env)
    return AttachSettings(collector, kafka)


def describe() -> list[tuple[str, str, str]]:
    """(env variable, default, doc) of every collector setting, for docs and --help."""
    from dataclasses import fields
    return [(ENV_PREFIX + f.name.upper(), repr(f.default), f.metadata.get("doc", ""))
            for f in fields(CollectorConfig)]
