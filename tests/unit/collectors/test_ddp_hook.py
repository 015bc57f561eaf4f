"""The timed DDP comm hook: DDP's own arithmetic, one event per bucket, shared sequence counters."""

import torch
import torch.distributed as dist
from perftracker_ml.collectors.comm import OP_SPECS, CommTimer
from perftracker_ml.collectors.events import COMM
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def test_hooked_ddp_gives_the_builtin_gradients_and_one_event_per_bucket(world_of_one):
    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    timer = CommTimer(dist, rec, None)
    builtin, hooked = DDP(_model()), DDP(_model())
    hooked.register_comm_hook(hooked.process_group, timer.ddp_allreduce_hook())
    x = torch.randn(4, 8)
    for _ in range(3):
        for model in (builtin, hooked):
            model.zero_grad()
            model(x).square().sum().backward()
    for a, b in zip(builtin.parameters(), hooked.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    # a user-level all_reduce on the same (default) group continues the same sequence
    wrapped = timer.wrap(next(s for s in OP_SPECS if s.name == "all_reduce"), dist.all_reduce)
    wrapped(torch.ones(3))
    events = rec.drain(100)
    assert rec.errors.count == 0
    assert [(e[0], e[1], e[3]) for e in events] == [(COMM, "all_reduce", i) for i in range(4)]
    bucket_bytes = sum(p.numel() * p.element_size() for p in hooked.parameters())
    assert [e[4] for e in events] == [bucket_bytes] * 3 + [12]
    assert len({e[2] for e in events}) == 1 and all(e[7] >= 0 for e in events)


def test_bucket_all_reduce_is_entered_when_issued_until_its_future_completes(world_of_one):
    """Each bucket's all-reduce is in ``rec.in_flight`` from issue to completion (the sender
    reports it as an entry marker meanwhile)."""

    class Entries(dict):
        def __init__(self):
            super().__init__()
            self.entered = []

        def __setitem__(self, key, value):
            self.entered.append(value)
            super().__setitem__(key, value)

    rec = Recorder(1000, IterationDetector(), ErrorBudget())
    rec.in_flight = Entries()
    timer = CommTimer(dist, rec, None)
    hooked = DDP(_model())
    hooked.register_comm_hook(hooked.process_group, timer.ddp_allreduce_hook())
    hooked(torch.randn(4, 8)).square().sum().backward()
    assert [(m[0], m[2]) for m in rec.in_flight.entered] == [("all_reduce", 0)]
    assert dict(rec.in_flight) == {} and rec.errors.count == 0  # completed: no longer entered
    assert [e[3] for e in rec.drain(100)] == [0]
