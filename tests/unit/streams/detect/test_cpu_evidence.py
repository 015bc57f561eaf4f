"""CPU evidence rules: each on both sides of its threshold; the code location; the summarizer."""

from __future__ import annotations

from dataclasses import replace

import pytest
from perftracker_ml.schemas.causes import Cause
from perftracker_ml.schemas.vocabulary import SpanKind
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.cpu_evidence import (
    CONTENDED,
    NOT_CONTENDED,
    UNAVAILABLE,
    UNAVAILABLE_NOTE,
    cpu_verdict,
    frame_location,
)
from perftracker_ml.streams.detect.facts import Outlier
from perftracker_ml.streams.detect.findings import classify, missing_evidence
from perftracker_ml.streams.detect.window import diagnose_window

POL = DetectionPolicy()


def cpu_rw(rank, *, wait=0.2, inv=2.0, steal=0.0, steps=10, frames=(), hz=25.0, cpu=0.95):
    rw = {"rank": rank, "steps": steps, "runqueue_wait_ms_per_step": wait,
          "involuntary_switches_per_step": inv, "steal_pct": steal, "cpu_ratio": cpu, "cpu_samples": 5,
          "stack_hz": hz, "stack_samples": sum(n for _, n in frames),
          "top_frames": [f for f, _ in frames], "top_frame_samples": [n for _, n in frames],
          "top_frame_kinds": [1] * len(frames)}
    return rw


def job(**culprit):
    return {r: cpu_rw(r, **(culprit if r == 2 else {})) for r in range(4)}


@pytest.mark.parametrize("culprit, excess, verdict", [
    # run-queue wait: above peers by max(cpu_wait_min_ms 0.5, 0.25 x excess)
    ({"wait": 0.2 + 2.6}, 10.0, CONTENDED),       # +2.6 >= 2.5
    ({"wait": 0.2 + 2.4}, 10.0, NOT_CONTENDED),   # +2.4 <  2.5
    ({"wait": 0.2 + 0.6}, 1.0, CONTENDED),        # +0.6 >= 0.5 (the floor)
    ({"wait": 0.2 + 0.4}, 1.0, NOT_CONTENDED),
    # involuntary switches: >= 2x the peers and >= 5 more per step
    ({"inv": 7.5}, 10.0, CONTENDED),
    ({"inv": 6.5}, 10.0, NOT_CONTENDED),          # 4.5 more only
    # steal: >= 5 points above the peers
    ({"steal": 5.5}, 10.0, CONTENDED),
    ({"steal": 4.5}, 10.0, NOT_CONTENDED),
])
def test_cpu_verdict_thresholds(culprit, excess, verdict):
    v = cpu_verdict(2, job(**culprit), excess, POL)
    assert v.verdict == verdict
    assert ("more than its peers:" in v.note) == (verdict == CONTENDED)


def busy_host(**culprit):
    """Peers use 30 % of a CPU and wait 2 ms/step, 3 involuntary switches/step (a loaded host)."""
    return {r: cpu_rw(r, **{"wait": 2.0, "inv": 3.0, "cpu": 0.3, **(culprit if r == 2 else {})}) for r in range(4)}


@pytest.mark.parametrize("culprit, verdict", [
    # 3x the CPU per step and 3x the wait and switches: the same wait per CPU-ms as its peers
    ({"cpu": 0.9, "wait": 6.0, "inv": 9.0}, NOT_CONTENDED),
    # the same 3x CPU, but wait above 3x the peers' by more than max(0.5, 0.25 x 10)
    ({"cpu": 0.9, "wait": 6.0 + 2.6}, CONTENDED),
    ({"cpu": 0.9, "wait": 6.0 + 2.4}, NOT_CONTENDED),
    # switches >= 2x the scaled baseline (9) and >= 5 more
    ({"cpu": 0.9, "wait": 6.0, "inv": 18.5}, CONTENDED),
    ({"cpu": 0.9, "wait": 6.0, "inv": 17.5}, NOT_CONTENDED),
    # the peers' CPU, 3x their wait: waiting per unit of work (contention)
    ({"wait": 6.0}, CONTENDED),
])
def test_wait_is_judged_per_cpu_ms_so_more_own_work_is_not_contention(culprit, verdict):
    # the linear baseline alone: the own-work rule (tested below) switched off
    v = cpu_verdict(2, busy_host(**culprit), 10.0, replace(POL, cpu_work_share=1e9, cpu_wait_min_ms=0.5))
    assert v.verdict == verdict, v.note
    if culprit.get("cpu") == 0.9:
        assert v.evidence["expected_runqueue_wait_ms_per_step"] == 6.0
        assert "expected" in v.note


