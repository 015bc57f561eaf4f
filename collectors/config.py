"""What :func:`perftracker_ml.collectors.attach` reads: the collector and Kafka settings.

Both sections are declared in :mod:`perftracker_ml.schemas.settings` (``collector``
and ``kafka``; `perftracker config` lists them) and read here from the
environment only (``PERFTRACKER_COLLECTOR_*``, ``PERFTRACKER_KAFKA_*``), so
``PERFTRACKER_COLLECTOR_FLUSH_INTERVAL_S=2`` sets ``flush_interval_s``.
Nothing is read at import time.

Inside a training process a bad setting never stops the job: a value that cannot
be used (not a number, out of its range) and a ``PERFTRACKER_*`` variable that is
no setting are each logged once, in one line naming the problem, and the field
keeps its default (:func:`warn_once`). Only the standard library is used here: the
slim install has neither pydantic nor rich.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..schemas.settings import CollectorSettings, KafkaSettings
from ..schemas.settings_checks import check_kafka
from ..schemas.settings_loader import load_section, unknown_env_problems

log = logging.getLogger("perftracker_ml.collectors")
_warned: set[str] = set()


def warn_once(problem: str) -> None:
    """Log ``problem`` once per process (each rank reads its settings more than once)."""
    if problem not in _warned:
        _warned.add(problem)
        log.warning("perftracker: ignoring a bad setting: %s", problem)


@dataclass(frozen=True)
class AttachSettings:
    """Everything :func:`attach` needs: collector settings plus the Kafka client settings."""

    collector: CollectorSettings
    kafka: KafkaSettings


def load_attach_settings(env: Mapping[str, str] | None = None, **overrides: object) -> AttachSettings:
    """Read ``PERFTRACKER_COLLECTOR_*`` and ``PERFTRACKER_KAFKA_*``; keyword overrides win."""
    env = os.environ if env is None else env
    for problem in unknown_env_problems(env):
        warn_once(problem)
    collector = load_section(CollectorSettings, "collector", env, warn=warn_once)
    if overrides:
        collector = dataclasses.replace(collector, **overrides)  # type: ignore[arg-type]
    kafka = load_section(KafkaSettings, "kafka", env, warn=warn_once)
    check_kafka(kafka)
    return AttachSettings(collector, kafka)
