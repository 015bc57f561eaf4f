"""`perftracker synth`: run a synthetic multi-rank job through the live stack and print the diagnosis."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..schemas.settings import Settings
from ..schemas.topics import TopicNames
from .workloads.synthetic import SyntheticJob, produce


def run_synthetic(settings: Settings, cfg: SyntheticJob, timeout_s: float,
                  echo: Callable[[str], None]) -> list[dict]:
    """Start the stack if needed, send the job, wait until the culprit (or nothing) is diagnosed."""
    from ..sinks.client import diagnose
    from .stack import up

    state = up(settings).state
    conf = {**settings.kafka.client_conf(), "bootstrap.servers": state.bootstrap}
    sent = produce(cfg, conf, TopicNames.for_prefix(settings.kafka.topic_prefix).events)
    who = f"rank {cfg.slow_rank}'s {cfg.slow_function} {cfg.slowdown:.0%} as long" if cfg.slow_rank >= 0 else "no fault"
    echo(f"sent {sent} batches: {cfg.ranks} ranks x {cfg.seconds:.0f}s of steps, {who}; job {cfg.job}")
    deadline = time.monotonic() + timeout_s
    rows: list[dict] = []
    while time.monotonic() < deadline:
        rows = diagnose(settings, cfg.job)
        if rows and cfg.slow_rank >= 0:
            return rows
        time.sleep(1.0)
    return rows
