"""Built-in Python-level spans: data loading, optimizer step, forward, backward,
checkpoint save/load, ``torch.cuda.synchronize``, GC pauses, and extra functions.

Each hook takes two clock reads and one :meth:`Recorder.span`; any exception of
ours is caught and counted, never raised into the training loop. The user's own
exceptions pass through untouched.
"""

from __future__ import annotations

import functools
import gc
import importlib
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from ..schemas.vocabulary import SpanKind
from .counters import CollectorCounters
from .patching import Patches
from .recorder import Recorder

FETCH_NAME = "torch.utils.data.DataLoader.__next__"


def timed_callable(fn: Callable, name: str, kind: int, rec: Recorder) -> Callable:
    """Wrap ``fn`` so every call records one span named ``name``."""
    errors = rec.errors

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = perf_counter_ns()
            try:
                rec.span(kind, name, t0, t1 - t0)
            except Exception as exc:  # noqa: BLE001
                errors.caught(name, exc)

    return wrapper


def device_timed_callable(fn: Callable, name: str, kind: int, rec: Recorder, cuda: Any) -> Callable:
    """:func:`timed_callable` plus the call's device time (:mod:`.cuda_timing`) once CUDA is in use."""
    timed = timed_callable(fn, name, kind, rec)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ev = begin_phase(cuda, rec)
        step = rec.step
        t0 = perf_counter_ns()
        try:
            return timed(*args, **kwargs)
        finally:
            if ev is not None:
                try:
                    cuda.end_phase(ev, name, step, t0)
                except Exception as exc:  # noqa: BLE001
                    rec.errors.caught(name, exc)

    return wrapper


def begin_phase(cuda: Any, rec: Recorder) -> Any:
    """A phase's CUDA start event, or None (no CUDA timer, CUDA not in use, or it failed)."""
    if cuda is None:
        return None
    try:
        return cuda.begin_phase()
    except Exception as exc:  # noqa: BLE001
        rec.errors.caught("cuda event", exc)
        return None


def install_dataloader(torch: Any, rec: Recorder, patches: Patches) -> None:
    from torch.utils.data import dataloader

    errors = rec.errors

    def make(orig: Callable) -> Callable:
        def __next__(self: Any) -> Any:
            t0 = perf_counter_ns()
            item = orig(self)  # StopIteration passes through unrecorded
            t1 = perf_counter_ns()
            try:
                rec.fetch(FETCH_NAME, t0, t1)
            except Exception as exc:  # noqa: BLE001
                errors.caught("dataloader", exc)
            return item
        return __next__

    patches.replace(dataloader._BaseDataLoaderIter, "__next__", make)


class OptimizerTimer:
    """Global optimizer step hooks (``torch.optim.optimizer.register_optimizer_step_*_hook``)."""

    def __init__(self, rec: Recorder, cuda: Any = None):
        self.rec = rec
        self.cuda = cuda  # a CudaCommTimer: the step's device time too
        self._t0 = 0
        self._ev: Any = None
        self._step = -1
        self._names: dict[type, str] = {}
        self.handles: list[Any] = []

    def install(self, torch: Any) -> None:
        from torch.optim import optimizer
        self.handles.append(optimizer.register_optimizer_step_pre_hook(self._pre))
        self.handles.append(optimizer.register_optimizer_step_post_hook(self._post))

    def _pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.cuda is not None:
            self._ev, self._step = begin_phase(self.cuda, self.rec), self.rec.step
        self._t0 = perf_counter_ns()

    def _post(self, opt: Any, args: Any, kwargs: Any) -> None:
        t1 = perf_counter_ns()
        try:
            cls = type(opt)
            name = self._names.get(cls)
            if name is None:
                name = self._names[cls] = f"{cls.__module__}.{cls.__qualname__}.step"
            self.rec.optimizer_step(name, self._t0, t1)
            ev, self._ev = self._ev, None
            if ev is not None:
                self.cuda.end_phase(ev, name, self._step, self._t0)
        except Exception as exc:  # noqa: BLE001
            self.rec.errors.caught("optimizer", exc)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


