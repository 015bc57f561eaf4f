"""The demo's two step-shape faults do what their table rows say, on the fault's rank only."""

from __future__ import annotations

import threading
import time

import torch
from perftracker_ml.deploy.demo import inject_fault


def fault(kind: str, rank: int = 2, delay_ms: str = "30", period_s: str = "8") -> inject_fault.Fault:
    env = {"PERFTRACKER_DEMO_FAULT": kind, "PERFTRACKER_DEMO_RANK": "2", "PERFTRACKER_DEMO_AT_STEP": "1",
           "PERFTRACKER_DEMO_DELAY_MS": delay_ms, "PERFTRACKER_DEMO_PERIOD_S": period_s}
    return inject_fault.from_env(rank, env)


def test_slow_backward_hook_spins_inside_backward_on_the_training_thread_of_its_rank(monkeypatch):
    spins: list[tuple[float, int]] = []
    monkeypatch.setattr(inject_fault.inject, "busy", lambda s: spins.append((s, threading.get_ident())))

    def backward(f: inject_fault.Fault, step: int) -> None:
        f.on_step(step)
        w = torch.ones(3, requires_grad=True)
        f.in_backward((w * 2).sum()).backward()
        assert w.grad is not None and w.grad.tolist() == [2.0, 2.0, 2.0]  # the gradient is untouched

    on, off = fault("slow-backward-hook"), fault("slow-backward-hook", rank=1)
    backward(on, 0)  # before its step
    backward(off, 1)  # another rank
    assert spins == []
    backward(on, 1)
    assert spins == [(0.03, threading.get_ident())]  # autograd runs a CPU graph's hooks on the caller's thread


def test_busy_spins_the_cpu_for_its_wall_time():
    t0 = time.perf_counter()
    inject_fault.inject.busy(0.01)
    assert time.perf_counter() - t0 >= 0.01


def test_periodic_stall_blocks_once_per_period(monkeypatch):
    now = [100.0]
    stalls: list[float] = []
    monkeypatch.setattr(inject_fault.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(inject_fault, "flush_metrics", stalls.append)
    monkeypatch.setattr(inject_fault.inject, "write_onset", lambda *a, **k: {})
    f = fault("periodic-stall", delay_ms="500", period_s="8")
    for step in range(100):  # 0.25 s steps: 25 s
        f.on_step(step)
        now[0] += 0.25
    assert stalls == [0.5] * 4  # at 0.25 s (its first step), 8.25, 16.25, 24.25
    other = fault("periodic-stall", rank=0)
    other.on_step(5)
    assert len(stalls) == 4