def loaded_host(**culprit):
    """100 steps per 5 s window (50 ms/step); peers use 15 ms of CPU and wait 2 ms per step."""
    return {r: cpu_rw(r, **{"steps": 100, "wait": 2.0, "inv": 3.0, "cpu": 0.3, **(culprit if r == 2 else {})})
            for r in range(4)}


@pytest.mark.parametrize("culprit, verdict", [
    # 20 ms excess; waited 18 ms/step more than expected. Its own extra CPU per step against
    # max(cpu_wait_min_ms 0.5, cpu_work_share 0.25 x 20 = 5 ms):
    ({"cpu": 0.41, "wait": 20.0}, NOT_CONTENDED),   # 20.5 ms of CPU/step: +5.5 ms, its own work
    ({"cpu": 0.39, "wait": 20.0}, CONTENDED),       # 19.5 ms: +4.5 ms, the wait is more than its work
    ({"cpu": 0.3, "wait": 8.0}, CONTENDED),         # a competitor: its peers' CPU, 4x their wait
    ({"cpu": 0.41, "inv": 40.0}, NOT_CONTENDED),    # the switch test too
    ({"cpu": 0.41, "steal": 9.0}, CONTENDED),       # steal is the hypervisor's, never its own work
])
def test_a_rank_whose_own_extra_cpu_work_explains_its_wait_is_not_contended(culprit, verdict):
    v = cpu_verdict(2, loaded_host(**culprit), 20.0, POL)
    assert v.verdict == verdict, v.note
    if verdict == NOT_CONTENDED and "wait" in culprit:
        assert "with work of its own: 20.5 ms of CPU/step vs 15.0 ms" in v.note
        assert v.evidence["cpu_ms_per_step"] == 20.5 and v.evidence["peer_cpu_ms_per_step"] == 15.0


def test_one_slow_cpu_phase_on_a_loaded_host_is_slow_function_not_contention():
    """The live suite's slow optimizer step (load 16 on 2 cores): 5x its peers' CPU per step,
    waited 25 ms/step against 12.7 expected; classed by its phase."""
    rws = {r: cpu_rw(r, steps=85, wait=2.3, inv=3.0, cpu=0.039) for r in range(4)}
    rws[1].update(cpu_ratio=0.215, runqueue_wait_ms_per_step=25.0, involuntary_switches_per_step=11.8)
    v = cpu_verdict(1, rws, 29.1, POL)
    assert v.verdict == NOT_CONTENDED, v.note
    assert classify(ONE_PHASE, -1, {}, POL, v.verdict) == Cause.SLOW_FUNCTION


def test_cpu_verdict_unavailable_without_readings_or_peers():
    old = {r: {"rank": r, "steps": 10} for r in range(4)}  # RankWindow v1: no CPU fields
    v = cpu_verdict(2, old, 10.0, POL)
    assert v.verdict == UNAVAILABLE and "CPU evidence unavailable" in v.note
    lonely = {2: cpu_rw(2, wait=50.0)}
    assert cpu_verdict(2, lonely, 10.0, POL).verdict == UNAVAILABLE
    no_schedstat = {r: cpu_rw(r, wait=-1.0, inv=-1.0, steal=-1.0) for r in range(4)}
    assert cpu_verdict(2, no_schedstat, 10.0, POL).verdict == UNAVAILABLE


def outlier(kind, fn="f", cost=10.0):
    return Outlier(rank=2, kind=int(kind), function=fn, cost_ms_per_step=cost, calls_ratio=1.0, per_call_ratio=1.5)


ONE_PHASE = [outlier(SpanKind.OPTIMIZER, "torch.optim.SGD.step"), outlier(SpanKind.OPTIMIZER, "kind:optimizer")]
MULTI = [outlier(SpanKind.FORWARD, "kind:forward"), outlier(SpanKind.BACKWARD, "kind:backward"),
         outlier(SpanKind.OPTIMIZER, "kind:optimizer")]
