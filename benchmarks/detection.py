"""Labelled detection benchmark: ``python -m benchmarks.detection [--json] [--quick]``.

Runs every scenario of :mod:`benchmarks.scenarios` through the engine's real classes
(FunctionComparator and JobDiagnoser always; RankSummarizer too for event-level jobs),
wired as the stream workers wire them (``perftracker_ml.streams.topology.LocalRunner``), on a
simulated clock, then scores the OPEN incidents against the ground truth:

* an incident *matches* a truth when its ranks are a non-empty subset of the culprit ranks
  (for all-rank truths such as shared inefficiency or regression: it names no rank and has
  that cause); matched incidents are true positives, all others false positives
  (a victim named as culprit is one);
* precision = true-positive incidents / incidents; recall = truths with a matching
  incident / truths; cause_accuracy = detected truths whose matching incident has the
  right cause / detected truths; false_alarms = incidents matching no truth (job-wide ones
  included: on a job without a fault, or beside the right incident); false_alarms_no_fault =
  those in scenarios whose truth is "nothing"; windows to detect = window of OPEN - first fault window + 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

from perftracker_ml.deploy.workloads.simulate.events import EventFault, EventJob, EventSimulator
from perftracker_ml.deploy.workloads.simulate.patterns import PatternSim
from perftracker_ml.deploy.workloads.simulate.records import T0_MS
from perftracker_ml.schemas.vocabulary import ANOMALY, EVENT_BATCH, Status
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.topology import LocalRunner, Routed

from .scenarios import Scenario, event_scenarios, pattern_scenarios, stress_scenarios


@dataclass(frozen=True)
class Incident:
    cause: str
    kind: str
    ranks: tuple[int, ...]
    window: int  # relative window in which it opened
    summary: str


def run_patterns(sc: Scenario, policy: DetectionPolicy) -> list[Incident]:
    assert sc.layout is not None
    sim = PatternSim(sc.layout, sc.faults, seed=sc.seed, moe=sc.moe, spike_prob=sc.spike_prob,
                     window_s=policy.window_s)
    runner = LocalRunner(policy)
    wms, grace = policy.window_ms, policy.grace_ms
    now = T0_MS
    out: list[Routed] = []
    for w, recs in sim.windows(sc.windows):
        now = T0_MS + (w + 1) * wms + 500
        for name, rec in recs:
            out += runner.feed(name, rec, now)
        out += runner.tick(now + grace + 100)
        out += runner.tick(now + grace + grace // 2 + 200)
    for k in range(1, 4):
        out += runner.tick(now + k * wms)
    return _incidents(out, wms, T0_MS)


def run_events(sc: Scenario, policy: DetectionPolicy) -> list[Incident]:
    fault = EventFault(sc.event_fault, 2 if sc.event_ranks == 4 else 11, sc.magnitude,
                       start_s=3 * policy.window_s)
    sim = EventSimulator(EventJob(ranks=sc.event_ranks), fault, seed=sc.seed)
    runner = LocalRunner(policy)
    t0 = sim.t0_ns // 1_000_000
    tick_ms = 500
    out: list[Routed] = []
    for tick in range(1, int(sc.windows * policy.window_ms / tick_ms) + 1):
        t_ns = tick * tick_ms * 1e6
        while sim.clock.min() < t_ns:
            sim.run_step()
        if tick % 2 == 0:
            for r in range(sim.job.ranks):
                out += runner.feed(EVENT_BATCH, sim.batch(r, t_ns), t0 + tick * tick_ms)
        out += runner.tick(t0 + tick * tick_ms)
    return _incidents(out, policy.window_ms, t0)


def _incidents(out: list[Routed], wms: int, t0_ms: int) -> list[Incident]:
    seen: dict[str, Incident] = {}
    for name, a in out:
        if name == ANOMALY and a["status"] == Status.OPEN and a["incident_id"] not in seen:
            window = (a["last_seen_ms"] - t0_ms) // wms - 1
            seen[a["incident_id"]] = Incident(a["cause"], a["kind"], tuple(a["ranks"]), int(window), a["summary"])
    return list(seen.values())


def matches(inc: Incident, truth) -> bool:
    if truth.ranks:
        return bool(inc.ranks) and set(inc.ranks) <= set(truth.ranks)
    return not inc.ranks and inc.cause == truth.cause


def score(results: list[tuple[Scenario, list[Incident]]]) -> dict:
    tp = fp = detected = correct = truths = false_alarms = 0
    delays: list[int] = []
    wrong: list[dict] = []
    for sc, incs in results:
        truths += len(sc.truths)
        for inc in incs:
            ok = any(matches(inc, t) and inc.window >= t.start_window for t in sc.truths)
            tp += ok
            fp += not ok
            false_alarms += not sc.truths
            if not ok:
                wrong.append({"scenario": sc.name, "false_positive": inc.cause, "ranks": list(inc.ranks[:8]),
                              "summary": inc.summary[:160]})
        for t in sc.truths:
            hit = [i for i in incs if matches(i, t) and i.window >= t.start_window]
            if not hit:
                wrong.append({"scenario": sc.name, "missed": t.cause, "ranks": list(t.ranks[:8])})
                continue
            detected += 1
            first = min(hit, key=lambda i: i.window)
            delays.append(first.window - t.start_window + 1)
            if any(i.cause == t.cause for i in hit):
                correct += 1
            else:
                wrong.append({"scenario": sc.name, "wrong_cause": first.cause, "expected": t.cause})
    total = tp + fp
    return {
        "scenarios": len(results),
        "precision": round(tp / total, 4) if total else 1.0,
        "recall": round(detected / truths, 4) if truths else 1.0,
        "cause_accuracy": round(correct / detected, 4) if detected else 1.0,
        "false_alarms": fp,  # every incident matching no truth: on a healthy job, or beside the right one
        "false_alarms_no_fault": false_alarms,
        "median_windows_to_detect": statistics.median(delays) if delays else None,
        "incidents": total, "truths": truths, "wrong": wrong,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ap.add_argument("--quick", action="store_true", help="skip the 16,384-rank scenarios")
    ap.add_argument("--only", default="", help="run scenarios whose name contains this")
    ap.add_argument("--stress", action="store_true",
                    help="also run the stress cases past the documented limits (reported under 'stress')")
    ap.add_argument("--seed", type=int, default=0, help="re-draw positions and noise (0 = the reference suite)")
    args = ap.parse_args(argv)
    policy = DetectionPolicy()
    event_policy = DetectionPolicy(window_s=2.0, window_grace_s=1.0)
    started = time.perf_counter()
    scenarios = (pattern_scenarios(include_16k=not args.quick, seed_offset=args.seed)
                 + event_scenarios(seed_offset=args.seed))
    results = []
    for sc in scenarios:
        if args.only and args.only not in sc.name:
            continue
        t = time.perf_counter()
        incs = run_events(sc, event_policy) if sc.layout is None else run_patterns(sc, policy)
        results.append((sc, incs))
        if not args.json:
            print(f"{sc.name:45s} {time.perf_counter() - t:6.1f}s  " +
                  ", ".join(f"{i.cause}{list(i.ranks[:4])}@w{i.window}" for i in incs), file=sys.stderr)
    out = score(results)
    if args.stress:
        stress = [(sc, run_patterns(sc, policy)) for sc in stress_scenarios()]
        out["stress"] = {sc.name: score([(sc, incs)])["wrong"] or "ok" for sc, incs in stress}
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
