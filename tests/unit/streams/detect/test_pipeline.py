"""The window's rules as a pipeline (pipeline.py) and the decision trace (decisions.py): the
order of the rules, a reason for every clearance, the trace of a cleared and of a named rank,
the trace kept with the incident, and the per-rule counts the worker exports."""

from __future__ import annotations

import dataclasses

from perftracker_ml.schemas.causes import Cause
from perftracker_ml.schemas.vocabulary import Kind, SpanKind
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.decisions import (
    ADDED,
    CLEARED,
    FLAGGED,
    NOT_FLAGGED,
    DecisionTrace,
)
from perftracker_ml.streams.detect.findings import IN_WINDOW, INTERMITTENT, Finding, words_of
from perftracker_ml.streams.detect.pipeline import RULES, Diagnosis, WindowFacts, run
from perftracker_ml.streams.detect.render import placed, summary_of
from perftracker_ml.streams.detect.window import diagnose_window_traced, step_ms

from .test_host_level import allreduce, job, pair, sampled_job, straggler, world

POL = DetectionPolicy()


def test_the_rules_run_in_one_readable_order():
    assert [name for name, _, _ in RULES] == [
        "rank_outliers", "stage_shape", "stragglers", "absorbed", "slow_links", "minor_excesses", "uncompared",
        "partial_outliers", "rank_causes", "late_entries", "host_level", "links", "stage_imbalance",
        "expectations"]
    assert all(what for _, _, what in RULES)  # each says what it adds or clears


def test_every_rule_returns_an_outcome_and_every_clearance_has_a_rule_and_a_reason():
    windows = [
        (sampled_job({}), [allreduce(straggler(3))]),  # late with nothing behind it
        (job({}), [pair(straggler(2, 0.8, 2.4)), world([1.0, 1.2, 30.0, 29.0])]),  # propagated victim
        (job({2: 22.0, 3: 17.0}), [allreduce(straggler(3))]),  # named
    ]
    for rws, comps in windows:
        facts = WindowFacts(rws, comps, step_ms(rws), POL)
        d = Diagnosis()
        for name, rule, _ in RULES:
            out = rule(facts, d)
            assert set(out.state) <= set(Diagnosis.__dataclass_fields__), name
            d = Diagnosis(**{**d.__dict__, **dict(out.state)})
        _, trace = run(facts)
        for dec in trace.decisions:
            assert dec.rule in {n for n, _, _ in RULES} and dec.reason, dec
            assert dec.action in (ADDED, CLEARED, FLAGGED)


def test_the_trace_says_why_a_late_arriver_with_nothing_behind_it_was_not_named():
    findings, trace = diagnose_window_traced(sampled_job({}), [allreduce(straggler(3))], POL)
    assert not [f for f in findings if f.ranks]
    actions = [(d.rule, d.action) for d in trace.of(3)]
    assert actions == [("stragglers", FLAGGED), ("late_entries", CLEARED)]
    (cleared,) = [d for d in trace.of(3) if d.action == CLEARED]
    assert cleared.evidence["group"] == "comm:all_reduce:pg0-4-abc" and cleared.evidence["cpu"] == "not_contended"
    assert trace.explain(1, findings) == f"rank 1 was not named: {NOT_FLAGGED}"


def test_the_trace_names_a_propagated_victim_and_the_collective_it_waited_in():
    findings, trace = diagnose_window_traced(job({}), [pair(straggler(2, 0.8, 2.4)),
                                                       world([1.0, 1.2, 30.0, 29.0])], POL)
    (cleared,) = [d for d in trace.of(2) if d.action == CLEARED]
    assert cleared.rule == "stragglers" and cleared.evidence["waited_in"] == "comm:all_reduce:pg0-4-abc"
    assert cleared.evidence["caused_ms_per_step"] == 2.4 and "propagated victim" in cleared.reason


def test_the_trace_of_a_named_rank_gives_the_rule_and_the_finding():
    findings, trace = diagnose_window_traced(job({2: 22.0, 3: 17.0}), [allreduce(straggler(3))], POL)
    (f,) = [f for f in findings if f.ranks]
    assert f.cause == Cause.HOST_CPU_CONTENTION and f.ranks == (2, 3)
    added = [d for d in trace.of(3) if d.action == ADDED]
    assert [(d.rule, d.identity) for d in added] == [("late_entries", "host_cpu_contention|node-1")]
    assert added[0].evidence == {"cause": "host_cpu_contention", "kind": "straggler",
                                 "function": "comm:all_reduce:pg0-4-abc", "impact_ms_per_step": 9.0}
    joined = [d for d in trace.of(2) if d.rule == "host_level"]
    assert [d.action for d in joined] == [FLAGGED] and joined[0].evidence["verdict"] == "contended"
    assert trace.explain(3, findings).startswith("rank 3 was named (host_cpu_contention|node-1)")


def test_an_incident_keeps_a_bounded_copy_of_the_trace_its_own_ranks_first():
    trace = DecisionTrace()
    f = Finding(kind=Kind.STRAGGLER, cause=Cause.SLOW_FUNCTION, identity="late|3", ranks=(3,), hosts=("h",),
                gpus=(-1,), function="comm:x", score=1.0, impact_ms=2.0, summary="rank 3 on h: late")
    from perftracker_ml.streams.detect.decisions import Clearance, RuleOutcome
    trace.record("absorbed", RuleOutcome(cleared=[Clearance(r, "absorbed", "why", {}) for r in range(40)]))
    trace.add("late_entries", f)
    kept = trace.for_finding(f, limit=5)
    assert len(kept) == 5 and kept[0]["rank"] == 3 and kept[1]["rank"] == 3
    assert {k["action"] for k in kept[:2]} == {ADDED, CLEARED} and kept[0]["rule"] == "absorbed"
    assert trace.counts()[("absorbed", CLEARED)] == 40 and trace.counts()[("late_entries", ADDED)] == 1


