"""Installs every torch-side hook once ``torch`` is importable (thin adapter)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from .cuda_timing import CudaCommTimer
from .hooks_python import (
    ForwardTimer,
    OptimizerTimer,
    install_dataloader,
    install_distributed_checkpoint,
    install_extra_functions,
    install_torch_functions,
)

if TYPE_CHECKING:
    from .collector import Collector


def install_torch_hooks(collector: Collector, torch: ModuleType) -> None:
    cfg = collector.settings.collector
    rec = collector.recorder
    patches = collector.patches
    _guarded(collector, "dataloader", lambda: install_dataloader(torch, rec, patches))
    cuda = _cuda_timer(collector, torch)
    opt = OptimizerTimer(rec, cuda)
    _guarded(collector, "optimizer", lambda: opt.install(torch))
    collector.add_remover(opt.remove)
    if cfg.forward:
        fwd = ForwardTimer(rec, cuda)
        _guarded(collector, "forward", lambda: fwd.install(torch, patches))
        collector.add_remover(fwd.remove)
    _guarded(collector, "torch functions", lambda: install_torch_functions(torch, rec, patches, cuda))
    _guarded(collector, "distributed checkpoint", lambda: collector.imports.when_imported(
        "torch.distributed.checkpoint",
        lambda dcp: _guarded(collector, "distributed checkpoint",
                             lambda: install_distributed_checkpoint(dcp, rec, patches))))
    if cfg.comms:
        _guarded(collector, "collectives", lambda: _install_comms(collector, torch, cuda))
    if cfg.functions:
        specs = [s.strip() for s in cfg.functions.split(",") if s.strip()]
        pending = install_extra_functions(specs, rec, patches)
        if pending:
            _retry_at_first_step(collector, pending)
    from .optional_parts import start_optional_parts
    _guarded(collector, "optional parts", lambda: start_optional_parts(collector, torch))


def _cuda_timer(collector: Collector, torch: ModuleType) -> CudaCommTimer | None:
    """The device-time reader of collectives and phases on a CUDA machine (polled by the sender)."""
    if not CudaCommTimer.available(torch):
        return None
    cuda = CudaCommTimer(torch, collector.recorder)
    collector.sender.add_task(cuda.poll)
    return cuda


def _install_comms(collector: Collector, torch: ModuleType, cuda: CudaCommTimer | None) -> None:
    import torch.distributed as dist
    if not dist.is_available():
        return
    from .comm import CommTimer
    rec = collector.recorder
    timer = CommTimer(dist, rec, cuda)
    timer.install(collector.patches)
    from .flight_recorder import FlightRecorder
    collector.sender.flight = FlightRecorder.from_torch(collector.errors)
    if collector.settings.collector.functional:
        _guarded(collector, "functional collectives", lambda: _install_functional(collector, torch, timer))
    _guarded(collector, "device mesh", lambda: collector.imports.when_imported(
        "torch.distributed.device_mesh", lambda module: _install_mesh(collector, module)))
    if collector.settings.collector.ddp_hook:
        from .ddp import install_ddp
        install_ddp(torch, collector.patches, collector.errors, timer.ddp_allreduce_hook())


def _install_functional(collector: Collector, torch: ModuleType, timer: object) -> None:
    from .comm import CommTimer
    from .functional import FunctionalTimer
    assert isinstance(timer, CommTimer)
    functional = FunctionalTimer(torch, collector.recorder, timer.registry, timer.cuda,
                                 sample=collector.settings.collector.functional_sample,
                                 steps=collector.settings.collector.functional_steps)
    collector.add_remover(functional.remove)
    functional.install()
    collector.sender.builder.functional_steps = functional.steps  # the stream judges the recorded steps only


def _install_mesh(collector: Collector, module: ModuleType) -> None:
    from .mesh import install_mesh

    def publish(coords: dict[str, int]) -> None:
        collector.sender.builder.mesh_coords = {**collector.sender.builder.mesh_coords, **coords}

    _guarded(collector, "device mesh", lambda: install_mesh(module, collector.patches, collector.errors, publish))


def _retry_at_first_step(collector: Collector, pending: list[str]) -> None:
    """Functions of ``__main__`` exist only once the script runs: retry at the first step."""
    rec = collector.recorder

    def retry(step: int) -> None:
        rec.remove_step_listener(retry)
        left = install_extra_functions(pending, rec, collector.patches)
        if left:
            collector.errors.caught("functions", LookupError(f"cannot resolve {left}"))

    rec.add_step_listener(retry)


def _guarded(collector: Collector, what: str, install: Callable[[], object]) -> None:
    try:
        install()
    except Exception as exc:  # noqa: BLE001 - a hook that cannot go in is skipped, not fatal
        collector.errors.caught(what, exc)