class ForwardTimer:
    """Times the root module's forward.

    Global module hooks find the outermost module (depth 0) for the first
    ``DISCOVER_CALLS`` root calls, then they are removed, so inner modules keep
    their fast path. A DDP root (the usual one in data-parallel training) is
    then timed by a wrapper of ``DistributedDataParallel.forward`` that only
    looks up the instance: no module hooks, so ``Module.__call__`` keeps its
    fast path too (hooks on the root cost ~29 us per step in situ on a 1.5 ms
    CPU step, measured in docs/collectors.md). Any other root gets a
    forward pre-hook and hook of its own.
    """

    DISCOVER_CALLS = 3

    def __init__(self, rec: Recorder, cuda: Any = None):
        self.rec = rec
        self.cuda = cuda  # a CudaCommTimer: the forward's device time too
        self._depth = 0
        self._t0: list[int] = []
        self._ev: list[Any] = []  # CUDA start events, beside _t0
        self._seen: dict[int, Any] = {}
        self._root_calls = 0
        self._global: list[Any] = []
        self.handles: list[Any] = []
        self._names: dict[int, str] = {}
        self._class_timed: set[int] = set()  # ids of roots timed by the class-level wrapper
        self._ddp: Any = None  # DistributedDataParallel once its forward is wrapped

    def install(self, torch: Any, patches: Patches) -> None:
        from torch.nn.modules import module as m
        self._patch_ddp(patches)
        self._global = [m.register_module_forward_pre_hook(self._gpre),
                        m.register_module_forward_hook(self._gpost, always_call=True)]

    def _patch_ddp(self, patches: Patches) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        timed, errors, record, rec = self._class_timed, self.rec.errors, self._record, self.rec

        def make(orig: Callable) -> Callable:
            @functools.wraps(orig)
            def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
                if id(module) not in timed:
                    return orig(module, *args, **kwargs)
                ev = begin_phase(self.cuda, rec)
                t0 = perf_counter_ns()
                try:
                    return orig(module, *args, **kwargs)
                finally:
                    try:
                        record(module, t0, ev)
                    except Exception as exc:  # noqa: BLE001
                        errors.caught("forward", exc)
            return forward

        if patches.replace(DDP, "forward", make):
            self._ddp = DDP

    def _gpre(self, module: Any, args: Any) -> None:
        if self._depth == 0:
            self._ev.append(begin_phase(self.cuda, self.rec))
            self._t0.append(perf_counter_ns())
        self._depth += 1

    def _gpost(self, module: Any, args: Any, out: Any) -> None:
        self._depth -= 1
        if self._depth != 0:
            return
        try:
            self._record(module, self._t0.pop(), self._ev.pop())
            self._seen[id(module)] = module
            self._root_calls += 1
            if self._root_calls >= self.DISCOVER_CALLS:
                self._switch_to_roots()
        except Exception as exc:  # noqa: BLE001
            self.rec.errors.caught("forward", exc)

    def _switch_to_roots(self) -> None:
        for handle in self._global:
            handle.remove()
        self._global = []
        for module in self._seen.values():
            ddp = self._ddp
            if ddp is not None and isinstance(module, ddp) and type(module).forward is ddp.forward:
                self._class_timed.add(id(module))  # not for a subclass with a forward of its own
                continue
            self.handles.append(module.register_forward_pre_hook(self._pre))
            self.handles.append(module.register_forward_hook(self._post, always_call=True))
        self._seen = {}

    def _pre(self, module: Any, args: Any) -> None:
        self._ev.append(begin_phase(self.cuda, self.rec))
        self._t0.append(perf_counter_ns())

    def _post(self, module: Any, args: Any, out: Any) -> None:
        try:
            self._record(module, self._t0.pop(), self._ev.pop())
        except Exception as exc:  # noqa: BLE001
            self.rec.errors.caught("forward", exc)

    def _record(self, module: Any, t0: int, ev: Any = None) -> None:
        t1 = perf_counter_ns()
        name = self._names.get(id(module))
        if name is None:
            inner = getattr(module, "module", module)  # DDP/FSDP wrappers: name the model
            cls = type(inner)
            name = self._names[id(module)] = f"{cls.__module__}.{cls.__qualname__}.forward"
        self.rec.span(SpanKind.FORWARD, name, t0, t1 - t0)
        if ev is not None:
            self.cuda.end_phase(ev, name, self.rec.step, t0)

    def remove(self) -> None:
        for handle in self._global + self.handles:
            handle.remove()
        self._global, self.handles = [], []
        self._class_timed.clear()  # the DDP.forward patch itself is undone with the other patches


