"""Functional collectives (DTensor, tensor parallel, compiled graphs), torch 2.13's
``all_gather_single``/``reduce_scatter_single`` (FSDP2), DeviceMesh coordinates and dim names,
on a real one-rank gloo group. The functional collectives on both routes of
``collectors/functional.py``: the ops' Python entry points (the default) and the dispatcher's
kernels (the fallback)."""

import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from perftracker_ml.collectors import functional as functional_module
from perftracker_ml.collectors.comm import CommTimer
from perftracker_ml.collectors.events import COMM
from perftracker_ml.collectors.functional import FunctionalTimer
from perftracker_ml.collectors.groups import group_ref, mesh_dim_of
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.mesh import coordinates_of, install_mesh
from perftracker_ml.collectors.patching import Patches
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget

ROUTES = ["python", "dispatcher"]


def _timers(route=None):
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    patches = Patches()
    comm = CommTimer(dist, rec, None)
    comm.install(patches)
    functional = FunctionalTimer(torch, rec, comm.registry, route=route)
    functional.install()
    return rec, patches, functional


def _comms(rec):
    return [e for e in rec.drain(1000) if e[0] == COMM]


def _entered(rec):
    """The (op, seq) of the collectives entered and not completed (the sender's markers)."""
    return [(m[1], m[3]) for m in rec.in_flight_markers(time.perf_counter_ns() + 1, 0)]


def test_the_python_route_is_the_default_on_this_torch():
    assert FunctionalTimer(torch, Recorder(10, IterationDetector(), ErrorBudget()), None).route == "python"


@pytest.mark.parametrize("route", ROUTES)
def test_functional_collective_recorded_at_its_wait_in_the_group_sequence(world_of_one, route):
    rec, patches, functional = _timers(route)
    try:
        dist.all_reduce(torch.ones(2))  # eager: seq 0 of the default group
        out = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)  # issued: entered, not recorded yet
        assert _entered(rec) == [("all_reduce", 1)]
        assert [e[3] for e in _comms(rec)] == [0]
        (out.view(2, 2) + 1).sum()  # waited on a view of the output (AsyncCollectiveTensor)
        events = _comms(rec)
        assert [(e[1], e[3], e[4]) for e in events] == [("all_reduce", 1, 16)]
        assert events[0][2] == functional.registry.resolve(None).ref and events[0][7] >= 0
        assert _entered(rec) == [] and rec.errors.count == 0
        gathered = funcol.all_gather_tensor(torch.ones(3), 0, dist.group.WORLD)
        funcol.wait_tensor(gathered)
        funcol.wait_tensor(gathered)  # a second wait records nothing
        assert [(e[1], e[3], e[4]) for e in _comms(rec)] == [("all_gather_into_tensor", 2, 12)]
        funcol.wait_tensor(funcol.all_to_all_single(torch.ones(4), None, None, dist.group.WORLD))  # MoE
        dist.all_to_all_single(torch.empty(4), torch.ones(4))
        assert [(e[1], e[3]) for e in _comms(rec)] == [("all_to_all_single", 3), ("all_to_all_single", 4)]
    finally:
        functional.remove()
        patches.undo()
    funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD))
    assert _comms(rec) == [] and rec.marker_sources == []  # the hooks are gone


@pytest.mark.parametrize("route", ROUTES)
def test_sampled_one_in_n_of_each_group_by_seq_the_rest_numbered(world_of_one, route):
    """``sample=3``: the collectives whose seq is a multiple of 3 recorded (the same ones on
    every rank), whatever their form; the others numbered only (no event, no entry marker);
    the c10d collectives between them all recorded, in the same sequence."""
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    patches = Patches()
    comm = CommTimer(dist, rec, None)
    comm.install(patches)
    functional = FunctionalTimer(torch, rec, comm.registry, route=route, sample=3)
    functional.install()
    try:
        dist.all_reduce(torch.ones(2))  # seq 0 (eager: always recorded)
        outs = [funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD) for _ in range(5)]  # 1..5
        assert _entered(rec) == [("all_reduce", 3)]
        for out in outs:
            funcol.wait_tensor(out)
        funcol.wait_tensor(funcol.all_reduce_coalesced([torch.ones(2), torch.ones(3)], "sum",
                                                       dist.group.WORLD)[0])  # 6: the general path
        dist.all_reduce(torch.ones(2))  # 7
        assert [(e[1], e[3]) for e in _comms(rec)] == [
            ("all_reduce", 0), ("all_reduce", 3), ("all_reduce_coalesced", 6), ("all_reduce", 7)]
        assert _entered(rec) == [] and rec.errors.count == 0
    finally:
        functional.remove()
        patches.undo()


