"""Functional collectives (``torch.ops._c10d_functional``): DTensor, tensor parallel, compiled graphs.

``torch.distributed._functional_collectives`` (what DTensor's redistribution and
tensor parallel call), their autograd backward formulas and the code a compiled
model runs all reach c10d through the dispatcher ops ``_c10d_functional.*``,
never through the Python c10d functions that :mod:`.comm` wraps. These ops are
async: an op returns a tensor whose collective is still running, and
``_c10d_functional.wait_tensor`` waits for it.

How they are seen (two routes, the same record):

* **the ops' Python entry points** (the default where torch has them; 2.13 does): a
  Python caller reaches an op through its ``OpOverload``/``OpOverloadPacket`` object,
  whose ``__call__`` calls the object's ``_op`` (the C++ entry). That attribute is
  replaced, on these ops' objects only, by a hook that records and calls the original.
  The ``_functional_collectives`` API (DTensor, tensor parallel, MoE's all-to-all), torch
  2.13's autograd formulas of these ops (Python), the waits an ``AsyncCollectiveTensor``
  issues and the graphs a compiled model runs (FX's and Inductor's Python wrapper code
  call the op objects) all pass there. The hook stands in for the original (same hash,
  its other attributes forwarded): the op objects keep their identity and type for
  Dynamo, FX and Inductor. Not seen on this route: calls from C++ (TorchScript, Inductor's
  ``cpp_wrapper``, AOTInductor, the C++ autograd formulas of torch releases before the
  Python ones).
* **dispatcher kernels** (the fallback where the op objects do not call ``_op``, or on
  request): a Python kernel per op at the ``BackendSelect`` dispatch key (just above the
  backend kernels; every real tensor's call passes there, C++ callers' too), which
  records and redispatches below. It sees everything, at about four times the cost: the
  dispatcher's call into Python and the redispatch back, per op.

On both routes only plain tensors are recorded: the fake and functional tensors of
tracing (Dynamo, AOTAutograd) pass straight through, so compiling a model records
nothing and changes nothing in its graphs; the compiled code's own calls are recorded
when it runs. A mode active at run time that calls the op again from inside the call
(a TorchDispatchMode, a TorchFunctionMode) does not record it twice. Each collective:

* at issue: the group (from its ``group_name``, looked up in the registry's cache), a
  sequence number from the same per-group counters as every other collective, bytes of
  its input, its start time; it is entered until waited for (the recorder's entry
  markers, read by the sender thread from the table of pending outputs: :meth:`entered`);
* at ``wait_tensor`` on its output: one comm event, duration = issue to the end of
  the wait (the host's view: the collective plus whatever the thread did before
  waiting, which is how the training thread experiences it). On a GPU (NCCL) the
  wait only makes the current stream wait: a CUDA event pair (start recorded at
  issue, stop after the wait) gives the device time instead, read back by the
  sender thread without synchronizing (:mod:`.cuda_timing`).

A collective whose output is never waited for stays entered; the table of pending
outputs is bounded (``MAX_PENDING``), the oldest forgotten and counted as an error
beyond it.

Sampling (``sample`` n > 1, ``PERFTRACKER_COLLECTOR_FUNCTIONAL_SAMPLE``): only the
collectives whose seq is a multiple of n are recorded as above, the same ones on every rank
of the group; the others are numbered (the group's sequence stays whole) and nothing more:
no event, no entry marker, no size. The default (1) records every one.

Step gating (``steps`` n > 1, ``PERFTRACKER_COLLECTOR_FUNCTIONAL_STEPS``; the Python route):
the hooks are in the op objects only during the steps whose number is a multiple of n
(iteration numbers are the same on every rank: :mod:`.iteration`), and during the steps
before the loop's pattern is known; on the other steps the op objects hold their original
``_op`` and a collective costs nothing at all. The switch is made by a step listener on the
training thread (a few dozen attribute writes per switch). The wait's hook stays in until
the collectives still pending have been waited for. When the hooks go back in, each
group's counter is brought up to the process group's own sequence number
(``_get_sequence_number_for_group``, which c10d advances for every collective of the group,
functional ones included), so the numbers stay those of the same collectives on every
member, whatever each rank's counters missed while the hooks were out. Evidence lost: the
collectives of the steps left out (no events, no entry markers: a hang that starts in such a
step is seen from the stalled step, the stack samples and the Flight Recorder, not from a
pending functional collective). Each batch says ``functional_steps``
(:attr:`.batch.BatchBuilder.functional_steps`): the stream judges the rank on its recorded
steps only, so waits inside a function that encloses unseen collectives are not read as its
own time (docs/collectors.md, "Cost"). Removing the hooks (:meth:`FunctionalTimer.remove`)
restores the op objects and the dispatcher's table.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from .cuda_timing import CudaCommTimer
from .events import COMM
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
# the autograd-enabled variants (their implementation calls the ops above from C++: seen on
# the Python route only through their own objects)
AUTOGRAD_NAMESPACE = "_c10d_functional_autograd"
AUTOGRAD_OPS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
WAIT = "wait_tensor"
MAX_PENDING = 4096
# a wait on a view of an output looks for it among the newest pending outputs this many deep
# (the cost of a wait that ends none stays bounded however many are pending)
VIEW_SCAN = 64

PYTHON = "python"
DISPATCHER = "dispatcher"


def _nbytes(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    try:
        return int(value.nbytes)
    except AttributeError:
        return 0


def python_route_available(torch: Any) -> bool:
    """Whether this torch's op objects call their ``_op`` attribute (the Python route)."""
    try:
        ops = torch._ops
        return all("_op" in cls.__call__.__code__.co_names for cls in (ops.OpOverload, ops.OpOverloadPacket))
    except AttributeError:
        return False


