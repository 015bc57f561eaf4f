"""Timing of torch.distributed collectives and point-to-point calls.

Every public collective and p2p function of ``torch.distributed`` is wrapped
(in both ``torch.distributed`` and ``distributed_c10d``). The ``*_object``
helpers are not wrapped themselves: the tensor collectives they make inside
c10d resolve to the wrappers and are recorded, in the same order on every
member. Each call records op, group, per-group sequence number, bytes and duration:

* CPU tensors (gloo): wall time inside the call; for ``async_op=True`` and
  ``isend``/``irecv``, until the Work's future completes.
* CUDA tensors: device time between two CUDA events recorded around the call on
  the current stream, read back by the sender thread (see :mod:`.cuda_timing`).

A call counts as entered the moment it is issued: its seq is taken before the call; a
synchronous one stays in ``Recorder.blocking`` until it returns, an async one (and each
DDP bucket all-reduce) in ``Recorder.in_flight`` until its future completes. The sender
reports the calls still there as entry markers (``dur_ns`` -1) for hang diagnosis.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from time import perf_counter_ns
from typing import Any

from .cuda_timing import CudaCommTimer
from .events import COMM
from .groups import GroupRegistry, GroupState
from .patching import Patches
from .recorder import Recorder


class P2P(Enum):
    NONE = 0
    SEND = 1
    RECV = 2


@dataclass(frozen=True)
class OpSpec:
    name: str
    byte_params: tuple[str, ...] = ()
    p2p: P2P = P2P.NONE
    always_async: bool = False
    recorded: str = ""  # the op name events carry; empty: ``name``
    delegates_to: str = ""  # an alias that calls this c10d function itself: not wrapped when it does

    @property
    def op(self) -> str:
        return self.recorded or self.name


OP_SPECS: tuple[OpSpec, ...] = (
    OpSpec("all_reduce", ("tensor",)),
    OpSpec("all_reduce_coalesced", ("tensors",)),
    OpSpec("all_gather", ("tensor",)),
    # torch 2.13: all_gather_single / reduce_scatter_single do the work (FSDP2 calls them);
    # all_gather_into_tensor, _all_gather_base and their reduce-scatter twins call them.
    # Events are named after the long-standing names, as the functional collectives are.
    OpSpec("all_gather_single", ("input_tensor",), recorded="all_gather_into_tensor"),
    OpSpec("all_gather_into_tensor", ("input_tensor",), delegates_to="all_gather_single"),
    OpSpec("_all_gather_base", ("input_tensor",), recorded="all_gather_into_tensor",
           delegates_to="all_gather_single"),
    OpSpec("all_gather_coalesced", ("input_tensor_list",)),
    OpSpec("reduce_scatter", ("input_list",)),
    OpSpec("reduce_scatter_single", ("input",), recorded="reduce_scatter_tensor"),
    OpSpec("reduce_scatter_tensor", ("input",), delegates_to="reduce_scatter_single"),
    OpSpec("_reduce_scatter_base", ("input",), recorded="reduce_scatter_tensor",
           delegates_to="reduce_scatter_single"),
    OpSpec("all_to_all", ("input_tensor_list",)),
    OpSpec("all_to_all_single", ("input",)),
    OpSpec("broadcast", ("tensor",)),
    OpSpec("reduce", ("tensor",)),
    OpSpec("gather", ("tensor",)),
    OpSpec("scatter", ("tensor",)),
    OpSpec("barrier"),
    OpSpec("monitored_barrier"),
    OpSpec("send", ("tensor",), P2P.SEND),
    OpSpec("recv", ("tensor",), P2P.RECV),
    OpSpec("isend", ("tensor",), P2P.SEND, always_async=True),
    OpSpec("irecv", ("tensor",), P2P.RECV, always_async=True),
)


def nbytes_of(value: Any) -> int:
    """Bytes of a tensor or a (nested) list of tensors; 0 for anything else."""
    if isinstance(value, (list, tuple)):
        return sum(nbytes_of(v) for v in value)
    try:
        return value.nbytes  # type: ignore[no-any-return]
    except AttributeError:
        return 0


@dataclass(frozen=True)
class _Params:
    """Positions of the parameters a wrapper reads, computed once from the signature."""

    group: int
    async_op: int
    peer: int
    group_peer: int
    byte_params: tuple[tuple[int, str], ...]

    @classmethod
    def of(cls, spec: OpSpec, fn: Callable) -> _Params:
        names = tuple(inspect.signature(fn).parameters)

        def index(name: str) -> int:
            return names.index(name) if name in names else -1

        peer = "dst" if spec.p2p is P2P.SEND else "src"
        return cls(index("group"), index("async_op"), index(peer), index("group_" + peer),
                   tuple((index(n), n) for n in spec.byte_params))


_Call = tuple[GroupState, int, int, bool]  # (group, seq, bytes, async) of a call being issued


def _arg(args: tuple, kwargs: dict, idx: int, name: str) -> Any:
    if 0 <= idx < len(args):
        return args[idx]
    return kwargs.get(name)


class CommTimer:
    """Builds the wrappers and records comm events."""

    def __init__(self, dist: Any, rec: Recorder, cuda: CudaCommTimer | None):
        self.dist = dist
        self.rec = rec
        self.registry = GroupRegistry(dist)
        self.cuda = cuda

    def install(self, patches: Patches) -> list[str]:
        from torch.distributed import distributed_c10d as c10d

        done = []
        for spec in OP_SPECS:
            if _delegates(c10d, spec):
                continue  # its call of the other function is recorded
            original = getattr(c10d, spec.name, None)
            if patches.replace(c10d, spec.name, functools.partial(self._wrap_for, spec)):
                done.append(spec.name)
                _remap_for_dynamo(original, getattr(c10d, spec.name), patches)
            if hasattr(self.dist, spec.name) and \
                    getattr(self.dist, spec.name, None) is not getattr(c10d, spec.name, None):
                patches.add_undo(self.dist, spec.name, getattr(self.dist, spec.name, None))
                setattr(self.dist, spec.name, getattr(c10d, spec.name))
        patches.replace(c10d, "destroy_process_group", self._wrap_destroy)
        if getattr(self.dist, "destroy_process_group", None) is not c10d.destroy_process_group:
            patches.add_undo(self.dist, "destroy_process_group", self.dist.destroy_process_group)
            self.dist.destroy_process_group = c10d.destroy_process_group
        return done

    def _wrap_for(self, spec: OpSpec, orig: Callable) -> Callable:
        return self.wrap(spec, orig)

    def _wrap_destroy(self, orig: Callable) -> Callable:
        @functools.wraps(orig)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            try:
                return orig(*args, **kwargs)
            finally:
                self.registry.reset()
        return destroy_process_group

    def wrap(self, spec: OpSpec, orig: Callable) -> Callable:
        params = _Params.of(spec, orig)
        if self.cuda is None and spec.p2p is P2P.NONE and not spec.always_async \
                and len(params.byte_params) == 1 and params.byte_params[0][0] >= 0 \
                and params.group >= 0 and params.async_op >= 0:
            return self._wrap_sync_cpu(spec, params, orig)
        rec = self.rec
        errors, enter, record = rec.errors, self._enter, self._record
        cuda_begin = self._cuda_begin
        op_name = spec.op

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ev = cuda_begin(spec, params, args, kwargs) if self.cuda is not None else None
            try:
                call = enter(spec, params, args, kwargs)
            except Exception as exc:  # noqa: BLE001
                errors.caught(op_name, exc)
                return orig(*args, **kwargs)
            t0 = perf_counter_ns()
            if call[3]:
                result = orig(*args, **kwargs)
            else:  # entered until it returns: the sender reports it if it does not
                rec.blocking = (op_name, call[0].ref, call[1], call[2], rec.step, t0)
                try:
                    result = orig(*args, **kwargs)
                finally:
                    rec.blocking = None
            t1 = perf_counter_ns()
            try:
                record(spec, call, result, t0, t1, ev)
            except Exception as exc:  # noqa: BLE001
                errors.caught(op_name, exc)
            return result

        return wrapper

    def _wrap_sync_cpu(self, spec: OpSpec, params: _Params, orig: Callable) -> Callable:
        """The common case on the hot path (one tensor, no CUDA, not p2p), inlined.

        A synchronous call records here with no further Python call: the group
        comes from the registry's cached default when none is given, and the
        event tuple goes straight into the recorder's buffer (the layout of
        :meth:`Recorder.comm`, a drop counted in the recorder's ``overflow``
        cell as there). Its seq and bytes are taken before the call, whose entry
        stays in ``rec.blocking`` until it returns (the sender reports a call that
        has not returned as entered). An async call takes the general path, which
        times it until its Work completes.
        """
        rec, registry, general = self.rec, self.registry, self._record
        name, group_idx, async_idx = spec.op, params.group, params.async_op
        (tensor_idx, tensor_name), = params.byte_params

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                n = len(args)
                if kwargs:
                    group = args[group_idx] if n > group_idx else kwargs.get("group")
                    is_async = args[async_idx] if n > async_idx else kwargs.get("async_op")
                    tensor: Any = args[tensor_idx] if n > tensor_idx else kwargs.get(tensor_name)
                else:
                    group = args[group_idx] if n > group_idx else None
                    is_async = n > async_idx and args[async_idx]
                    tensor = args[tensor_idx] if n > tensor_idx else None
                state = registry.default if group is None else None
                if state is None:
                    state = registry.resolve(group)
                seq = state.seq = state.seq + 1
                try:
                    nbytes = tensor.nbytes
                except AttributeError:
                    nbytes = nbytes_of(tensor)
            except Exception as exc:  # noqa: BLE001
                rec.errors.caught(name, exc)
                return orig(*args, **kwargs)
            if is_async:
                t0 = perf_counter_ns()
                result = orig(*args, **kwargs)
                try:
                    general(spec, (state, seq, nbytes, True), result, t0, perf_counter_ns(), None)
                except Exception as exc:  # noqa: BLE001
                    rec.errors.caught(name, exc)
                return result
            step = rec.step
            t0 = perf_counter_ns()
            rec.blocking = (name, state.ref, seq, nbytes, step, t0)
            try:
                result = orig(*args, **kwargs)
            finally:
                rec.blocking = None
            t1 = perf_counter_ns()
            try:  # zero-cost unless it raises: nothing of ours ever reaches the training loop
                events = rec.events
                if len(events) >= rec.capacity:
                    rec.overflow.value += 1
                events.append((COMM, name, state.ref, seq, nbytes, step, t0, t1 - t0))
            except Exception as exc:  # noqa: BLE001
                rec.errors.caught(name, exc)
            return result

        return wrapper

    def ddp_allreduce_hook(self) -> Callable[[Any, Any], Any]:
        """A DDP comm hook that times each gradient bucket's all-reduce.

        Same arithmetic as the stock ``allreduce_hook`` (divide by the group size,
        then sum), but it calls the process group directly instead of going through
        ``dist.all_reduce``: that Python function's checks cost the stock hook
        ~5% of a small CPU step, measured in-process (docs/collectors.md). The
        sequence number comes from the same per-group counters as every other
        collective; the event is recorded when the bucket's future completes, on
        the thread that completes it; until then the call is in ``rec.in_flight``
        (entered). Complex buffers take the stock path.
        """
        rec, registry, dist, cuda = self.rec, self.registry, self.dist, self.cuda
        in_flight = rec.in_flight

        def allreduce_bucket(process_group: Any, bucket: Any) -> Any:
            pg = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
            tensor = bucket.buffer()
            if tensor.is_complex():
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                return default_hooks.allreduce_hook(process_group, bucket)
            try:
                state = registry.resolve(process_group)
                tensor.div_(len(state.ref.ranks))
            except Exception as exc:  # noqa: BLE001 - the group cannot be described: plain path
                rec.errors.caught("ddp all_reduce", exc)
                tensor.div_(pg.size())
                return pg.allreduce([tensor]).get_future().then(_first_tensor)
            start = _cuda_start(cuda, tensor, rec)
            t0 = perf_counter_ns()
            fut = pg.allreduce([tensor]).get_future()
            seq = state.seq = state.seq + 1
            meta = ("all_reduce", state.ref, seq, tensor.nbytes, rec.step, t0)
            key = (state.ref, seq)
            in_flight[key] = meta  # entered when issued, until its future completes

            def done(completed: Any) -> Any:
                try:  # the stop event first: a pending CUDA pair stays an entry marker (cuda_timing)
                    _completed(rec, cuda, start, meta)
                    in_flight.pop(key, None)
                except Exception as exc:  # noqa: BLE001
                    rec.errors.caught("ddp all_reduce", exc)
                return completed.value()[0]

            return fut.then(done)

        import torch  # DDP checks a hook's annotations as objects, not as postponed strings
        allreduce_bucket.__annotations__ = {"process_group": Any, "bucket": dist.GradBucket,
                                            "return": torch.futures.Future[torch.Tensor]}
        return allreduce_bucket

    def _cuda_begin(self, spec: OpSpec, params: _Params, args: tuple, kwargs: dict) -> Any:
        if not params.byte_params:
            return None
        idx, name = params.byte_params[0]
        return _cuda_start(self.cuda, _arg(args, kwargs, idx, name), self.rec)

    def _enter(self, spec: OpSpec, params: _Params, args: tuple, kwargs: dict) -> _Call:
        """Group, sequence number, bytes and whether the call is async (before issuing it)."""
        if spec.p2p is P2P.NONE:
            group = args[params.group] if 0 <= params.group < len(args) else kwargs.get("group")
            state = self.registry.resolve(group)
        else:
            state = self._state(spec, params, args, kwargs)
        seq = self.registry.next_seq(state)
        nbytes = 0
        for idx, name in params.byte_params:
            value: Any = args[idx] if 0 <= idx < len(args) else kwargs.get(name)
            try:
                nbytes += value.nbytes
            except AttributeError:
                nbytes += nbytes_of(value)
        is_async = bool(spec.always_async or (args[params.async_op] if 0 <= params.async_op < len(args)
                                              else kwargs.get("async_op")))
        return state, seq, nbytes, is_async

    def _record(self, spec: OpSpec, call: _Call, result: Any, t0: int, t1: int, cuda_ev: Any) -> None:
        """One event: at completion for an async call (entered until then), from CUDA events, or now."""
        state, seq, nbytes, is_async = call
        rec = self.rec
        if is_async and result is not None and _on_completion(result, spec.op, state, seq, nbytes,
                                                              rec.step, t0, rec, self.cuda, cuda_ev):
            return
        if cuda_ev is not None:
            assert self.cuda is not None
            self.cuda.end(cuda_ev, (spec.op, state.ref, seq, nbytes, rec.step, t0))
            return
        rec.comm(spec.op, state.ref, seq, nbytes, rec.step, t0, t1 - t0)

    def _state(self, spec: OpSpec, params: _Params, args: tuple, kwargs: dict) -> GroupState:
        group = _arg(args, kwargs, params.group, "group")
        if spec.p2p is P2P.NONE:
            return self.registry.resolve(group)
        peer_name = "dst" if spec.p2p is P2P.SEND else "src"
        peer = _arg(args, kwargs, params.peer, peer_name)
        if peer is None:
            group_peer = _arg(args, kwargs, params.group_peer, "group_" + peer_name)
            if group_peer is not None:
                peer = self.dist.get_global_rank(group, group_peer)
        return self.registry.pair(group, peer, spec.p2p is P2P.SEND)


def _delegates(c10d: Any, spec: OpSpec) -> bool:
    """True if ``spec``'s function only calls ``spec.delegates_to`` of the same module
    (torch 2.13's aliases), which is wrapped instead: one event per call, not two."""
    if not spec.delegates_to or getattr(c10d, spec.delegates_to, None) is None:
        return False
    fn = inspect.unwrap(getattr(c10d, spec.name, None) or (lambda: None))
    code = getattr(fn, "__code__", None)
    return code is not None and spec.delegates_to in code.co_names


def _remap_for_dynamo(original: Any, wrapper: Any, patches: Patches) -> None:
    """Dynamo rewrites c10d's collectives into traceable functional ones by looking the
    function up in ``traceable_collective_remaps``: the wrapper gets its original's entry,
    so a compiled region calling ``dist.all_reduce`` is rewritten as before (no graph
    break of ours); its functional collective is then recorded by :mod:`.functional`."""
    try:
        from torch.distributed._functional_collectives import traceable_collective_remaps as remaps
    except Exception:  # noqa: BLE001 - no functional collectives in this torch
        return
    target = remaps.get(original)
    if target is None or wrapper in remaps:
        return
    remaps[wrapper] = target
    patches.add_callback(lambda: remaps.pop(wrapper, None))


def _first_tensor(completed: Any) -> Any:
    return completed.value()[0]


def _cuda_start(cuda: CudaCommTimer | None, tensor: Any, rec: Recorder) -> Any:
    """A start event on the current stream if ``tensor`` is on a GPU (else None); never raises."""
    if cuda is None:
        return None
    try:
        return cuda.begin(tensor)
    except Exception as exc:  # noqa: BLE001
        rec.errors.caught("cuda event", exc)
        return None


def _completed(rec: Recorder, cuda: CudaCommTimer | None, start: Any, meta: tuple) -> None:
    """A collective's completion callback: the stop event with a CUDA start event
    (the callback's current stream waits for the collective's kernels: device time,
    no wait on the host), else the host time since ``t0``."""
    if start is not None and cuda is not None:
        cuda.end(start, meta)
    else:
        op, ref, seq, nbytes, step, t0 = meta
        rec.comm(op, ref, seq, nbytes, step, t0, perf_counter_ns() - t0)


def _on_completion(work: Any, op: str, state: GroupState, seq: int, nbytes: int, step: int,
                   t0: int, rec: Recorder, cuda: CudaCommTimer | None = None,
                   cuda_ev: Any = None) -> bool:
    """Record the comm event when an async Work completes (:func:`_completed`);
    False if it has no future."""
    try:
        fut = work.get_future()
    except Exception:  # noqa: BLE001 - some backends/ops have no future
        return False
    ref = state.ref
    key = (ref, seq)
    rec.in_flight[key] = (op, ref, seq, nbytes, step, t0)  # entered when issued, until it completes

    def done(_fut: Any) -> None:
        try:  # the stop event first: a pending CUDA pair stays an entry marker (cuda_timing)
            _completed(rec, cuda, cuda_ev, (op, ref, seq, nbytes, step, t0))
            rec.in_flight.pop(key, None)
        except Exception as exc:  # noqa: BLE001
            rec.errors.caught(op, exc)

    fut.add_done_callback(done)
    return True
