"""Functional collectives (``torch.ops._c10d_functional``): DTensor, tensor parallel, compiled graphs.

``torch.distributed._functional_collectives`` (what DTensor's redistribution and
tensor parallel call), their autograd backward formulas and the code Inductor
generates for a compiled model all reach c10d through the dispatcher ops
``_c10d_functional.*`` (C++), never through the Python c10d functions that
:mod:`.comm` wraps. These ops are async: an op returns a tensor whose collective
is still running, and ``_c10d_functional.wait_tensor`` waits for it.

How they are seen: a Python kernel is registered for each op at the
``BackendSelect`` dispatch key (just above the backend kernels; every real tensor's
call passes there, including the waits an ``AsyncCollectiveTensor`` issues inside
its ``__torch_dispatch__``), records and redispatches to the original kernel
below. Fake and functional tensors of tracing (Dynamo, AOTAutograd) do not reach
it as plain tensors and are not recorded, so compiling a model sees nothing and
changes nothing in its graphs; the compiled code's own calls are recorded when it
runs. Each collective:

* at issue: the group (from its ``group_name``), a sequence number from the same
  per-group counters as every other collective, bytes of its input, its start
  time; it is entered (``Recorder.in_flight``) until waited for;
* at ``wait_tensor`` on its output: one comm event, duration = issue to the end of
  the wait (the host's view: the collective plus whatever the thread did before
  waiting, which is how the training thread experiences it). On a GPU (NCCL) the
  wait only makes the current stream wait: a CUDA event pair (start recorded at
  issue, stop after the wait) gives the device time instead, read back by the
  sender thread without synchronizing (:mod:`.cuda_timing`).

A collective whose output is never waited for stays entered; the table of
pending outputs is bounded (``MAX_PENDING``), the oldest forgotten and counted
as an error beyond it. Removing the kernels (:meth:`FunctionalTimer.remove`)
restores the dispatcher's table.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from .cuda_timing import CudaCommTimer
from .events import COMM, GroupRef
from .groups import GroupRegistry
from .recorder import Recorder

NAMESPACE = "_c10d_functional"
# op -> recorded name (the in-place and out= forms Inductor emits share the eager op's name)
OPS: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "all_reduce_coalesced_": "all_reduce_coalesced",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_into_tensor_out": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_out": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
WAIT = "wait_tensor"
MAX_PENDING = 4096


class _Pending:
    """One issued functional collective, until its first output is waited for."""

    __slots__ = ("meta", "key", "done", "cuda_start")

    def __init__(self, meta: tuple, key: tuple[GroupRef, int], cuda_start: Any = None):
        self.meta = meta  # (op, group, seq, bytes, step, t0)
        self.key = key
        self.done = False
        self.cuda_start = cuda_start  # a CUDA start event (NCCL): device time, not host time


def _nbytes(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    try:
        return int(value.nbytes)
    except AttributeError:
        return 0


class FunctionalTimer:
    """Registers the recording kernels; one instance per collector."""

    def __init__(self, torch: Any, rec: Recorder, registry: GroupRegistry, cuda: CudaCommTimer | None = None):
        self.torch = torch
        self.rec = rec
        self.registry = registry
        self.cuda = cuda
        self._lib: Any = None
        # the address of an output's storage -> its collective: the wait may come on a view of
        # the output (an AsyncCollectiveTensor viewed before use waits on the view), as c10d's
        # own registry of functional collectives keys their works by storage too
        self._pending: dict[int, _Pending] = {}
        self.installed: list[str] = []

    def install(self) -> list[str]:
        torch = self.torch
        from torch.distributed import _functional_collectives  # noqa: F401 - registers the ops' Python parts

        ops = getattr(torch.ops, NAMESPACE)
        lib = torch.library.Library(NAMESPACE, "IMPL")
        self._lib = lib
        below = torch._C.DispatchKey.BackendSelect
        for op_name, recorded in OPS.items():
            try:
                overload = getattr(ops, op_name).default
            except (AttributeError, RuntimeError):
                continue  # an op this torch does not have
            lib.impl(op_name, self._issue_kernel(overload, recorded, below), "BackendSelect", with_keyset=True)
            self.installed.append(op_name)
        wait = ops.wait_tensor.default
        lib.impl(WAIT, self._wait_kernel(wait, below), "BackendSelect", with_keyset=True)
        return self.installed

    def remove(self) -> None:
        lib, self._lib = self._lib, None
        if lib is not None:
            lib._destroy()
        self._pending.clear()

    # -- kernels ----------------------------------------------------------------------------
    def _issue_kernel(self, overload: Any, recorded: str, below: Any) -> Callable[..., Any]:
        rec, pending, plain, cuda = self.rec, self._pending, self.torch.Tensor, self.cuda
        state_of = self.registry.resolve_name
        args_schema = overload._schema.arguments
        names = [a.name for a in args_schema]
        group_idx = names.index("group_name") if "group_name" in names else -1
        redispatch = overload.redispatch

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else None
            probe = first[0] if isinstance(first, (list, tuple)) and first else first
            if type(probe) is not plain:  # tracing (fake/functional tensors): nothing to time
                return redispatch(keyset.remove(below), *args, **kwargs)
            try:
                group = args[group_idx] if 0 <= group_idx < len(args) else kwargs.get("group_name")
                state = state_of(group)
                seq = state.seq = state.seq + 1
                t0 = perf_counter_ns()
                meta = (recorded, state.ref, seq, _nbytes(first), rec.step, t0)
                start = cuda.begin(probe) if cuda is not None else None
            except Exception as exc:  # noqa: BLE001 - never into the training loop
                rec.errors.caught(recorded, exc)
                return redispatch(keyset.remove(below), *args, **kwargs)
            out = redispatch(keyset.remove(below), *args, **kwargs)
            try:
                key = (state.ref, seq)
                rec.in_flight[key] = meta  # entered until waited for
                entry = _Pending(meta, key, start)
                if len(pending) >= MAX_PENDING:
                    _forget_oldest(pending, rec)
                if isinstance(out, (list, tuple)):
                    for t in out:
                        pending[t.untyped_storage().data_ptr()] = entry
                else:
                    pending[out.untyped_storage().data_ptr()] = entry
            except Exception as exc:  # noqa: BLE001
                rec.errors.caught(recorded, exc)
            return out

        return kernel

    def _wait_kernel(self, overload: Any, below: Any) -> Callable[..., Any]:
        rec, pending, plain, cuda = self.rec, self._pending, self.torch.Tensor, self.cuda
        redispatch = overload.redispatch

        def wait_tensor(keyset: Any, tensor: Any) -> Any:
            out = redispatch(keyset.remove(below), tensor)
            if type(tensor) is not plain or not pending:
                return out
            try:
                entry = pending.pop(tensor.untyped_storage().data_ptr(), None)
                if entry is not None and not entry.done:
                    entry.done = True
                    rec.in_flight.pop(entry.key, None)
                    if entry.cuda_start is not None and cuda is not None:
                        # the current stream now waits for the collective: its stop event
                        cuda.end(entry.cuda_start, entry.meta)
                        return out
                    op, ref, seq, nbytes, step, t0 = entry.meta
                    events = rec.events
                    if len(events) >= rec.capacity:
                        rec.overflow.value += 1
                    events.append((COMM, op, ref, seq, nbytes, step, t0, perf_counter_ns() - t0))
            except Exception as exc:  # noqa: BLE001
                rec.errors.caught(WAIT, exc)
            return out

        return wait_tensor



def _forget_oldest(pending: dict[int, _Pending], rec: Recorder) -> None:
    oldest = next(iter(pending))
    entry = pending.pop(oldest)
    rec.in_flight.pop(entry.key, None)
    rec.errors.caught(WAIT, OverflowError(f"more than {MAX_PENDING} functional collectives not waited for"))
