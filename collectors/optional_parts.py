"""Optional parts started after the torch hooks: profiling windows, control follower, NVML."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING

from ..schemas.vocabulary import CONTROL, HARDWARE_BATCH
from .control import ControlFollower
from .counters import CollectorCounters
from .hardware import HardwareSampler, open_nvml
from .profiling import ProfileWindows
from .transport import KafkaSink, SpoolSink

if TYPE_CHECKING:
    from .collector import Collector

log = logging.getLogger("perftracker_ml.collectors")


def start_optional_parts(collector: Collector, torch: ModuleType) -> None:
    cfg = collector.settings.collector
    sampler = _start_nvml(collector, torch) if cfg.nvml_interval_s > 0 else None
    on_change = sampler.set_fast if sampler is not None else (lambda active: None)
    windows = ProfileWindows(torch, collector.sender.add_kernels, collector.errors,
                             cfg.profile_every_s, cfg.profile_duration_s, on_change,
                             lambda n: _count_dropped(collector, n), exit_budget_s=cfg.exit_flush_s / 2,
                             max_steps=cfg.profile_max_steps)
    collector.recorder.add_step_listener(windows.on_step)
    collector.sender.add_task(windows.summarize_finished)
    collector.add_part(windows, close_first=True)
    if cfg.control and isinstance(collector.sink, KafkaSink):
        follower = ControlFollower(collector.kafka_conf, collector.topics.control,
                                   collector.identity.job, windows, collector.errors,
                                   collector.codec(CONTROL, collector.topics.control))
        collector.on_identity(lambda ident: follower.set_job(ident.job))
        follower.start()
        collector.add_part(follower)


def _count_dropped(collector: Collector, windows: int) -> None:
    collector.recorder.counters.inc(CollectorCounters.profile_windows_dropped, by=windows)


def _start_nvml(collector: Collector, torch: ModuleType) -> HardwareSampler | None:
    if not _cuda(torch):
        log.info("perftracker: no CUDA device; GPU hardware sampling is off")
        return None
    nvml = open_nvml(collector.identity.local_rank)
    if nvml is None:
        return None
    _, _, index, uuid = nvml
    identity = collector.identity.with_gpu(index, uuid)
    collector.set_identity(identity)
    codec = collector.codec(HARDWARE_BATCH, collector.topics.hardware)
    sink = collector.sink

    def send(record: dict) -> None:
        # samples taken while the ranks still agree on the job id (a few seconds) are skipped
        if isinstance(sink, (KafkaSink, SpoolSink)) and collector.job_settled():
            sink.send_to(collector.topics.hardware, collector.identity.key, codec.encode(record))

    cfg = collector.settings.collector
    sampler = HardwareSampler(nvml, identity, send, cfg.nvml_interval_s,
                              cfg.nvml_profile_interval_s, collector.errors)
    collector.on_identity(lambda ident: setattr(sampler, "identity", ident))
    sampler.start()
    collector.add_part(sampler)
    return sampler


def _cuda(torch: ModuleType) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False