MIXED = [outlier(SpanKind.PYTHON, "train.step"), outlier(SpanKind.FORWARD, "kind:forward")]
DEVICE_ONLY = [outlier(SpanKind.DEVICE, "cuda:Net.forward", 12.0)]
DEVICE_AND_HOST_ALIKE = [outlier(SpanKind.DEVICE, "cuda:Net.forward", 12.0), outlier(SpanKind.FORWARD, "Net.forward", 12.0),
                         outlier(SpanKind.FORWARD, "kind:forward", 12.0)]
DEVICE_THEN_HOST_WAITS = [outlier(SpanKind.DEVICE, "cuda:Net.forward", 13.0),
                          outlier(SpanKind.BACKWARD, "torch.autograd.backward", 12.0),
                          outlier(SpanKind.BACKWARD, "kind:backward", 12.0)]


@pytest.mark.parametrize("outs, gpu, cpu, cause", [
    (ONE_PHASE, -1, UNAVAILABLE, Cause.SLOW_FUNCTION),        # was host_cpu_contention (issue 14)
    (ONE_PHASE, -1, NOT_CONTENDED, Cause.SLOW_FUNCTION),
    (ONE_PHASE, -1, CONTENDED, Cause.HOST_CPU_CONTENTION),
    (MULTI, -1, CONTENDED, Cause.HOST_CPU_CONTENTION),
    (MULTI, -1, NOT_CONTENDED, Cause.SLOW_FUNCTION),
    (MULTI, -1, UNAVAILABLE, Cause.SLOW_FUNCTION),            # no scheduler evidence: never contention
    (MIXED, 0, CONTENDED, Cause.HOST_CPU_CONTENTION),
    (MIXED, 0, NOT_CONTENDED, Cause.SLOW_FUNCTION),
    (MIXED, 0, UNAVAILABLE, Cause.SLOW_FUNCTION),
    (MULTI, 0, CONTENDED, Cause.HOST_CPU_CONTENTION),         # a GPU rank's launch thread starved
    (MULTI, 0, NOT_CONTENDED, Cause.SLOW_FUNCTION),           # host spans alone: no GPU-side timing
    (MULTI, 0, UNAVAILABLE, Cause.SLOW_FUNCTION),
    (DEVICE_ONLY, 0, NOT_CONTENDED, Cause.SLOW_GPU),          # device time grew, host time did not
    (DEVICE_ONLY, 0, CONTENDED, Cause.SLOW_GPU),
    (DEVICE_AND_HOST_ALIKE, 0, CONTENDED, Cause.HOST_CPU_CONTENTION),  # the device waited for launches
    (DEVICE_AND_HOST_ALIKE, 0, NOT_CONTENDED, Cause.SLOW_FUNCTION),
    (DEVICE_THEN_HOST_WAITS, 0, UNAVAILABLE, Cause.SLOW_GPU),  # the host waits for it in backward
])
def test_classify_needs_evidence_for_contention_and_for_a_slow_gpu(outs, gpu, cpu, cause):
    assert classify(outs, gpu, {}, POL, cpu) == cause


def test_a_cause_without_its_evidence_says_what_is_missing():
    assert missing_evidence(MULTI, 0, Cause.SLOW_FUNCTION, NOT_CONTENDED) == [
        "GPU-side timing (CUDA-event or kernel times) to tell its GPU from its host"]
    assert missing_evidence(MULTI, -1, Cause.SLOW_FUNCTION, UNAVAILABLE) == [
        "scheduler evidence (run-queue wait) to tell a starved CPU from slow code"]
    assert missing_evidence(DEVICE_AND_HOST_ALIKE, 0, Cause.SLOW_FUNCTION, NOT_CONTENDED) == []


def test_throttle_evidence_wins_over_cpu_evidence_for_gpu_compute():
    assert classify(MULTI, 0, {"throttle_reasons": "0x20"}, POL, CONTENDED) == Cause.GPU_THROTTLE
    assert classify(MIXED, 0, {"throttle_reasons": "0x20"}, POL, CONTENDED) == Cause.HOST_CPU_CONTENTION


