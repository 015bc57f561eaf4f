"""Optional parts started after the torch hooks: profiling windows, control follower, NVML."""

from __future__ import annotations

import logging
from typing import Any

from ..schemas import Codec
from ..schemas.vocabulary import HARDWARE_BATCH
from .control import ControlFollower
from .hardware import HardwareSampler, open_nvml
from .profiling import ProfileWindows
from .transport import KafkaSink

log = logging.getLogger("perftracker.collectors")


def start_optional_parts(collector: Any, torch: Any) -> None:
    cfg = collector.settings.collector
    sampler = _start_nvml(collector, torch) if cfg.nvml_interval_s > 0 else None
    on_change = sampler.set_fast if sampler is not None else (lambda active: None)
    windows = ProfileWindows(torch, collector.sender.kernels.append, collector.errors,
                             cfg.profile_every_s, cfg.profile_duration_s, on_change)
    collector.windows = windows
    collector.recorder.step_listeners.append(windows.on_step)
    collector.sender.tasks.append(windows.summarize_finished)
    collector.extras.insert(0, windows)
    if cfg.control and isinstance(collector.sink, KafkaSink):
        follower = ControlFollower(collector.kafka_conf, collector.topics.control,
                                   collector.identity.job, windows, collector.errors)
        follower.start()
        collector.extras.append(follower)


def _start_nvml(collector: Any, torch: Any) -> HardwareSampler | None:
    if not _cuda(torch):
        log.info("perftracker: no CUDA device; GPU hardware sampling is off")
        return None
    nvml = open_nvml(collector.identity.local_rank)
    if nvml is None:
        return None
    _, _, index, uuid = nvml
    identity = collector.identity.with_gpu(index, uuid)
    collector.identity = identity
    collector.sender.builder.identity = identity
    codec = Codec(HARDWARE_BATCH)
    sink = collector.sink

    def send(record: dict) -> None:
        if isinstance(sink, KafkaSink):
            sink.send_to(collector.topics.hardware, identity.key, codec.encode(record))

    cfg = collector.settings.collector
    sampler = HardwareSampler(nvml, identity, send, cfg.nvml_interval_s,
                              cfg.nvml_profile_interval_s, collector.errors)
    sampler.start()
    collector.extras.append(sampler)
    return sampler


def _cuda(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False