def test_a_summary_is_rendered_from_the_findings_fields():
    f = Finding(kind=Kind.OUTLIER, cause=Cause.SLOW_GPU, identity="slow_gpu|1", ranks=(1,), hosts=("h",),
                gpus=(0,), function="kind:forward", score=1.0, impact_ms=2.0, summary="rank 1 on h: slow",
                subject="rank 1")
    rws = {1: {"mesh_coords": {"pp": 1, "dp": 0}, "gpu_uuid": "GPU-abc", "gpu": 0, "host": "h"}}
    p = placed(f, rws)  # type: ignore[arg-type]
    assert p.mesh_coords == {"pp": 1, "dp": 0} and p.gpu_label == "GPU 0 GPU-abc on h"
    assert p.evidence["gpu_uuids"] == {"1": "GPU-abc"} and p.summary == f.summary  # fields, not words, so far
    assert summary_of(p) == "rank 1 (pp=1, dp=0) on h: slow [GPU 0 GPU-abc on h]"
    no_subject = placed(Finding(**{**f.__dict__, "subject": "", "summary": "slow link"}), rws)  # type: ignore[arg-type]
    assert summary_of(no_subject) == "rank 1 (pp=1, dp=0): slow link [GPU 0 GPU-abc on h]"


def test_a_findings_qualifiers_are_rendered_after_its_rules_words_in_order():
    f = Finding(kind=Kind.OUTLIER, cause=Cause.SLOW_FUNCTION, identity="slow_function|1", ranks=(1,), hosts=("h",),
                gpus=(-1,), function="f", score=1.0, impact_ms=2.0, summary="rank 1 on h: f is slow", subject="rank 1",
                onset=INTERMITTENT, cpu_note="slow in its backward only; no CPU wait", hot_frame=(1, 4.25, "t.py:3"))
    assert words_of(f) == ("rank 1 on h: f is slow (intermittent: the slow tail, not every call) "
                           "[slow in its backward only; no CPU wait] - rank 1 spends 4.2 ms/step more than its peers "
                           "in t.py:3")
    placed_f = dataclasses.replace(f, mesh_coords={"dp": 1}, onset=IN_WINDOW, cpu_note="", hot_frame=None)
    assert summary_of(placed_f) == ("rank 1 (dp=1) on h: f is slow (began inside this window: every step of the "
                                    "rank since is slower)")
    assert f.summary == "rank 1 on h: f is slow"  # the rule's words are never edited


def test_the_rules_set_qualifiers_as_fields_and_a_host_merge_says_each_parts_words_once():
    from .test_cpu_evidence import comparison, cpu_rw

    hot, other = "train.py:88 step `x.clone()`", "train.py:40 step `loss.backward()`"
    rws = {r: cpu_rw(r, frames=[(hot, 20 if r == 2 else 10), (other, 100)]) for r in range(4)}
    comps = [comparison(SpanKind.BACKWARD, "torch.autograd.backward"), comparison(SpanKind.BACKWARD, "kind:backward")]
    (f,) = [x for x in diagnose_window_traced(rws, comps, POL)[0] if x.ranks == (2,)]
    assert f.hot_frame == (2, 40.0, hot) and f.cpu_note.startswith("slow in its backward only")
    assert f.summary.endswith(f"[{f.cpu_note}] - rank 2 spends 40.0 ms/step more than its peers in {hot}")

    cpu_phases = [comparison(k, f"kind:{k.name.lower()}", rank=3) for k in (SpanKind.FORWARD, SpanKind.BACKWARD)]
    for c in cpu_phases:
        c["outliers"][0]["host"] = "node-1"
    rws = job({2: 22.0, 3: 30.0})
    facts = WindowFacts(rws, [*cpu_phases, allreduce(straggler(2))], step_ms(rws), POL)
    d = Diagnosis()
    for name, rule, _ in RULES:
        if name == "host_level":
            parts = d.findings
        d = dataclasses.replace(d, **dict(rule(facts, d).state))
    assert any(p.cpu_note for p in parts)  # the rank finding's, a field until rendered
    (m,) = [x for x in d.findings if x.ranks]
    assert m.cause == Cause.HOST_CPU_CONTENTION and (m.onset, m.cpu_note, m.hot_frame) == ("", "", None)
    assert all(m.summary.count(words_of(p)) == 1 for p in parts)
    assert m.summary.startswith("ranks 2,3 on node-1: CPU contention on the host - ")
    (joined,) = [x for x in diagnose_window_traced(job({2: 22.0, 3: 17.0}), [allreduce(straggler(3))], POL)[0]
                 if x.ranks]
    assert "run-queue wait 17.0 ms/step" in joined.summary and "; rank 2: it waited for a CPU" in joined.summary


def test_a_rank_whose_stalls_make_no_periodic_stall_is_cleared_with_why():
    from perftracker_ml.streams.detect.stalls import StallHistory, periodic_stalls_traced

    from .test_stalls import STEP_MS, STEPS, compare, patterns
    h = StallHistory.for_policy(POL)
    rec = compare(patterns({100: (2, 400.0)}))  # one stall: too few to be periodic
    h.note(0, [rec], {r: {"steps": STEPS} for r in range(4)}, POL)  # type: ignore[dict-item]
    found, cleared = periodic_stalls_traced(h, 0, STEP_MS, set(), POL)
    assert found == [] and [(c.rank, c.evidence["stalls"]) for c in cleared] == [(2, 1)]
    assert "too few" in cleared[0].reason
