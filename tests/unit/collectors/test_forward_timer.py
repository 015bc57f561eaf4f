"""The root module's forward: a DDP root through the DDP.forward wrapper (no module
hooks, so Module.__call__ keeps its fast path), any other root through its own hooks."""

import pytest
import torch
from perftracker_ml.collectors.events import SPAN
from perftracker_ml.collectors.hooks_python import ForwardTimer
from perftracker_ml.collectors.iteration import IterationDetector
from perftracker_ml.collectors.patching import Patches
from perftracker_ml.collectors.recorder import Recorder
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.schemas.vocabulary import SpanKind
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

CALLS = ForwardTimer.DISCOVER_CALLS + 4


def _forwards(rec: Recorder) -> list[str]:
    return [e[2] for e in rec.drain(1000) if e[0] == SPAN and e[1] == SpanKind.FORWARD]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def test_a_ddp_root_is_timed_without_module_hooks_and_the_patch_is_undone(world_of_one):
    rec, patches = Recorder(1000, IterationDetector(), ErrorBudget()), Patches()
    original = DDP.forward
    timer = ForwardTimer(rec)
    timer.install(torch, patches)
    model, other = DDP(_model()), DDP(_model())
    x = torch.randn(2, 4)
    for _ in range(CALLS):
        model(x).sum().backward()
    other(x)  # a DDP module that is not a discovered root: not timed
    assert _forwards(rec) == ["torch.nn.modules.container.Sequential.forward"] * CALLS
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not model.module[0]._forward_hooks  # inner modules were never hooked either
    assert rec.errors.count == 0
    timer.remove()
    patches.undo()
    assert DDP.forward is original
    model(x)
    assert _forwards(rec) == []


class _OwnForwardDDP(DDP):
    def forward(self, *inputs, **kwargs):  # never calls DDP.forward
        return self.module(*inputs, **kwargs)


@pytest.mark.parametrize("make", [_model, lambda: _OwnForwardDDP(_model())], ids=["plain", "ddp-subclass"])
def test_a_root_the_wrapper_cannot_see_gets_hooks_of_its_own(world_of_one, make):
    rec, patches = Recorder(1000, IterationDetector(), ErrorBudget()), Patches()
    timer = ForwardTimer(rec)
    timer.install(torch, patches)
    model = make()
    x = torch.randn(2, 4)
    try:
        for _ in range(CALLS):
            model(x)
        assert _forwards(rec) == ["torch.nn.modules.container.Sequential.forward"] * CALLS
        assert len(model._forward_hooks) == 1 and len(model._forward_pre_hooks) == 1
        assert not getattr(model, "module", model)[0]._forward_hooks
    finally:
        timer.remove()
        patches.undo()
    assert not model._forward_hooks