def test_step_gated_hooks_in_only_on_recorded_steps_numbers_kept_by_the_group(world_of_one):
    """``steps=2``: recorded while the step is unknown and on even steps; on odd steps the op
    objects hold their original ``_op`` (nothing of ours runs), the wait's hook staying until
    a recorded step's pending output is waited for. Back on a recorded step, the group's
    counter is brought up to c10d's own count, so the skipped collectives keep their numbers
    (the same on every rank)."""
    ops = torch.ops._c10d_functional
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    patches = Patches()
    comm = CommTimer(dist, rec, None)
    comm.install(patches)
    functional = FunctionalTimer(torch, rec, comm.registry, route="python", steps=2)
    functional.install()
    world = dist.group.WORLD
    hooked, wait_hooked = ops.all_reduce.default._op, ops.wait_tensor.default._op
    try:
        funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", world))  # step unknown: seq 0
        rec.mark_step(time.perf_counter_ns())  # step 0: recorded
        funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", world))  # 1
        pending = funcol.all_reduce(torch.ones(4), "sum", world)  # 2, waited in the next step
        rec.mark_step(time.perf_counter_ns())  # step 1: hooks out but the wait's
        assert ops.all_reduce.default._op is not hooked and ops.wait_tensor.default._op is wait_hooked
        for _ in range(2):  # 3, 4: not seen at all
            funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", world))
        funcol.wait_tensor(pending)  # seq 2 ends
        dist.all_reduce(torch.ones(2))  # eager, always recorded: c10d's sixth collective
        rec.mark_step(time.perf_counter_ns())  # step 2: hooks in, the counter brought up to c10d's
        assert ops.all_reduce.default._op is hooked
        funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", world))  # 6
        rec.mark_step(time.perf_counter_ns())  # step 3: nothing pending, every hook out
        assert ops.wait_tensor.default._op is not wait_hooked
        funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", world))  # 7: not seen
        assert [(e[1], e[3], e[5]) for e in _comms(rec)] == [
            ("all_reduce", 0, -1), ("all_reduce", 1, 0), ("all_reduce", 2, 0), ("all_reduce", 3, 1),
            ("all_reduce", 6, 2)]
        assert _entered(rec) == [] and rec.errors.count == 0
    finally:
        functional.remove()
        patches.undo()
    assert not isinstance(ops.all_reduce.default._op, functional_module._Hook)  # the originals back
    assert not isinstance(ops.wait_tensor.default._op, functional_module._Hook)
    assert rec._step_listeners == []


@pytest.mark.parametrize("route", ROUTES)
def test_every_form_of_the_ops_is_recorded_once(world_of_one, route):
    """In-place, out=, coalesced, keyword calls, a wait on a view inside the output, the
    autograd formula's collective in the backward: one event each, in the group's sequence."""
    ops = torch.ops._c10d_functional
    name = dist.group.WORLD.group_name
    rec, patches, functional = _timers(route)
    try:
        x = torch.ones(4)
        ops.wait_tensor(ops.all_reduce_(x, "sum", name))  # the in-place form Inductor emits
        out = torch.empty(8)
        ops.wait_tensor(ops.all_gather_into_tensor_out(torch.ones(8), 1, name, out=out))
        outs = ops.all_reduce_coalesced([torch.ones(2), torch.ones(3)], "sum", name)
        ops.wait_tensor(outs[0])
        ops.wait_tensor(outs[1])  # the coalesced collective ended with its first output's wait
        big = ops.all_reduce(input=torch.ones(6), reduce_op="sum", group_name=name)  # by keyword
        ops.wait_tensor(tensor=big[2:])  # a view inside the output: found by its storage
        grad_in = torch.ones(4, requires_grad=True)
        funcol.all_reduce(grad_in, "sum", dist.group.WORLD).sum().backward()  # a second all_reduce
        assert torch.equal(grad_in.grad, torch.ones(4))
        events = _comms(rec)
        assert [(e[1], e[3], e[4]) for e in events] == [
            ("all_reduce", 0, 16), ("all_gather_into_tensor", 1, 32), ("all_reduce_coalesced", 2, 20),
            ("all_reduce", 3, 24), ("all_reduce", 4, 16), ("all_reduce", 5, 16)]
        assert _entered(rec) == [] and rec.errors.count == 0
    finally:
        functional.remove()
        patches.undo()


