"""A window diagnosed in shards of ranks and merged (streams/detect/shards.py) gives what the
unsharded diagnosis gives: the same findings (identities, ranks, summaries, evidence), the same
decision trace and step time, window by window, for 1, 2 and odd shard counts -- over recorded
real runs (benchmarks/recordings) and a synthetic TP x PP x DP job with faults whose evidence
spans groups and shards; and the Anomaly records leaving the stage are byte-identical."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pickle
from collections import Counter
from collections.abc import Iterator
from typing import Any

import perftracker_ml.streams.detect.diagnose as diagnose_module
import pytest
from perftracker_ml.schemas.recording import Recording
from perftracker_ml.schemas.vocabulary import ANOMALY
from perftracker_ml.streams.detect import DetectionPolicy, JobDiagnoser
from perftracker_ml.streams.detect.rank_records import pattern_functions
from perftracker_ml.streams.detect.shards import (
    diagnose_shard,
    diagnose_sharded,
    merge,
    shard_count,
    shard_of,
    split,
)
from perftracker_ml.streams.detect.window import diagnose_window_traced, step_ms
from perftracker_ml.streams.replay import canonical, replay
from perftracker_ml.streams.topology import LocalRunner

from benchmarks.corpus import entries

from .synth import rank_window

SHARDS = (1, 2, 3, 5, 7)
ENTRIES = entries()

@dataclasses.dataclass
class Checked:
    windows: int = 0
    findings: int = 0
    decisions: int = 0
    ranks: Counter[int] = dataclasses.field(default_factory=Counter)  # windows checked, by their rank count
    mismatches: list[str] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def every_window_checked(shards: tuple[int, ...] = SHARDS) -> Iterator[Checked]:
    """While open, every window the diagnoser evaluates unsharded is diagnosed sharded too, in
    each of ``shards`` shard counts, and compared (the diagnosis goes on with the unsharded one)."""
    checked = Checked()
    unsharded = diagnose_module.diagnose_window_traced

    def both(rws: dict, cmps: list, policy: DetectionPolicy) -> Any:
        findings, trace = unsharded(rws, cmps, policy)
        checked.windows += 1
        checked.findings += len(findings)
        checked.decisions += len(trace.decisions)
        checked.ranks[len(rws)] += 1
        named: Counter[str] = Counter()
        for rw in rws.values():
            named.update(pattern_functions(rw))
        for n in shards:
            merged = diagnose_sharded(rws, cmps, policy, n)
            if (merged.findings, merged.trace, merged.job_step_ms, +merged.named) != \
                    (findings, trace, step_ms(rws), +named):
                checked.mismatches.append(f"window {next(iter(rws.values()))['window_id']}, {n} shards")
        return findings, trace

    diagnose_module.diagnose_window_traced = both
    try:
        yield checked
    finally:
        diagnose_module.diagnose_window_traced = unsharded


@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{e.truth.set}/{e.truth.name}" for e in ENTRIES])
def test_sharded_and_unsharded_diagnosis_are_equal_on_recorded_runs(entry):
    """Every recording of the corpus (~1 s each): every window it evaluates, in each shard count."""
    with every_window_checked() as checked:
        result = replay(Recording(entry.recording).messages(), DetectionPolicy())
    assert checked.windows >= 3 and not checked.mismatches, checked.mismatches
    assert result.messages > 0


def synthetic_job(policy: DetectionPolicy, windows: int = 7) -> list[dict]:
    """A 256-rank job (DP 8 x TP 8 x PP 4) through compare and diagnose: a slow GPU (rank 37: late
    into its TP group and, through it, its DP group: victims in both), a host's CPU contention
    (ranks 200-207, a host-level merge across a host's ranks) and a slow link from window 2."""
    from perftracker_ml.deploy.workloads.simulate.faults import Fault
    from perftracker_ml.deploy.workloads.simulate.layout import Layout
    from perftracker_ml.deploy.workloads.simulate.patterns import PatternSim
    from perftracker_ml.deploy.workloads.simulate.records import T0_MS

    faults = (Fault("slow_gpu", (37,), magnitude=1.3, start_window=2),
              Fault("cpu_contention", tuple(range(200, 208)), magnitude=1.3, start_window=2),
              Fault("slow_link", (130, 138), magnitude=1.5, start_window=2))
    sim = PatternSim(Layout(8, 8, 4), faults, seed=11, spike_prob=0.0)
    runner, out = LocalRunner(policy), []
    for w, recs in sim.windows(windows):
        now = T0_MS + (w + 1) * policy.window_ms + 500
        for name, rec in recs:
            out += runner.feed(name, rec, now)
        out += runner.tick(now + policy.grace_ms + 100)
        out += runner.tick(now + 2 * policy.grace_ms)
    return [a for name, a in out if name == ANOMALY]


def test_sharded_and_unsharded_diagnosis_are_equal_on_a_synthetic_job_with_evidence_across_groups():
    with every_window_checked() as checked:
        anomalies = synthetic_job(DetectionPolicy())
    assert checked.windows >= 6 and not checked.mismatches, checked.mismatches
    assert set(checked.ranks) == {256} and checked.findings and checked.decisions
    opened = {tuple(a["ranks"]): a for a in anomalies if a["status"] == "OPEN"}
    assert {(37,), tuple(range(200, 208))} <= set(opened), list(opened)  # the slow GPU; the host, merged
    decisions = json.loads(opened[(37,)]["evidence_json"])["decisions"]
    # rank 37's evidence spans groups (late into its DP and its TP group) and its window's trace
    # spans shards (propagated victims cleared in pipeline groups of other shards)
    groups = {g for d in decisions if d["rule"] == "stragglers" and d["rank"] == 37 for g in d["evidence"]["groups"]}
    assert any(":dp_" in g for g in groups) and any(":tp_" in g for g in groups), groups
    assert len({shard_of(int(d["rank"]), 256, 5) for d in decisions}) > 1

def test_the_anomalies_leaving_the_stage_are_byte_identical_sharded_by_job_size():
    """The diagnose stage shards a window by the job's size (``diagnose_shard_ranks``): 256 ranks
    in 2, 3 and 5 shards give the same Anomaly records, byte for byte."""
    base = canonical(synthetic_job(DetectionPolicy(diagnose_shard_ranks=0)))
    assert base
    for per_shard, shards in ((128, 2), (86, 3), (52, 5)):
        policy = DetectionPolicy(diagnose_shard_ranks=per_shard)
        assert shard_count(256, policy) == shards
        assert canonical(synthetic_job(policy)) == base, shards


def test_a_shard_is_a_pure_function_of_records_that_travel():
    """Each ShardInput and ShardResult pickles (a process pool or another worker can run it), and a
    result that went through pickle merges into the same diagnosis."""
    captured: list[tuple[dict, list]] = []
    unsharded = diagnose_module.diagnose_window_traced

    def keep(rws: dict, cmps: list, policy: DetectionPolicy) -> Any:
        captured.append((rws, cmps))
        return unsharded(rws, cmps, policy)

    diagnose_module.diagnose_window_traced = keep
    try:
        synthetic_job(DetectionPolicy(), windows=4)
    finally:
        diagnose_module.diagnose_window_traced = unsharded
    rws, cmps = captured[-1]
    inputs = split(rws, cmps, 3)
    assert [sorted(i.rank_windows) for i in inputs] == [list(range(0, 86)), list(range(86, 171)),
                                                        list(range(171, 256))]
    results = [pickle.loads(pickle.dumps(diagnose_shard(pickle.loads(pickle.dumps(i))))) for i in inputs]
    merged = merge(reversed(results), cmps, DetectionPolicy())  # the order results come back in is free
    assert (merged.findings, merged.trace) == diagnose_window_traced(rws, cmps, DetectionPolicy())


def test_the_diagnoser_runs_its_shards_through_the_mapper_it_is_given():
    calls: list[int] = []

    def counting_map(fn: Any, inputs: Any) -> Any:
        inputs = list(inputs)
        calls.append(len(inputs))
        return map(fn, inputs)

    d = JobDiagnoser("job", DetectionPolicy(), shards=4, mapper=counting_map)
    for r in range(8):
        d.add("RankWindow", rank_window(r, world=8), 0)
    d.poll(10**6)
    assert calls == [4]


def test_a_window_without_rank_windows_splits_and_merges_as_unsharded():
    """A window evaluated on the timer with comparisons only (its ranks' RankWindows lost): the
    outlier entries go to a shard, and the merge gives what the unsharded path gives."""
    cmp = {"function": "Model.forward", "kind": 3, "outliers": [{"rank": 5, "host": "h", "gpu": 0,
                                                                 "peer_group": "", "cost_ms_per_step": 9.0}]}
    assert split({}, [], 3) == []
    for cmps in ([], [cmp]):
        merged = diagnose_sharded({}, cmps, DetectionPolicy(), 3)
        assert (merged.findings, merged.trace) == diagnose_window_traced({}, cmps, DetectionPolicy())


def test_shard_count_follows_the_job_size():
    policy = DetectionPolicy(diagnose_shard_ranks=16384)
    assert [shard_count(n, policy) for n in (8, 16384, 16385, 100_000)] == [1, 1, 2, 7]
    assert shard_count(100_000, DetectionPolicy()) == 1  # off by default: in one process it only costs
    assert [shard_of(r, 10, 3) for r in range(10)] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