def install_torch_functions(torch: Any, rec: Recorder, patches: Patches, cuda: Any = None) -> None:
    """backward (its device time too, with a CUDA timer), checkpoint save/load and cuda synchronize."""
    import torch.autograd

    def wrap(name: str, kind: int) -> Callable[[Callable], Callable]:
        return lambda orig: timed_callable(orig, name, kind, rec)

    backward = "torch.autograd.backward"
    patches.replace(torch.autograd, "backward",
                    (lambda orig: device_timed_callable(orig, backward, SpanKind.BACKWARD, rec, cuda))
                    if cuda is not None else wrap(backward, SpanKind.BACKWARD))
    patches.replace(torch, "save", wrap("torch.save", SpanKind.CHECKPOINT))
    patches.replace(torch, "load", wrap("torch.load", SpanKind.CHECKPOINT))
    patches.replace(torch.cuda, "synchronize", wrap("torch.cuda.synchronize", SpanKind.SYNCHRONIZE))


DCP_FUNCTIONS = ("save", "load", "async_save", "save_state_dict", "load_state_dict")


def install_distributed_checkpoint(dcp: Any, rec: Recorder, patches: Patches) -> list[str]:
    """Checkpoint spans (kind 6) around ``torch.distributed.checkpoint``'s save and load
    (``async_save``: its synchronous part, staging and planning). The collectives DCP
    issues inside (gathers and broadcasts of the plans) are recorded by the wrappers."""
    def wrap(full: str) -> Callable[[Callable], Callable]:
        return lambda orig: timed_callable(orig, full, SpanKind.CHECKPOINT, rec)

    return [name for name in DCP_FUNCTIONS
            if patches.replace(dcp, name, wrap(f"torch.distributed.checkpoint.{name}"))]


class GcTimer:
    """GC pauses through ``gc.callbacks``; pauses under ``min_ns`` are only counted."""

    NAMES = ("gc.gen0", "gc.gen1", "gc.gen2")

    def __init__(self, rec: Recorder, min_ns: int = 0):
        self.rec = rec
        self.min_ns = min_ns
        self._t0 = 0
        # added to inline (a collection can run after any allocation: no call, no lock)
        self._short = rec.counters.cell(CollectorCounters.gc_short_pauses)
        self._short_ns = rec.counters.cell(CollectorCounters.gc_short_pause_seconds)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = perf_counter_ns()
            return
        try:
            t1 = perf_counter_ns()
            if t1 - self._t0 < self.min_ns:
                self._short.value += 1
                self._short_ns.value += t1 - self._t0
                return
            self.rec.span(SpanKind.GC, self.NAMES[info.get("generation", 2) % 3], self._t0, t1 - self._t0)
        except Exception as exc:  # noqa: BLE001
            self.rec.errors.caught("gc", exc)

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def _timed_python(orig: Callable, name: str, rec: Recorder) -> Callable:
    return timed_callable(orig, name, SpanKind.PYTHON, rec)


def install_extra_functions(specs: list[str], rec: Recorder, patches: Patches) -> list[str]:
    """Wrap ``module:qualname`` functions that can be resolved now; return the others."""
    pending = []
    for spec in specs:
        module_name, _, qualname = spec.partition(":")
        try:
            owner: Any = importlib.import_module(module_name)
            *path, attr = qualname.split(".")
            for part in path:
                owner = getattr(owner, part)
            if not hasattr(owner, attr):
                pending.append(spec)
                continue
            name = f"{module_name}.{qualname}"
            patches.replace(owner, attr, functools.partial(_timed_python, name=name, rec=rec))
        except Exception:  # noqa: BLE001 - not importable yet (e.g. __main__ still running)
            pending.append(spec)
    return pending