class _Hook(functools.partial):
    """Stands in for an op object's ``_op`` (the C++ entry its ``__call__`` calls): a partial
    of the recording function, called as directly as the original (no Python ``__call__`` in
    between). It hashes as the original (an ``OpOverload`` hashes as its ``_op``: the dicts
    and sets torch keys by op keep finding it) and forwards every other attribute to it."""

    orig: Callable[..., Any]  # the original ``_op`` (in the instance's dict)
    is_wait: bool  # the hook of ``wait_tensor`` (step gating keeps it in while outputs are pending)

    def __hash__(self) -> int:
        return hash(self.__dict__["orig"])

    def __getattr__(self, name: str) -> Any:
        try:
            orig = self.__dict__["orig"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(orig, name)

    def __repr__(self) -> str:
        return repr(self.__dict__.get("orig"))


class FunctionalTimer:
    """Installs the recording hooks; one instance per collector.

    ``route``: ``"python"``, ``"dispatcher"`` or None (the Python route where this torch
    has it, else the dispatcher's). ``sample``: record one collective in ``sample`` of each
    group (seq a multiple of it; the others are only numbered); 1, the default, records all.
    ``steps``: on the Python route, hooks in only during one step in ``steps`` (module
    docstring, "Step gating"); 1, the default, every step."""

    def __init__(self, torch: Any, rec: Recorder, registry: GroupRegistry, cuda: CudaCommTimer | None = None,
                 route: str | None = None, sample: int = 1, steps: int = 1):
        self.torch = torch
        self.rec = rec
        self.registry = registry
        self.cuda = cuda
        # 1 = every collective recorded; n = those whose seq is a multiple of n (the same ones
        # on every rank of the group): the others are numbered only (no event, no entry marker)
        self.sample = max(int(sample), 1)
        self.route = route or (PYTHON if python_route_available(torch) else DISPATCHER)
        self.steps = max(int(steps), 1) if self.route == PYTHON else 1
        self._issue_hooks_in = True  # the issue hooks are in the op objects (step gating)
        self._wait_hooks_in = True
        self._lib: Any = None
        self._hooked: list[tuple[Any, Any, _Hook]] = []  # (op object, its original _op, our hook)
        self._builtins: list[int] = []  # ids of hooks registered as TorchScript builtins
        # Pending collectives, until their (first) output is waited for. A new output timed on
        # the host (the common case): in issue order, ``(COMM, op, group, seq, bytes, step,
        # t0, the output)`` (its event less the duration, then the output, held: c10d's
        # registry of functional collectives holds it until the wait too); a wait on the oldest
        # one (the common case: waits come in issue order) is one identity check, any other
        # is looked for by identity, the newest first. The rest (on a GPU; coalesced, in-place
        # and out= forms): by the address of each output's storage, ``(that event, the CUDA
        # start event or None, the addresses of a coalesced collective's outputs or None)``. A
        # wait on a view of an output (an AsyncCollectiveTensor viewed before use waits on the
        # view) finds it by its storage.
        self._pending: deque[tuple] = deque()
        self._special: dict[int, tuple] = {}
        self.installed: list[str] = []

    def install(self) -> list[str]:
        torch = self.torch
        from torch.distributed import _functional_collectives  # noqa: F401 - registers the ops' Python parts

        ops = getattr(torch.ops, NAMESPACE)
        wanted: list[tuple[str, str, Any]] = []  # (op name, recorded name, overload)
        for op_name, recorded in OPS.items():
            try:
                wanted.append((op_name, recorded, getattr(ops, op_name).default))
            except (AttributeError, RuntimeError):
                continue  # an op this torch does not have
        wait = ops.wait_tensor.default
        self.rec.marker_sources.append(self.entered)
        if self.route == PYTHON:
            self._install_python(wanted, wait)
        else:
            self._install_dispatcher(wanted, wait)
        if self.steps > 1:
            self.rec.add_step_listener(self.on_step)
        return self.installed

    # -- step gating (the Python route) -------------------------------------------------------
    def on_step(self, step: int) -> None:
        """At each new iteration (training thread): hooks in for a recorded step (a multiple of
        ``steps``, or not yet known), out for the others."""
        try:
            if step < 0 or step % self.steps == 0:
                if not self._issue_hooks_in:
                    self._switch(issue=True, wait=True)
                    self.registry.catch_up()  # the numbers of the collectives not seen
            elif self._issue_hooks_in or self._wait_hooks_in:
                # the wait's hook stays while collectives of a recorded step are still pending
                self._switch(issue=False, wait=bool(self._pending or self._special))
        except Exception as exc:  # noqa: BLE001 - never into the training loop
            self.rec.errors.caught("functional steps", exc)

    def _switch(self, issue: bool, wait: bool) -> None:
        """Each hook in or out (unless torch replaced the op object's ``_op`` since): a plain
        attribute read and write per op object, a few dozen per switch."""
        for obj, orig, hook in self._hooked:
            if wait if hook.is_wait else issue:
                if obj._op is orig:
                    obj._op = hook
            elif obj._op is hook:
                obj._op = orig
        self._issue_hooks_in, self._wait_hooks_in = issue, wait

    def remove(self) -> None:
        hooked, self._hooked = self._hooked, []
        for obj, orig, hook in hooked:
            if obj.__dict__.get("_op") is hook:  # unless torch replaced it since (a refreshed packet)
                obj._op = orig
        if self._builtins:
            try:
                from torch.jit import _builtins
                table = _builtins._get_builtin_table()
                for key in self._builtins:
                    table.pop(key, None)
            except Exception:  # noqa: BLE001 - removal never raises
                pass
            self._builtins = []
        lib, self._lib = self._lib, None
        if lib is not None:
            lib._destroy()
        if self.entered in self.rec.marker_sources:
            self.rec.marker_sources.remove(self.entered)
        self.rec.remove_step_listener(self.on_step)
        self._pending.clear()
        self._special.clear()

    def entered(self, now_ns: int, min_age_ns: int) -> list[tuple]:
        """Entry markers (``dur_ns`` -1) of the collectives issued at least ``min_age_ns`` ago
        and not waited for (sender thread; a marker source of the recorder)."""
        issued = [entry[:7] for entry in list(self._pending)]
        seen = set()
        for entry in list(self._special.values()):
            if id(entry) not in seen:  # a coalesced collective is there once per output
                seen.add(id(entry))
                issued.append(entry[0])
        return [ev + (-1,) for ev in issued if now_ns - ev[6] >= min_age_ns]

    # -- the Python route ---------------------------------------------------------------------
    def _install_python(self, wanted: list[tuple[str, str, Any]], wait: Any) -> None:
        for op_name, recorded, overload in wanted:
            self._hook_op(overload, functools.partial(self._issue_call, overload, recorded))
            self.installed.append(op_name)
        try:
            autograd_ops = getattr(self.torch.ops, AUTOGRAD_NAMESPACE)
            for op_name in AUTOGRAD_OPS:
                overload = getattr(autograd_ops, op_name).default
                self._hook_op(overload, functools.partial(self._issue_call, overload, op_name))
                self.installed.append(f"{AUTOGRAD_NAMESPACE}.{op_name}")
        except (AttributeError, RuntimeError):
            pass  # no autograd variants in this torch
        self._hook_op(wait, self._wait_call, is_wait=True)

    def _hook_op(self, overload: Any, make: Callable[[Callable[..., Any]], Callable[..., Any]],
                 is_wait: bool = False) -> None:
        """Hooks the overload's object and, where it has no other overload, its packet's
        (whose call then resolves to this overload)."""
        objects = [overload]
        packet = overload.overloadpacket
        if list(packet.overloads()) == ["default"]:
            objects.append(packet)
        for obj in objects:
            orig = obj._op
            hook = _Hook(make(orig))
            hook.orig = orig
            hook.is_wait = is_wait
            for name in ("__module__", "__name__", "__qualname__", "__doc__"):  # else the class's
                if hasattr(orig, name):
                    setattr(hook, name, getattr(orig, name))
            obj._op = hook
            self._hooked.append((obj, orig, hook))
            self._register_builtin(hook, orig)

    def _register_builtin(self, hook: _Hook, orig: Any) -> None:
        """TorchScript resolves an op packet by its ``_op``'s identity: ours maps to the same name."""
        try:
            from torch.jit import _builtins
            name = _builtins._find_builtin(orig)
            if name is not None:
                _builtins._register_builtin(hook, name)
                self._builtins.append(id(hook))
        except Exception:  # noqa: BLE001 - TorchScript's table is optional
            pass

    # -- the dispatcher route -------------------------------------------------------------------
    def _install_dispatcher(self, wanted: list[tuple[str, str, Any]], wait: Any) -> None:
        lib = self.torch.library.Library(NAMESPACE, "IMPL")
        self._lib = lib
        below = self.torch._C.DispatchKey.BackendSelect
        for op_name, recorded, overload in wanted:
            kernel = self._kernel(overload, functools.partial(self._issue_call, overload, recorded), below)
            lib.impl(op_name, kernel, "BackendSelect", with_keyset=True)
            self.installed.append(op_name)
        lib.impl(WAIT, self._kernel(wait, self._wait_call, below), "BackendSelect", with_keyset=True)

    @staticmethod
    def _kernel(overload: Any, make: Callable[[Callable[..., Any]], Callable[..., Any]], below: Any) -> Callable[..., Any]:
        """A kernel calling the recording function made for "redispatch below us" (one per
        key set seen: a handful)."""
        redispatch = overload._handle.redispatch_boxed
        by_keys: dict[int, Callable[..., Any]] = {}

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            raw = keyset.raw_repr()
            call = by_keys.get(raw)
            if call is None:
                call = by_keys[raw] = make(functools.partial(redispatch, keyset.remove(below)))
            return call(*args, **kwargs)

        return kernel

    # -- the recording functions (both routes; ``orig`` calls the op) --------------------------
    # The common case, one new output timed on the host, takes a path of its own with no
    # further Python call; every other case (on a GPU, the coalesced, in-place and out= forms)
    # the general one. ``orig(*args)`` unless there are keywords: no dict is built per call.
    #
    # Re-entry: a mode active at run time (a TorchDispatchMode's ``__torch_dispatch__``, a
    # TorchFunctionMode's ``__torch_function__``, AOTAutograd's aliasing check on a compiled
    # graph's first run) calls the op object again from inside the call, with the same plain
    # tensors. The innermost call records; an outer one sees its group's sequence number moved
    # during its call and records nothing. So the number is taken when the op has returned
    # (nothing else runs on the thread in between); the start time before the call.
    def _issue_call(self, overload: Any, recorded: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        schema = overload._schema
        listed = str(schema.arguments[0].type).startswith("List")  # coalesced: a list of tensors
        fresh = all(r.alias_info is None for r in schema.returns)  # not an in-place or out= form
        general = self._issue_general(overload, recorded, orig, listed)
        if listed or not fresh or self.cuda is not None:
            return general
        rec, pending, plain, sample = self.rec, self._pending, self.torch.Tensor, self.sample
        append, forget = pending.append, self._forget_oldest_pending
        # the registry's cache of group names (cleared in place by its reset): a dict lookup
        # per call, the registry on a miss (a group's first collective); keywords and
        # tracing's tensors take the general path (which records the same event)
        names, resolve_name = self.registry._names, self.registry.resolve_name
        arg_names = [a.name for a in schema.arguments]
        group_idx = arg_names.index("group_name") if "group_name" in arg_names else len(arg_names)

        def miss(args: tuple, kwargs: dict) -> Any:
            try:
                if not kwargs and type(args[0]) is plain:
                    group = args[group_idx]
                    resolve_name(group)  # now in the cache
                    if group in names:
                        return issue(*args)
            except Exception:  # noqa: BLE001 - the general path counts it
                pass
            return general(*args, **kwargs)

        # As little code as the record allows: what runs here runs between two calls into
        # torch's C++, which leave little of it in the CPU's caches (an instruction not run
        # costs less than its count: a cache miss it does not take).
        def issue(*args: Any, **kwargs: Any) -> Any:
            try:
                state = names[args[group_idx]]
                first = args[0]
            except Exception:  # noqa: BLE001 - a new group, keywords: the slower paths
                return miss(args, kwargs)
            if kwargs or type(first) is not plain:  # tracing (fake/functional tensors) included
                return general(*args, **kwargs)
            last = state.seq
            if (last + 1) % sample:  # not sampled: numbered only
                out = orig(*args)
                if state.seq == last:
                    state.seq = last + 1
                return out
            t0 = perf_counter_ns()
            out = orig(*args)
            try:
                if state.seq == last:  # else recorded by a re-entered call
                    seq = state.seq = last + 1
                    if len(pending) >= MAX_PENDING:
                        forget()
                    append((COMM, recorded, state.ref, seq, first.nbytes, rec.step, t0, out))
            except Exception as exc:  # noqa: BLE001 - never into the training loop
                rec.errors.caught(recorded, exc)
            return out

        return issue

    def _forget_oldest_pending(self) -> None:
        self._pending.popleft()
        self.rec.errors.caught(WAIT, OverflowError(f"more than {MAX_PENDING} functional collectives not waited for"))

    def _issue_general(self, overload: Any, recorded: str, orig: Callable[..., Any], listed: bool) -> Callable[..., Any]:
        rec, special, plain, cuda, sample = self.rec, self._special, self.torch.Tensor, self.cuda, self.sample
        resolve_name = self.registry.resolve_name
        arg_names = [a.name for a in overload._schema.arguments]
        first_name = arg_names[0]
        group_idx = arg_names.index("group_name") if "group_name" in arg_names else len(arg_names)

        def issue_general(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else kwargs.get(first_name)
            probe = (first[0] if first else None) if listed else first
            if type(probe) is not plain:
                return orig(*args, **kwargs)
            try:
                group = args[group_idx] if len(args) > group_idx else kwargs.get("group_name")
                state = resolve_name(group)
                last = state.seq
                skip = (last + 1) % sample  # not sampled: numbered only
                t0 = 0 if skip else perf_counter_ns()
                start = cuda.begin(probe) if cuda is not None and not skip else None
            except Exception as exc:  # noqa: BLE001
                rec.errors.caught(recorded, exc)
                return orig(*args, **kwargs)
            out = orig(*args, **kwargs)
            if skip:
                if state.seq == last:
                    state.seq = last + 1
                return out
            try:
                if state.seq != last:  # recorded by a re-entered call
                    return out
                seq = state.seq = last + 1
                ev = (COMM, recorded, state.ref, seq, _nbytes(first), rec.step, t0)
                if len(special) >= MAX_PENDING:
                    _forget_oldest(special, rec)
                if listed:  # one collective, several outputs: the first one waited for ends it
                    ptrs = tuple(t.untyped_storage().data_ptr() for t in out)
                    entry = (ev, start, ptrs)
                    for ptr in ptrs:
                        special[ptr] = entry
                else:
                    special[out.untyped_storage().data_ptr()] = (ev, start, None)
            except Exception as exc:  # noqa: BLE001
                rec.errors.caught(recorded, exc)
            return out

        return issue_general

    def _wait_call(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        rec, pending, special, rest = self.rec, self._pending, self._special, self._wait_rest
        popleft = pending.popleft

        def wait_tensor(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs) if kwargs else orig(*args)
            if pending:
                end_ns = perf_counter_ns()
                try:
                    tensor = args[0] if args else kwargs["tensor"]
                    entry = pending[0]
                    if entry[7] is not tensor:  # not the oldest output itself
                        rest(tensor, end_ns)
                        return out
                    popleft()
                    _, op, ref, seq, nbytes, step, t0, _ = entry
                    events = rec.events
                    if len(events) >= rec.capacity:
                        rec.overflow.value += 1
                    events.append((COMM, op, ref, seq, nbytes, step, t0, end_ns - t0))
                except Exception as exc:  # noqa: BLE001
                    rec.errors.caught(WAIT, exc)
            elif special:
                try:
                    rest(args[0] if args else kwargs["tensor"], perf_counter_ns())
                except Exception as exc:  # noqa: BLE001
                    rec.errors.caught(WAIT, exc)
            return out

        return wait_tensor

    def _wait_rest(self, tensor: Any, end_ns: int) -> None:
        """The waits the common case does not end: on another pending output than the oldest,
        on a view of an output, on a GPU, of a coalesced, in-place or out= form (or of no
        collective of ours)."""
        if type(tensor) is not self.torch.Tensor:  # tracing's fake and functional tensors
            return
        rec, pending, special = self.rec, self._pending, self._special
        for index in range(len(pending) - 1, -1, -1):  # the output itself, the newest first
            if pending[index][7] is tensor:
                entry = pending[index]
                del pending[index]
                _record(rec, entry, end_ns)
                return
        ptr = tensor.untyped_storage().data_ptr()
        special_entry = special.pop(ptr, None)
        if special_entry is None:  # a view of an output (an AsyncCollectiveTensor viewed before use)
            newest = len(pending) - 1
            for index in range(newest, max(newest - VIEW_SCAN, -1), -1):
                if pending[index][7].untyped_storage().data_ptr() == ptr:
                    entry = pending[index]
                    del pending[index]
                    _record(rec, entry, end_ns)
                    return
            return
        ev, start, ptrs = special_entry
        if ptrs is not None:  # a coalesced collective: its later outputs' waits record nothing
            for other in ptrs:
                if special.get(other) is special_entry:
                    del special[other]
        if start is not None and self.cuda is not None:
            # the current stream now waits for the collective: its stop event
            self.cuda.end(start, ev[1:])
        else:
            _record(rec, ev, end_ns)


def _record(rec: Recorder, ev: tuple, end_ns: int) -> None:
    """Records a pending collective's event (``ev``: its first seven fields) ended at ``end_ns``."""
    _, op, ref, seq, nbytes, step, t0 = ev[:7]
    rec.comm(op, ref, seq, nbytes, step, t0, end_ns - t0)


def _forget_oldest(table: dict[int, tuple], rec: Recorder) -> None:
    oldest = next(iter(table))
    entry = table.pop(oldest)
    for ptr in entry[2] or ():  # a coalesced collective's other outputs
        if table.get(ptr) is entry:
            del table[ptr]
    rec.errors.caught(WAIT, OverflowError(f"more than {MAX_PENDING} functional collectives not waited for"))
