"""CPU cost, on the caller's thread, of recording one Python-function event and one collective.

``python -m benchmarks.collector_hotpath --json`` prints
``{"python_event_ns": ..., "collective_event_ns": ..., ...}``: the CPU time a
wrapped call takes on the calling thread minus that of the same bare call.
Bare and wrapped calls alternate in many short rounds and the median difference
is reported, so a burst of load from other processes on a shared machine moves
both sides of a round alike (thread CPU time, unlike wall time, does not count
the time the thread is descheduled). Goal: <= 1500 ns each.

``functional_event_ns`` is the added cost of one functional collective (what DTensor,
tensor parallel and compiled graphs issue: ``_c10d_functional.all_reduce`` then its
``wait_tensor``, a real one-rank gloo all-reduce) with the collector's hooks installed
(``functional_route``: on the ops' Python entry points, the default), against the same
pair without them (installed and removed between the halves of each round);
``functional_dispatcher_event_ns`` the same with the fallback route, a Python kernel of
the dispatcher per op (docs/collectors.md, "How functional collectives are timed");
``functional_sampled_event_ns`` the Python route recording one collective in ``SAMPLE`` (4;
``PERFTRACKER_COLLECTOR_FUNCTIONAL_SAMPLE``), per collective issued, and
``functional_sampled_evidence`` the share of the collectives it recorded (events /
collectives: the evidence it keeps); ``functional_step_gated_event_ns`` the Python route with
its hooks in during one step in ``STEPS`` (4; ``PERFTRACKER_COLLECTOR_FUNCTIONAL_STEPS``), per
collective issued over steps of ``PER_STEP`` (16) collectives, the step marks and the hooks'
switches included (both halves mark the same steps), and ``functional_step_gated_evidence``
its share of the collectives recorded; ``functional_step_gated_n8_event_ns`` and
``functional_step_gated_n8_evidence`` the same at one step in ``STEPS_WIDE`` (8). The variants alternate within each round. ``--breakdown`` adds what the interception alone
costs on each route, hooks that only call the op with no recording:
``functional_floor_ns`` and ``functional_dispatcher_floor_ns`` (the rest of a route's
figure is the recording).

The measurement runs in ``--processes`` fresh interpreters (5) one after the
other and the median of their results is reported, with each process's value:
one process's memory layout (address-space randomization) can make the same
code ~2x slower for its whole life (738 and 763 vs 1593 ns for the collective event in
three runs on the 2-core VM), the effect pyperf also spreads over worker
processes.

``--instructions`` counts instead of timing (valgrind's callgrind, needs ``valgrind``; a few
minutes; ``functional_sampled_instructions`` at one in ``SAMPLE``,
``functional_step_gated_instructions`` with hooks in one step in ``STEPS``): the instructions per call each variant adds to its bare loop, counted over the
measured loop only, each variant in a process of its own (the functional pair on torch's
fake process group: no communication thread). The counts do not move with the machine's
load, which moves the times above 2x; they do not see cache misses, which the functional
pair's times include (its real all-reduce runs between the hooks' calls).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

GOAL_NS = 1500
# the sampled variant: one functional collective in SAMPLE recorded (FunctionalTimer's sample,
# PERFTRACKER_COLLECTOR_FUNCTIONAL_SAMPLE)
SAMPLE = 4
# the step-gated variant: hooks in during one step in STEPS (FunctionalTimer's steps,
# PERFTRACKER_COLLECTOR_FUNCTIONAL_STEPS), steps of PER_STEP functional collectives (a
# transformer layer under tensor parallelism issues ~4 per layer and pass: a few dozen to
# hundreds per step; fewer per step weigh the switch more)
STEPS = 4
STEPS_WIDE = 8
PER_STEP = 16


def _per_call_ns(fn: Callable[[], object], n: int) -> float:
    clock = time.thread_time_ns
    t0 = clock()
    for _ in range(n):
        fn()
    return (clock() - t0) / n


def _overhead_ns(bare: Callable[[], object], wrapped: Callable[[], object], n: int, rounds: int,
                 drain: Callable[[], object]) -> float:
    """Median over rounds of (wrapped - bare) per call; the buffer is drained between rounds,
    as the sender thread does every flush interval."""
    diffs = []
    for _ in range(rounds):
        base = _per_call_ns(bare, n)
        diffs.append(_per_call_ns(wrapped, n) - base)
        drain()
    return statistics.median(diffs)


def measure(n: int = 2_000, rounds: int = 101, breakdown: bool = False) -> dict[str, float]:
    import torch
    import torch.distributed as dist
    from perftracker_ml.collectors.comm import OP_SPECS, CommTimer
    from perftracker_ml.collectors.hooks_python import timed_callable
    from perftracker_ml.collectors.iteration import IterationDetector
    from perftracker_ml.collectors.recorder import Recorder
    from perftracker_ml.collectors.safety import ErrorBudget
    from perftracker_ml.deploy.tansu import free_port
    from perftracker_ml.schemas.vocabulary import SpanKind

    rec = Recorder(1 << 20, IterationDetector(), ErrorBudget())

    def noop() -> None:
        return None

    timed = timed_callable(noop, "bench.noop", SpanKind.PYTHON, rec)
    python_ns = _overhead_ns(noop, timed, n, rounds, lambda: rec.drain(1 << 30))

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        tensor = torch.ones(1024)

        def all_reduce(tensor, op=None, group=None, async_op=False):  # stub: no communication
            return None

        spec = next(s for s in OP_SPECS if s.name == "all_reduce")
        wrapped = CommTimer(dist, rec, None).wrap(spec, all_reduce)
        comm_ns = _overhead_ns(lambda: all_reduce(tensor), lambda: wrapped(tensor), n, rounds,
                                lambda: rec.drain(1 << 30))
        functional = _functional_ns(torch, dist, rec, max(n // 4, 50), rounds, breakdown)
    finally:
        dist.destroy_process_group()
    return {"python_event_ns": round(python_ns, 1), "collective_event_ns": round(comm_ns, 1),
            **{key: round(value, 4 if key.endswith("_evidence") else 1) for key, value in functional.items()
               if key != "functional_route"},
            "functional_route": functional["functional_route"], "functional_sample": SAMPLE,
            "functional_steps": STEPS, "functional_steps_wide": STEPS_WIDE, "functional_per_step": PER_STEP,
            "goal_ns": GOAL_NS, "calls_per_round": n, "rounds": rounds}


def _functional_setup(torch: Any, dist: Any, rec: Any) -> tuple[Callable[[], None], str, dict]:
    """The measured pair (a functional all_reduce, then its wait_tensor), the default route's
    name and the variants' installers (each returns its undo): the two routes, and each
    route's interception alone (its hooks calling the op with no recording). Every
    ``PER_STEP`` pairs the recorder marks a step (explicit steps, the same in every variant:
    what the step-gated variant switches on)."""
    import torch.distributed._functional_collectives  # noqa: F401 - the ops' Python parts, bare pair included
    from perftracker_ml.collectors.functional import DISPATCHER, PYTHON, FunctionalTimer, _Hook
    from perftracker_ml.collectors.groups import GroupRegistry

    ops = torch.ops._c10d_functional
    name = dist.group.WORLD.group_name
    tensor = torch.ones(1024)

    calls = [0]

    def pair() -> None:
        ops.wait_tensor(ops.all_reduce(tensor, "sum", name))
        calls[0] += 1
        if calls[0] % PER_STEP == 0:
            rec.mark_step(time.perf_counter_ns())

    registry = GroupRegistry(dist)

    def timer(which: str, sample: int = 1, steps: int = 1) -> Callable[[], Callable[[], None]]:
        def install() -> Callable[[], None]:
            t = FunctionalTimer(torch, rec, registry, route=which, sample=sample, steps=steps)
            t.install()
            return t.remove
        return install

    def forward(orig: Callable[..., Any]) -> Callable[..., Any]:
        return lambda *args, **kwargs: orig(*args, **kwargs) if kwargs else orig(*args)

    def python_floor() -> Callable[[], None]:
        objects = [ops.all_reduce, ops.all_reduce.default, ops.wait_tensor, ops.wait_tensor.default]
        saved = [(obj, obj._op) for obj in objects]
        for obj, orig in saved:
            hook = _Hook(forward(orig))
            hook.orig = orig
            obj._op = hook

        def undo() -> None:
            for obj, orig in saved:
                obj._op = orig
        return undo

    def dispatcher_floor() -> Callable[[], None]:
        lib = torch.library.Library("_c10d_functional", "IMPL")
        below = torch._C.DispatchKey.BackendSelect
        for op in (ops.all_reduce.default, ops.wait_tensor.default):
            kernel = FunctionalTimer._kernel(op, forward, below)
            lib.impl(op._schema.name.split("::")[1], kernel, "BackendSelect", with_keyset=True)
        return lib._destroy

    variants = {PYTHON: timer(PYTHON), DISPATCHER: timer(DISPATCHER), "python_sampled": timer(PYTHON, SAMPLE),
                "python_step_gated": timer(PYTHON, steps=STEPS), "python_step_gated_n8": timer(PYTHON, steps=STEPS_WIDE),
                "python_floor": python_floor, "dispatcher_floor": dispatcher_floor}
    return pair, FunctionalTimer(torch, rec, registry).route, variants


def _functional_ns(torch: Any, dist: Any, rec: Any, n: int, rounds: int, breakdown: bool) -> dict:
    """Median over rounds of (with the hooks - without) per functional all_reduce + wait, for
    each variant (the routes; with ``breakdown`` their interception alone), alternating
    within each round."""
    from perftracker_ml.collectors.events import COMM
    pair, route, installers = _functional_setup(torch, dist, rec)
    other = "dispatcher" if route == "python" else "python"
    keys = {"functional_event_ns": route, f"functional_{other}_event_ns": other}
    if route == "python":
        keys["functional_sampled_event_ns"] = "python_sampled"
        keys["functional_step_gated_event_ns"] = "python_step_gated"
        keys["functional_step_gated_n8_event_ns"] = "python_step_gated_n8"
    if breakdown:
        keys.update({"functional_floor_ns": f"{route}_floor", f"functional_{other}_floor_ns": f"{other}_floor"})
    diffs: dict[str, list[float]] = {key: [] for key in keys}
    recorded = {key: 0 for key in keys}  # events the variant recorded (the evidence kept)
    for _ in range(rounds):
        for key, variant in keys.items():
            base = _per_call_ns(pair, n)
            rec.drain(1 << 30)
            undo = installers[variant]()
            try:
                diffs[key].append(_per_call_ns(pair, n) - base)
            finally:
                undo()
            recorded[key] += sum(1 for ev in rec.drain(1 << 30) if ev[0] == COMM)
    kept = {key.replace("_event_ns", "_evidence"): recorded[key] / (n * rounds)
            for key in ("functional_sampled_event_ns", "functional_step_gated_event_ns",
                        "functional_step_gated_n8_event_ns") if key in keys}
    return {**{key: statistics.median(values) for key, values in diffs.items()}, **kept, "functional_route": route}


# -- instructions (valgrind's callgrind): the same costs, deterministic -----------------------
INSTRUCTION_VARIANTS = {  # name: (what runs in the measured loop, how many times)
    "functional_bare": ("pair", 1000), "functional_python": ("pair", 1000), "functional_python_sampled": ("pair", 1000),
    "functional_python_step_gated": ("pair", 1000),
    "functional_python_floor": ("pair", 1000), "functional_dispatcher": ("pair", 1000),
    "functional_dispatcher_floor": ("pair", 1000),
    "collective_bare": ("stub", 10000), "collective_event": ("stub", 10000),
    "python_bare": ("noop", 10000), "python_event": ("noop", 10000),
}


def instructions(workdir: str) -> dict:
    """Instructions per call each variant adds to its bare loop, counted by callgrind over the
    measured loop only (each variant in a process of its own, on torch's fake process group:
    no communication thread). Needs valgrind; takes a few minutes."""
    totals = {}
    for variant in INSTRUCTION_VARIANTS:
        out_file = os.path.join(workdir, f"callgrind.{variant}")
        child = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}",
             sys.executable, "-m", "benchmarks.collector_hotpath", "--instructions-child", variant, workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ready = os.path.join(workdir, f"ready.{child.pid}")
        while not os.path.exists(ready):
            if child.poll() is not None:
                raise RuntimeError(f"{variant}: the child exited with {child.returncode}")
            time.sleep(0.2)
        subprocess.run(["callgrind_control", "-i", "on", str(child.pid)], check=True, capture_output=True)
        open(os.path.join(workdir, f"go.{child.pid}"), "w").close()
        child.wait()
        with open(out_file) as f:
            totals[variant] = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
    per_call = {v: totals[v] / INSTRUCTION_VARIANTS[v][1] for v in totals}
    return {"functional_instructions": round(per_call["functional_python"] - per_call["functional_bare"]),
            "functional_sampled_instructions":
                round(per_call["functional_python_sampled"] - per_call["functional_bare"]),
            "functional_step_gated_instructions":
                round(per_call["functional_python_step_gated"] - per_call["functional_bare"]),
            "functional_floor_instructions": round(per_call["functional_python_floor"] - per_call["functional_bare"]),
            "functional_dispatcher_instructions": round(per_call["functional_dispatcher"] - per_call["functional_bare"]),
            "functional_dispatcher_floor_instructions":
                round(per_call["functional_dispatcher_floor"] - per_call["functional_bare"]),
            "collective_event_instructions": round(per_call["collective_event"] - per_call["collective_bare"]),
            "python_event_instructions": round(per_call["python_event"] - per_call["python_bare"])}


def _instructions_child(variant: str, workdir: str) -> None:
    """One variant's measured loop, run under callgrind with instrumentation off until the
    parent turns it on (after the set-up and a warm-up): then the loop, and exit."""
    import gc

    import torch
    import torch.distributed as dist
    from perftracker_ml.collectors.comm import OP_SPECS, CommTimer
    from perftracker_ml.collectors.hooks_python import timed_callable
    from perftracker_ml.collectors.iteration import IterationDetector
    from perftracker_ml.collectors.recorder import Recorder
    from perftracker_ml.collectors.safety import ErrorBudget
    from perftracker_ml.schemas.vocabulary import SpanKind
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    rec = Recorder(1 << 20, IterationDetector(), ErrorBudget())
    what, n = INSTRUCTION_VARIANTS[variant]
    undo = None
    if what == "pair":
        pair, _, installers = _functional_setup(torch, dist, rec)
        undo = None if variant == "functional_bare" else installers[variant.removeprefix("functional_")]()
        fn: Callable[[], object] = pair
    elif what == "stub":
        tensor = torch.ones(1024)

        def all_reduce(tensor, op=None, group=None, async_op=False):  # stub: no communication
            return None

        wrapped = CommTimer(dist, rec, None).wrap(next(s for s in OP_SPECS if s.name == "all_reduce"), all_reduce)
        fn = (lambda: wrapped(tensor)) if variant == "collective_event" else (lambda: all_reduce(tensor))
    else:
        def noop() -> None:
            return None

        fn = timed_callable(noop, "bench.noop", SpanKind.PYTHON, rec) if variant == "python_event" else noop
    gc.disable()  # a collection's cost depends on the whole heap, not on the call
    for _ in range(200):
        fn()
    rec.drain(1 << 30)
    pid = os.getpid()
    open(os.path.join(workdir, f"ready.{pid}"), "w").close()
    while not os.path.exists(os.path.join(workdir, f"go.{pid}")):
        time.sleep(0.05)
    for _ in range(n):
        fn()
    del undo  # held until here: a torch.library registration lives as long as its Library
    os._exit(0)


def in_processes(processes: int, calls: int, rounds: int, breakdown: bool = False) -> dict:
    """Median over fresh interpreters of :func:`measure`, with every process's values."""
    runs = []
    for _ in range(processes):
        out = subprocess.run([sys.executable, "-m", "benchmarks.collector_hotpath", "--json",
                              "--processes", "1", "--calls", str(calls), "--rounds", str(rounds),
                              *(["--breakdown"] if breakdown else [])],
                             check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return summarize(runs)


def summarize(runs: list[dict]) -> dict:
    keys = tuple(k for k in ("python_event_ns", "collective_event_ns", "functional_event_ns",
                             "functional_sampled_event_ns", "functional_step_gated_event_ns",
                             "functional_step_gated_n8_event_ns",
                             "functional_dispatcher_event_ns",
                             "functional_floor_ns", "functional_dispatcher_floor_ns") if k in runs[0])
    route = {k: runs[0][k] for k in ("functional_route", "functional_sample", "functional_sampled_evidence",
                                     "functional_steps", "functional_steps_wide", "functional_per_step",
                                     "functional_step_gated_evidence", "functional_step_gated_n8_evidence")
             if k in runs[0]}
    return {**{k: round(statistics.median(r[k] for r in runs), 1) for k in keys}, **route,
            "goal_ns": GOAL_NS, "processes": len(runs),
            **{k.replace("_ns", "_ns_per_process"): [r[k] for r in runs] for k in keys},
            "calls_per_round": runs[0]["calls_per_round"], "rounds": runs[0]["rounds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--calls", type=int, default=2_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--processes", type=int, default=5, help="fresh interpreters (1 = this one)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also the functional collectives' interception alone, per route")
    parser.add_argument("--instructions", action="store_true",
                        help="instructions per call instead of time (valgrind's callgrind; minutes)")
    parser.add_argument("--instructions-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.instructions_child:
        _instructions_child(*args.instructions_child)
    if args.instructions:
        import tempfile
        with tempfile.TemporaryDirectory() as workdir:
            result = instructions(workdir)
    elif args.processes > 1:
        result = in_processes(args.processes, args.calls, args.rounds, args.breakdown)
    else:
        result = measure(args.calls, args.rounds, args.breakdown)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>32}: {value}")


if __name__ == "__main__":
    main()
