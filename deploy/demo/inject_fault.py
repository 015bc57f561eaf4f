"""DEMO ONLY: fault injection for `perftracker demo`. Not product code.

perftracker never imports this module; the demo's training script
(``train.py``) does, and it reads only these environment variables:

    PERFTRACKER_DEMO_FAULT     none | slow-dataloader | cpu-contention | slow-collective | gc-storm
                               | slow-backward-hook | periodic-stall
    PERFTRACKER_DEMO_RANK      global rank that gets the fault (default 2)
    PERFTRACKER_DEMO_AT_STEP   first step with the fault (default 200)
    PERFTRACKER_DEMO_DELAY_MS  delay of slow-dataloader / slow-collective / slow-backward-hook, and
                               the length of each periodic-stall (default 15)
    PERFTRACKER_DEMO_PERIOD_S  seconds between two periodic stalls (default 8)
    PERFTRACKER_DEMO_ONSET_FILE  where the faulty rank writes when the fault began (JSON)

What each fault does on the chosen rank from the chosen step on:
- slow-dataloader: the collate function sleeps DELAY_MS per batch (inside DataLoader.__next__);
- cpu-contention: the rank is pinned to one core and HOGS (4) busy-looping competitor processes are
  pinned to the same core (it exits by itself when the rank goes away);
- slow-collective: the rank sleeps DELAY_MS just before entering the per-step all_reduce,
  in code no collector times, so it simply arrives late;
- slow-backward-hook: a hook on the loss spins the CPU for DELAY_MS when backward starts, on
  the training thread (autograd runs CPU work on the caller's thread): its backward is slower;
- periodic-stall: every PERIOD_S the rank blocks DELAY_MS in ``flush_metrics`` before its step
  (a synchronous metrics flush or checkpoint write), so its peers wait for it in the next
  collective;
- gc-storm: the rank keeps a heap of 30k Python objects, makes cyclic garbage every step and
  runs a full garbage collection each step (as code calling gc.collect() in a loop does).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any

from perftracker_ml.deploy.workloads import inject  # the workloads' shared fault mechanics

FAULTS = ("none", "slow-dataloader", "cpu-contention", "slow-collective", "gc-storm", "slow-backward-hook",
          "periodic-stall")  # names of deploy/workloads/faults.py
# competitors on the rank's core: enough that the rank gets clearly less CPU than its peers even
# on a 2-core machine running 4 ranks (there the other ranks already share a core three ways)
HOGS = 4


class Fault:
    """Hooks called by train.py; they do nothing until the fault's step on the fault's rank."""

    def __init__(self, kind: str, active_rank: bool, at_step: int, delay_ms: float, onset_file: str,
                 period_s: float = 8.0):
        self.kind = kind if active_rank else "none"
        self.at_step = at_step
        self.delay_s = delay_ms / 1000.0
        self.period_s = period_s
        self._next_stall = 0.0
        self.onset_file = onset_file
        self.active = False
        self._hogs: list[Any] = []
        self._heap: list = []

    def on_step(self, step: int) -> None:
        if not self.active and self.kind != "none" and step >= self.at_step:
            self._start(step)
        if self.active and self.kind == "gc-storm":
            inject.make_cyclic_garbage(5_000)
            gc.collect()
        if self.active and self.kind == "periodic-stall" and time.monotonic() >= self._next_stall:
            self._next_stall = time.monotonic() + self.period_s
            flush_metrics(self.delay_s)

    def in_backward(self, loss: Any) -> Any:
        """``loss``, with a hook that spins at the start of its backward (slow-backward-hook)."""
        if self.active and self.kind == "slow-backward-hook":
            loss.register_hook(self._spin)
        return loss

    def _spin(self, grad: Any) -> Any:
        inject.busy(self.delay_s)
        return grad

    def before_collective(self) -> None:
        if self.active and self.kind == "slow-collective":
            time.sleep(self.delay_s)

    def slow_batch(self) -> None:
        if self.active and self.kind == "slow-dataloader":
            time.sleep(self.delay_s)

    def stop(self) -> None:
        inject.stop_hogs(self._hogs)
        self._hogs = []

    def _start(self, step: int) -> None:
        self.active = True
        if self.kind == "cpu-contention":
            self._hogs = inject.pin_with_hogs(HOGS)
        elif self.kind == "gc-storm":
            gc.freeze()  # leave torch's own objects out, so each collection costs ~10 ms here
            self._heap = [{"i": i, "payload": [i]} for i in range(30_000)]
        if self.onset_file:
            inject.write_onset(self.onset_file, self.kind, int(os.environ.get("RANK", "-1")), step)
        print(f"[demo] injected fault {self.kind} on rank {os.environ.get('RANK')} at step {step}",
              flush=True)


def flush_metrics(seconds: float) -> None:
    """Stands in for a synchronous flush (metrics, logs, a checkpoint shard): a blocking wait."""
    time.sleep(seconds)  # LF:periodic-stall


_current: Fault | None = None


def from_env(rank: int, env: dict[str, str] | None = None) -> Fault:
    """The fault this rank runs with, from PERFTRACKER_DEMO_*; also used by :func:`collate`."""
    global _current
    env = dict(os.environ) if env is None else env
    kind = env.get("PERFTRACKER_DEMO_FAULT", "none") or "none"
    if kind not in FAULTS:
        raise SystemExit(f"PERFTRACKER_DEMO_FAULT={kind!r} is not one of {', '.join(FAULTS)}")
    _current = Fault(kind, rank == int(env.get("PERFTRACKER_DEMO_RANK", "2")),
                     int(env.get("PERFTRACKER_DEMO_AT_STEP", "200")),
                     float(env.get("PERFTRACKER_DEMO_DELAY_MS", "15")),
                     env.get("PERFTRACKER_DEMO_ONSET_FILE", ""),
                     float(env.get("PERFTRACKER_DEMO_PERIOD_S", "8")))
    return _current


def collate(inner: Callable) -> Callable:
    """Wrap the data loader's collate function: the slow-dataloader fault sleeps here."""

    def collate_with_fault(batch: Any) -> Any:
        if _current is not None:
            _current.slow_batch()
        return inner(batch)

    return collate_with_fault
