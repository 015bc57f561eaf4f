"""Record the corpus: ``python -m benchmarks.record_corpus [--runs a,b] [--out DIR]``.

Each run of :data:`PLAN` is a real job, diagnosed live by the embedded stack at default
settings (as ``benchmarks.live_faults`` runs them), then recorded from what the input
topics retain (``perftracker record``, :mod:`perftracker_ml.deploy.record`) into
``<out>/<set>/<name>.ptrec``, with its truth (:class:`benchmarks.corpus.Truth`) beside it:
the culprits and causes the staged fault implies, the location marker's ``file:line``, the
onset's wall time as the training script wrote it. What the live stack said is kept in the
truth file under ``live`` for information; it never sets the truth.

The runs:

* every scenario of the live fault suite (``benchmarks/live_faults_train.py``, 4 gloo DDP
  ranks, two nodes for ``two-nodes-*``);
* ``none-loaded``: no fault while a busy process takes one of the machine's cores;
  ``two-nodes-none``: no fault on two nodes;
* the demo's training scripts (``deploy/demo``): the MLP under DDP, the GPT-style model as
  tensor parallel x FSDP2 and as two pipeline stages x data parallel, with and without the
  demo's faults on rank 2.

:data:`EVALUATION` names the frozen evaluation set; the rest is the tuning set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perftracker_ml.deploy.workloads.faults import cause_of

from .corpus import CORPUS_DIR, Truth
from .live_faults import SCENARIOS, Expect, Scenario, default_stack, marker_lines, run_scenario


@dataclass(frozen=True)
class Run:
    name: str
    kind: str  # "live": a live fault suite scenario; "demo": the demo's training
    scenario: Scenario | None = None
    fault: str = "none"
    model: str = "mlp"  # demo only
    load: bool = False  # a busy process on one core throughout
    layout: str = "ddp"
    env: tuple[tuple[str, str], ...] = ()  # demo only: the ranks' environment (the fault's PERFTRACKER_DEMO_*, collector settings)
    location: str | None = None  # demo only: the fault's ``# LF:`` marker in deploy/demo/inject_fault.py
    steps: int = 900  # demo only: the fault starts a third of the way in


EXTRA_SCENARIOS = (
    Scenario("none-loaded", "none", Expect()),
    Scenario("two-nodes-none", "none", Expect(), nodes=2),
)
PLAN: dict[str, Run] = {r.name: r for r in (
    *(Run(s.name, "live", s, s.fault) for s in SCENARIOS.values()),
    Run("none-loaded", "live", EXTRA_SCENARIOS[0], load=True),
    Run("two-nodes-none", "live", EXTRA_SCENARIOS[1]),
    Run("demo-mlp-none", "demo", fault="none"),
    Run("demo-mlp-slow-dataloader", "demo", fault="slow-dataloader"),
    Run("demo-mlp-gc-storm", "demo", fault="gc-storm"),
    Run("demo-mlp-slow-collective", "demo", fault="slow-collective"),
    Run("demo-tp-fsdp2-none", "demo", fault="none", model="transformer", layout="tp-fsdp2"),
    Run("demo-tp-fsdp2-slow-dataloader", "demo", fault="slow-dataloader", model="transformer", layout="tp-fsdp2"),
    Run("demo-pp-none", "demo", fault="none", model="transformer-pp", layout="pp"),
    Run("demo-pp-none-again", "demo", fault="none", model="transformer-pp", layout="pp"),
    Run("demo-pp-slow-dataloader", "demo", fault="slow-dataloader", model="transformer-pp", layout="pp"),
    Run("demo-pp-gc-storm", "demo", fault="gc-storm", model="transformer-pp", layout="pp"),
    Run("demo-fsdp2-none", "demo", fault="none", model="transformer-fsdp2", layout="fsdp2"),
    # one rank's backward slower by a few percent of a ~150 ms step
    Run("demo-fsdp2-slow-backward", "demo", fault="slow-backward-hook", model="transformer-fsdp2", layout="fsdp2",
        env=(("PERFTRACKER_DEMO_DELAY_MS", "12"),)),
    # a synchronous flush on one rank: shorter than a window apart, then longer than a window apart (800 ms:
    # 500 ms every 8 s of ~15 ms steps costs ~0.97 ms per step, under min_cost_ms_per_step, not reported by design)
    Run("demo-mlp-periodic-stall", "demo", fault="periodic-stall", location="periodic-stall", steps=4000,
        env=(("PERFTRACKER_DEMO_DELAY_MS", "300"), ("PERFTRACKER_DEMO_PERIOD_S", "2"))),
    Run("demo-mlp-periodic-stall-long", "demo", fault="periodic-stall", location="periodic-stall", steps=4000,
        env=(("PERFTRACKER_DEMO_DELAY_MS", "800"), ("PERFTRACKER_DEMO_PERIOD_S", "8"))),
    Run("demo-fsdp2-periodic-stall", "demo", fault="periodic-stall", model="transformer-fsdp2", layout="fsdp2",
        location="periodic-stall", env=(("PERFTRACKER_DEMO_DELAY_MS", "600"), ("PERFTRACKER_DEMO_PERIOD_S", "12"))),
    # tensor parallel's functional collectives recorded every step, then during one step in 4 only
    # (PERFTRACKER_COLLECTOR_FUNCTIONAL_STEPS): the evidence step gating keeps
    Run("demo-tp-fsdp2-slow-backward", "demo", fault="slow-backward-hook", model="transformer", layout="tp-fsdp2",
        env=(("PERFTRACKER_DEMO_DELAY_MS", "40"),)),
    Run("demo-tp-fsdp2-slow-backward-gated", "demo", fault="slow-backward-hook", model="transformer",
        layout="tp-fsdp2", env=(("PERFTRACKER_DEMO_DELAY_MS", "40"), ("PERFTRACKER_COLLECTOR_FUNCTIONAL_STEPS", "4"))),
)}
# the frozen evaluation set: every cause family and both healthy and faulty layouts on each side
EVALUATION = frozenset({
    "slow-backward-hook", "host-copies", "two-culprits", "subgroup-hang", "checkpoint", "gradual-creep",
    "gc-storm", "untimed-sleep", "slow-loader-workers", "slow-from-start", "noisy-none", "long-pause",
    "fault-clears", "none-loaded", "two-nodes-none", "demo-mlp-gc-storm", "demo-tp-fsdp2-none",
    "demo-pp-slow-dataloader", "demo-pp-none",
})


def _hog() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _live_truth(run: Run, result: dict[str, Any], onset: dict[str, Any] | None) -> Truth:
    assert run.scenario is not None
    s, expect = run.scenario, run.scenario.expect
    location = marker_lines().get(expect.location or "", None)
    faulty = bool(expect.culprits or expect.job_cause)
    return Truth(name=run.name, set="evaluation" if run.name in EVALUATION else "tuning",
                 culprits={str(r): c for r, c in expect.culprits.items()}, job_cause=expect.job_cause,
                 location=location, clears=expect.clears,
                 onset_ms=round(float(onset["wall_time"]) * 1000) if onset and faulty else None,
                 fault=s.fault, layout=run.layout, script="benchmarks/live_faults_train.py", nodes=s.nodes,
                 how=f"python -m benchmarks.record_corpus --runs {run.name}",
                 live={k: result.get(k) for k in ("culprit_correct", "cause_correct", "location_correct",
                                                  "seconds_to_detect", "false_ranks", "found")})


def _record_live(settings: Any, run: Run, work: Path, args: argparse.Namespace) -> tuple[str, Truth]:
    assert run.scenario is not None
    hog = _hog() if run.load else None
    try:
        result = run_scenario(settings, run.scenario, work, args.onset_s, args.budget_s, 0.5, 5.0, 20.0)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    onset_file = work / f"{result['job']}.onset.json"
    onset = json.loads(onset_file.read_text()) if onset_file.exists() else None
    return result["job"], _live_truth(run, result, onset)


def _record_demo(settings: Any, run: Run) -> tuple[str, Truth]:
    from perftracker_ml.deploy.demo import runner

    saved = {k: os.environ.get(k) for k, _ in run.env}
    os.environ.update(dict(run.env))  # the demo's ranks inherit the environment
    try:
        result = runner.run_demo(settings, fault=run.fault, ranks=4, model=run.model, steps=run.steps,
                                 echo=lambda _line: None)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    cause = cause_of(run.fault)
    location = marker_lines(Path(runner.__file__).with_name("inject_fault.py"))[run.location] \
        if run.location and cause else None
    truth = Truth(name=run.name, set="evaluation" if run.name in EVALUATION else "tuning",
                  culprits={str(result.fault_rank): cause} if cause else {},
                  location=location, onset_ms=round(result.onset_wall * 1000) if cause and result.onset_wall else None,
                  fault=run.fault, layout=run.layout,
                  script=f"deploy/demo ({run.model}{''.join(f', {k}={v}' for k, v in run.env)})",
                  how=f"python -m benchmarks.record_corpus --runs {run.name}",
                  live={"culprit_correct": result.culprit_correct, "seconds_to_detect": result.seconds_to_detect,
                        "found": [{"cause": r["cause"], "ranks": r["ranks"]} for r in result.rows]})
    return result.job, truth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=",".join(PLAN), help="comma-separated subset of the plan")
    parser.add_argument("--out", type=Path, default=CORPUS_DIR)
    parser.add_argument("--onset-s", type=float, default=20.0)
    parser.add_argument("--budget-s", type=float, default=45.0)
    args = parser.parse_args()
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    unknown = [n for n in names if n not in PLAN]
    if unknown:
        parser.error(f"unknown runs {unknown}: choose from {', '.join(PLAN)}")
    from perftracker_ml.deploy.record import RecordOptions, record_job
    from perftracker_ml.schemas.recording import SUFFIX, truth_path

    with default_stack("pt-corpus-") as (settings, work):
        for name in names:
            run = PLAN[name]
            started = time.time()
            job, truth = _record_live(settings, run, work, args) if run.kind == "live" else _record_demo(settings, run)
            dest = args.out / truth.set / f"{name}{SUFFIX}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            note = f"{truth.how}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
            n = record_job(settings, dest, RecordOptions(job=job, quiet_s=3.0, note=note))
            truth_path(dest).write_text(truth.to_json())
            print(json.dumps({"run": name, "set": truth.set, "job": job, "messages": n,
                              "bytes": dest.stat().st_size, "seconds": round(time.time() - started, 1),
                              "live": truth.live}), flush=True)


if __name__ == "__main__":
    main()
