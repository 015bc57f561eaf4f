"""Functional collectives (DTensor, tensor parallel, compiled graphs), torch 2.13's
``all_gather_single``/``reduce_scatter_single`` (FSDP2), DeviceMesh coordinates and dim names,
on a real one-rank gloo group."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from perftracker.collectors.comm import CommTimer
from perftracker.collectors.events import COMM
from perftracker.collectors.functional import FunctionalTimer
from perftracker.collectors.groups import group_ref, mesh_dim_of
from perftracker.collectors.iteration import IterationDetector
from perftracker.collectors.mesh import coordinates_of, install_mesh
from perftracker.collectors.patching import Patches
from perftracker.collectors.recorder import Recorder
from perftracker.collectors.safety import ErrorBudget


def _timers():
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    patches = Patches()
    comm = CommTimer(dist, rec, None)
    comm.install(patches)
    functional = FunctionalTimer(torch, rec, comm.registry)
    functional.install()
    return rec, patches, functional


def _comms(rec):
    return [e for e in rec.drain(1000) if e[0] == COMM]


def test_functional_collective_recorded_at_its_wait_in_the_group_sequence(world_of_one):
    rec, patches, functional = _timers()
    try:
        dist.all_reduce(torch.ones(2))  # eager: seq 0 of the default group
        out = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)  # issued: entered, not recorded yet
        assert [m[0] for m in rec.in_flight.values()] == ["all_reduce"]
        assert [e[3] for e in _comms(rec)] == [0]
        (out.view(2, 2) + 1).sum()  # waited on a view of the output (AsyncCollectiveTensor)
        events = _comms(rec)
        assert [(e[1], e[3], e[4]) for e in events] == [("all_reduce", 1, 16)]
        assert events[0][2] == functional.registry.resolve(None).ref and events[0][7] >= 0
        assert rec.in_flight == {} and rec.errors.count == 0
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
    assert _comms(rec) == []  # the kernels are gone


def test_compiled_collectives_are_recorded_without_graph_breaks(world_of_one):
    import torch._dynamo

    rec, patches, functional = _timers()
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
    from perftracker.collectors.events import SPAN
    from perftracker.collectors.hooks_python import install_distributed_checkpoint
    from perftracker.schemas.vocabulary import SpanKind

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
