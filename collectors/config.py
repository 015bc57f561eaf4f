"""What :func:`perftracker_ml.collectors.attach` reads: the collector and Kafka settings.

Both sections are declared in :mod:`perftracker_ml.schemas.settings` (``collector``
and ``kafka``; `perftracker config` lists them) and read here from the
environment only (``PERFTRACKER_COLLECTOR_*``, ``PERFTRACKER_KAFKA_*``), so
``PERFTRACKER_COLLECTOR_FLUSH_INTERVAL_S=2`` sets ``flush_interval_s``.
Nothing is read at import time.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..schemas.settings import CollectorSettings, KafkaSettings
from ..schemas.settings_checks import check_kafka
from ..schemas.settings_loader import load_section


@dataclass(frozen=True)
class AttachSettings:
    """Everything :func:`attach` needs: collector settings plus the Kafka client settings."""

    collector: CollectorSettings
    kafka: KafkaSettings


def load_attach_settings(env: Mapping[str, str] | None = None, **overrides: object) -> AttachSettings:
    """Read ``PERFTRACKER_COLLECTOR_*`` and ``PERFTRACKER_KAFKA_*``; keyword overrides win."""
    env = os.environ if env is None else env
    collector = load_section(CollectorSettings, "collector", env)
    if overrides:
        collector = dataclasses.replace(collector, **overrides)  # type: ignore[arg-type]
    kafka = load_section(KafkaSettings, "kafka", env)
    check_kafka(kafka)
    return AttachSettings(collector, kafka)