def test_frame_location_names_the_frame_with_the_extra_time_above_the_floor():
    hot = "train.py:88 step `x.clone()`"
    rws = {r: cpu_rw(r, frames=[(hot, 10), ("train.py:40 step `loss.backward()`", 100)]) for r in range(4)}
    # 25 Hz: 40 ms per sample; 10 steps. Rank 2: 10 extra samples = 1 per step = 40 ms/step
    rws[2] = cpu_rw(2, frames=[(hot, 20), ("train.py:40 step `loss.backward()`", 100)])
    loc = frame_location(2, rws, POL)
    assert loc["frame"] == hot and loc["extra_ms_per_step"] == pytest.approx(40.0)
    assert frame_location(1, rws, POL) == {}
    # below location_min_ms: 1000 Hz, 1 ms/sample; 0.5 extra samples per step = 0.5 ms
    slow = {r: cpu_rw(r, hz=1000.0, frames=[(hot, 10)]) for r in range(4)}
    slow[2] = cpu_rw(2, hz=1000.0, frames=[(hot, 15)])
    assert frame_location(2, slow, POL) == {}
    slow[2] = cpu_rw(2, hz=1000.0, frames=[(hot, 21)])
    assert frame_location(2, slow, POL)["frame"] == hot
    assert frame_location(2, {r: cpu_rw(r, hz=0.0) for r in range(4)}, POL) == {}


def comparison(kind, fn, rank=2, cost=20.0):
    o = {"rank": rank, "host": f"h{rank}", "gpu": -1, "peer_median_ms_per_step": 10.0,
         "value_ms_per_step": 10.0 + cost, "ratio": 3.0, "robust_z": 20.0, "cost_ms_per_step": cost,
         "calls_ratio": 1.0, "per_call_ratio": 3.0}
    return {"kind": int(kind), "function": fn, "outliers": [o], "stragglers": [], "members": [],
            "mixed_signatures": False, "groups": [], "peer_groups": 1, "peer_median_ms_per_step": 10.0,
            "group_ranks": []}


def test_one_phase_slowdown_is_slow_function_naming_the_phase():
    comps = [comparison(SpanKind.BACKWARD, "torch.autograd.backward"), comparison(SpanKind.BACKWARD, "kind:backward")]
    (f,) = [x for x in diagnose_window(job(), comps, POL) if x.ranks == (2,)]
    assert f.cause == Cause.SLOW_FUNCTION and f.evidence["phase"] == "backward"
    assert f.cpu_note.startswith("slow in its backward only;") and f.evidence["cpu"]["2"]["verdict"] == NOT_CONTENDED


def test_contention_only_with_run_queue_evidence_and_without_it_the_finding_says_what_is_missing():
    comps = [comparison(k, f"kind:{k.name.lower()}") for k in (SpanKind.FORWARD, SpanKind.BACKWARD)]
    (f,) = [x for x in diagnose_window(job(wait=12.0), comps, POL) if x.ranks == (2,)]
    assert f.cause == Cause.HOST_CPU_CONTENTION and f.evidence["cpu"]["2"]["runqueue_wait_ms_per_step"] == 12.0
    assert f.evidence["cpu_basis"] == "scheduler evidence" and f.cpu_note  # what it rests on, rendered in brackets
    old = {r: {"rank": r, "steps": 10} for r in range(4)}
    (g,) = [x for x in diagnose_window(old, comps, POL) if x.ranks == (2,)]
    assert g.cause == Cause.SLOW_FUNCTION and "cpu_basis" not in g.evidence
    assert g.evidence["missing_evidence"] == ["scheduler evidence (run-queue wait) to tell a starved CPU from slow code"]
    assert g.evidence["cpu"]["2"]["verdict"] == UNAVAILABLE and g.cpu_note.endswith(UNAVAILABLE_NOTE)