@pytest.mark.parametrize("route", ROUTES)
def test_modes_active_at_run_time_see_each_collective_recorded_once(world_of_one, route):
    """A TorchDispatchMode or TorchFunctionMode calls the op again from inside its call (the
    Python route's hook is reached twice): the group's sequence has no gap, one event each."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Dispatching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Functioning(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    rec, patches, functional = _timers(route)
    try:
        for mode in (Dispatching(), Functioning()):
            with mode:
                funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD))
                funcol.wait_tensor(funcol.all_gather_tensor(torch.ones(2), 0, dist.group.WORLD))
        assert [(e[1], e[3]) for e in _comms(rec)] == [("all_reduce", 0), ("all_gather_into_tensor", 1),
                                                      ("all_reduce", 2), ("all_gather_into_tensor", 3)]
        assert _entered(rec) == [] and rec.errors.count == 0
    finally:
        functional.remove()
        patches.undo()


@pytest.mark.parametrize("route", ROUTES)
def test_on_a_gpu_the_wait_ends_a_cuda_event_pair(world_of_one, route):
    """With a CUDA timer (here a stand-in: this test runs on the CPU) the collective's start
    event is taken at issue and its stop at the end of the wait: the device time, no host event."""
    class Cuda:
        def __init__(self):
            self.ended = []

        def begin(self, tensor):
            return ("start", tuple(tensor.shape))

        def end(self, start, meta):
            self.ended.append((start, meta))

    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    patches = Patches()
    comm = CommTimer(dist, rec, None)
    comm.install(patches)
    cuda = Cuda()
    functional = FunctionalTimer(torch, rec, comm.registry, cuda, route=route)
    functional.install()
    try:
        out = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
        assert _entered(rec) == [("all_reduce", 0)] and cuda.ended == []
        (out[1:] + 1).sum()  # waited on a view inside the output
        assert [(start, meta[:4]) for start, meta in cuda.ended] == [
            (("start", (4,)), ("all_reduce", comm.registry.resolve(None).ref, 0, 16))]
        assert _entered(rec) == [] and _comms(rec) == [] and rec.errors.count == 0
    finally:
        functional.remove()
        patches.undo()


def test_the_python_route_keeps_the_op_objects_for_dynamo_fx_and_inductor(world_of_one):
    """The op objects keep their identity, type and hash (dicts keyed by op, Inductor's
    ``type(op) is OpOverload``), every attribute of their ``_op``; removal restores ``_op``."""
    ops = torch.ops._c10d_functional
    objects = [ops.all_reduce, ops.all_reduce.default, ops.wait_tensor, ops.wait_tensor.default]
    before = [(obj, type(obj), hash(obj), obj._op) for obj in objects]
    keyed = {obj: i for i, obj in enumerate(objects)}  # built before the hooks
    rec, patches, functional = _timers("python")
    try:
        for i, (obj, kind, hashed, orig) in enumerate(before):
            assert type(obj) is kind and hash(obj) == hashed and keyed[obj] == i
            assert obj._op is not orig and obj._op.__module__ == orig.__module__
        assert torch.ops._c10d_functional.all_reduce.default is objects[1]
    finally:
        functional.remove()
        patches.undo()
    assert [obj._op for obj in objects] == [orig for _, _, _, orig in before]


def test_collectives_never_waited_for_stay_entered_within_a_bound(world_of_one, monkeypatch):
    """Outputs never waited for: entry markers until forgotten, the oldest beyond
    ``MAX_PENDING`` (counted as an error)."""
    monkeypatch.setattr(functional_module, "MAX_PENDING", 3)
    rec, patches, functional = _timers("python")
    try:
        keep = [funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD) for _ in range(4)]
        assert _entered(rec) == [("all_reduce", 1), ("all_reduce", 2), ("all_reduce", 3)]
        assert rec.errors.count == 1
        funcol.wait_tensor(keep[-1])
        assert [e[3] for e in _comms(rec)] == [3] and [seq for _, seq in _entered(rec)] == [1, 2]
        for out in keep[:-1]:
            funcol.wait_tensor(out)  # the forgotten one's wait records nothing
        assert [e[3] for e in _comms(rec)] == [1, 2] and _entered(rec) == []
    finally:
        functional.remove()
        patches.undo()


@pytest.mark.parametrize("route", ROUTES)
def test_compiled_collectives_are_recorded_without_graph_breaks(world_of_one, route):
    import torch._dynamo

    rec, patches, functional = _timers(route)
    try:
        def average(x):
            y = x * 2
            dist.all_reduce(y)  # rewritten by Dynamo into a functional all_reduce (the wrapper too)
            return funcol.all_reduce(y, "sum", dist.group.WORLD) + 1

        torch._dynamo.reset()
        explained = torch._dynamo.explain(average)(torch.ones(4))
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        rec.drain(1000)
        compiled = torch.compile(average, backend="aot_eager")
        assert torch.equal(compiled(torch.ones(4)), torch.full((4,), 3.0))
        rec.drain(1000)  # tracing ran the ops on fake tensors: nothing recorded; the first run did
        assert torch.equal(compiled(torch.ones(4)), torch.full((4,), 3.0))
        events = _comms(rec)
        assert [e[1] for e in events] == ["all_reduce", "all_reduce"]
        assert events[1][3] == events[0][3] + 1 and rec.errors.count == 0
    finally:
        torch._dynamo.reset()
        functional.remove()
        patches.undo()


def test_all_gather_single_and_its_aliases_give_one_event_each(world_of_one):
    rec, patches, functional = _timers()
    try:
        out = torch.empty(4)
        dist.all_gather_single(out, torch.ones(4))
        dist.all_gather_into_tensor(out, torch.ones(4))  # calls all_gather_single: one event
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4))
        work = dist.reduce_scatter_single(torch.empty(4), torch.ones(4), async_op=True)  # FSDP2's call
        work.wait()
        events = _comms(rec)
        assert [(e[1], e[3]) for e in events] == [("all_gather_into_tensor", 0), ("all_gather_into_tensor", 1),
                                                  ("reduce_scatter_tensor", 2), ("reduce_scatter_tensor", 3)]
        assert all(e[4] == 16 for e in events) and rec.errors.count == 0
    finally:
        functional.remove()
        patches.undo()


def test_group_ids_carry_the_mesh_dimension():
    class Group:
        group_desc = "mesh_tp"

    assert mesh_dim_of(Group()) == "tp"
    Group.group_desc = "mesh_default"
    assert mesh_dim_of(Group()) == ""
    assert group_ref("3", [1, 0], "tp").group_id.endswith(".tp")
    assert group_ref("3", [1, 0]).group_id == group_ref("3", [0, 1]).group_id
    assert "." not in group_ref("3", [0, 1]).group_id


def test_device_mesh_coordinates_are_published(world_of_one):
    import torch.distributed.device_mesh as dm

    published = []
    patches = Patches()
    install_mesh(dm, patches, ErrorBudget(), published.append)
    try:
        mesh = dm.init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
        assert published == [{"dp": 0, "tp": 0}]
        assert coordinates_of(mesh["tp"]) == {}  # a slice of the root mesh
        dm.DeviceMesh("cpu", [0])
        assert published[-1] == {"dim0": 0}
    finally:
        patches.undo()
    assert dm.DeviceMesh.__init__.__name__ == "__init__" and not hasattr(dm.DeviceMesh.__init__,
                                                                         "__perftracker_original__")


def test_distributed_checkpoint_save_and_load_are_checkpoint_spans(world_of_one, tmp_path):
    import torch.distributed.checkpoint as dcp
    from perftracker_ml.collectors.events import SPAN
    from perftracker_ml.collectors.hooks_python import install_distributed_checkpoint
    from perftracker_ml.schemas.vocabulary import SpanKind

    rec, patches, functional = _timers()
    try:
        assert install_distributed_checkpoint(dcp, rec, patches)[:2] == ["save", "load"]
        state = {"w": torch.arange(4.0)}
        dcp.save(state, checkpoint_id=str(tmp_path))
        loaded = {"w": torch.zeros(4)}
        dcp.load(loaded, checkpoint_id=str(tmp_path))
        assert torch.equal(loaded["w"], state["w"])
        events = rec.drain(1000)
        spans = [(e[1], e[2]) for e in events if e[0] == SPAN]
        assert spans == [(SpanKind.CHECKPOINT, "torch.distributed.checkpoint.save"),
                         (SpanKind.CHECKPOINT, "torch.distributed.checkpoint.load")]
        assert rec.errors.count == 0
    finally:
        functional.remove()
        patches.undo()
    assert not hasattr(dcp.save, "__perftracker_original__")