def test_summarizer_folds_cpu_samples_and_stack_rows_into_the_rank_window():
    from perftracker_ml.streams.detect import RankSummarizer

    from .test_summarize import POL as SPOL
    from .test_summarize import batch
    s = RankSummarizer("job", 0, SPOL)
    b = batch(iters=[(i, 1.0 + 0.1 * i, 50) for i in range(10)], wall_at_s=2.0)
    names = b["names"] + ["/w/train.py step", "x.clone()"]
    sample = {"interval_ns": 10**9, "thread_cpu_ns": 8 * 10**8, "runqueue_wait_ns": 3 * 10**7,
              "voluntary_switches": 10, "involuntary_switches": 40, "major_faults": 1, "load1": 3.0,
              "steal_pct": 2.0, "cpus": 8, "stack_samples": 25, "stack_hz": 25.0}
    b.update(names=names, cpu=[sample, {**sample, "runqueue_wait_ns": -1}],
             stacks={"frame": [5, 5, 99], "line": [88, 88, 1], "kind": [1, 0, 1], "count": [20, 20, 1],
                     "code": [6, -1, -1]})
    s.add_events(b)
    s.add_events(batch(seq=2, spans=[(1, 0, 6.0, 10)], wall_at_s=7.0))
    (rw,) = [r for n, r in s.poll(now_wall_ms=0) if n == "RankWindow"]
    assert rw["cpu_samples"] == 2 and rw["cpu_ratio"] == 0.8 and rw["major_faults"] == 2
    assert rw["runqueue_wait_ms_per_step"] == pytest.approx(3.0)  # the unknown one left out
    assert rw["involuntary_switches_per_step"] == 8.0 and rw["steal_pct"] == 2.0 and rw["load1"] == 3.0
    assert rw["top_frames"] == ["/w/train.py:88 step `x.clone()`", "/w/train.py:88 step"]
    assert rw["top_frame_kinds"] == [1, 0] and rw["stack_samples"] == 50 and rw["stack_hz"] == 25.0
    assert s.skipped["bad_name_index"] == 1


def test_old_batches_give_a_window_without_cpu_evidence():
    from perftracker_ml.streams.detect import RankSummarizer

    from .test_summarize import POL as SPOL
    from .test_summarize import batch
    s = RankSummarizer("job", 0, SPOL)
    s.add_events(batch(iters=[(1, 1.0, 50)], wall_at_s=2.0))
    s.add_events(batch(seq=2, spans=[(1, 0, 6.0, 10)], wall_at_s=7.0))
    (rw,) = [r for n, r in s.poll(now_wall_ms=0) if n == "RankWindow"]
    assert rw["cpu_samples"] == 0 and rw["cpu_ratio"] == -1 and rw["runqueue_wait_ms_per_step"] == -1
    assert rw["top_frames"] == []


def test_late_arriver_incident_names_the_file_and_line_of_its_extra_time():
    import json

    from perftracker_ml.streams.detect import DetectionPolicy

    from .test_diagnose import opened, run_events
    # opened on its second window (persistence in windows): the stack samples of a whole faulty window
    windows_only = DetectionPolicy(window_s=2.0, window_grace_s=1.0, persist_steps=0)
    (a,) = opened(run_events("slow-collective", policy=windows_only))
    loc = json.loads(a["evidence_json"])["location"]
    assert a["ranks"] == [2] and loc["frame"] == "/job/train.py:88 step `x.clone()`"
    assert loc["extra_ms_per_step"] > 5


def test_simulated_contention_is_named_from_run_queue_evidence():
    import json

    from .test_diagnose import opened, run_events
    (a,) = opened(run_events("cpu-contention"))
    ev = json.loads(a["evidence_json"])
    assert a["cause"] == "host_cpu_contention" and ev["cpu_basis"] == "scheduler evidence"


def test_frame_location_prefers_a_clear_excess_to_a_larger_noisy_one():
    """The live suite's checkpoint run: rank 2 saves a checkpoint every other step (a frame only
    it runs: a few samples against none) and, like every rank, waits in the step's all-reduce
    (hundreds of samples each, the difference within sampling noise). Named: the save."""
    save, sync = "train.py:212 after_step `torch.save(...)`", "train.py:233 job_sync `dist.all_reduce(flags)`"
    steps = 200  # 25 Hz, 40 ms per sample: 1 extra sample per 200 steps = 0.2 ms/step
    rws = {r: cpu_rw(r, steps=steps, frames=[(sync, n)]) for r, n in ((0, 20), (1, 21), (3, 19))}
    rws[2] = cpu_rw(2, steps=steps, frames=[(sync, 27), (save, 6)])  # +1.4 ms/step vs +1.2 ms/step
    loc = frame_location(2, rws, POL)
    assert loc["frame"] == save and loc["extra_ms_per_step"] == pytest.approx(1.2)
    assert loc["noise_ms_per_step"] == pytest.approx(40 * 6 ** 0.5 / steps, abs=0.01)
    # both clear (well beyond their noise): the larger one wins
    rws = {r: cpu_rw(r, steps=steps, frames=[(sync, 200)]) for r in (0, 1, 3)}
    rws[2] = cpu_rw(2, steps=steps, frames=[(sync, 400), (save, 60)])  # +40 +- 4.5 vs +12 +- 1.5 ms/step
    assert frame_location(2, rws, POL)["frame"] == sync
