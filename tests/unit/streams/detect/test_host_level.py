"""Host-level causes (host_level.py): a late arriver with scheduler evidence of waiting for a CPU is
host CPU contention, one finding per host, joined by the host's other ranks with the same
evidence; without that evidence, or on another host, nothing is merged or joined.

The jobs are two "hosts" of two ranks (node-0: ranks 0, 1; node-1: ranks 2, 3), as in the
two-node e2e test. With half the ranks slow, peer outliers cannot flag them (the median sits
between the two halves); the late arrival at the all-reduce and the run-queue wait can.
"""

from __future__ import annotations

from perftracker_ml.schemas.causes import Cause
from perftracker_ml.schemas.vocabulary import Kind, SpanKind
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.window import diagnose_window

from .test_cpu_evidence import comparison, cpu_rw

POL = DetectionPolicy()
ALLREDUCE = "comm:all_reduce:pg0-4-abc"


def job(waits: dict[int, float]) -> dict[int, dict]:
    """RankWindows of the 2x2 job; ``waits``: run-queue wait ms/step of the ranks not at 0.2."""
    return {r: {**cpu_rw(r, wait=waits.get(r, 0.2)), "host": f"node-{r // 2}", "gpu": -1} for r in range(4)}


def straggler(rank: int, fraction: float = 0.55, caused: float = 9.0) -> dict:
    return {"rank": rank, "host": f"node-{rank // 2}", "gpu": -1, "late_seqs": int(100 * fraction),
            "late_fraction": fraction, "caused_ms_per_step": caused, "p_value": 1e-12}


def allreduce(*late: dict) -> dict:
    return {"kind": int(SpanKind.COLLECTIVE), "function": ALLREDUCE, "outliers": [], "stragglers": list(late),
            "members": [0, 1, 2, 3], "member_wait_ms_per_step": [9.0, 9.0, 1.0, 1.0], "mixed_signatures": False,
            "seqs_compared": 100, "transfer_ms_median": 0.1, "transfer_ms_per_step": 0.2, "groups": [],
            "peer_groups": 1}


def blamed(findings) -> list:
    return [f for f in findings if f.ranks]


def test_late_arriver_that_waited_for_a_cpu_is_its_hosts_contention_joined_by_its_host_peer():
    (f,) = blamed(diagnose_window(job({2: 22.0, 3: 17.0}), [allreduce(straggler(3))], POL))
    assert f.cause == Cause.HOST_CPU_CONTENTION and f.kind == Kind.STRAGGLER
    assert f.ranks == (2, 3) and f.hosts == ("node-1",) and f.identity == "host_cpu_contention|node-1"
    assert f.evidence["cpu"]["3"]["runqueue_wait_ms_per_step"] == 17.0 and f.subject == ""
    assert f.evidence["joined_ranks"] == [2] and f.evidence["cpu"]["2"]["verdict"] == "contended"
    assert f.evidence["cpu_basis"] == "scheduler evidence"


def test_two_late_arrivers_of_one_contended_host_are_one_finding():
    (f,) = blamed(diagnose_window(job({2: 22.0, 3: 17.0}), [allreduce(straggler(2, 0.45), straggler(3))], POL))
    assert f.ranks == (2, 3) and f.hosts == ("node-1",) and "joined_ranks" not in f.evidence
    assert sorted(m["ranks"] for m in f.evidence["merged"]) == [[2], [3]]


def test_rank_outlier_and_late_arriver_of_one_contended_host_are_one_finding():
    cpu_phases = [comparison(k, f"kind:{k.name.lower()}", rank=3) for k in (SpanKind.FORWARD, SpanKind.BACKWARD)]
    for c in cpu_phases:
        c["outliers"][0]["host"] = "node-1"
    (f,) = blamed(diagnose_window(job({2: 22.0, 3: 30.0}), [*cpu_phases, allreduce(straggler(2))], POL))
    assert f.cause == Cause.HOST_CPU_CONTENTION and f.ranks == (2, 3) and f.hosts == ("node-1",)
    assert sorted(m["kind"] for m in f.evidence["merged"]) == ["outlier", "straggler"]


def test_late_arriver_without_cpu_evidence_stays_a_late_entry_of_its_rank():
    (f,) = blamed(diagnose_window(job({}), [allreduce(straggler(3))], POL))
    assert f.cause == Cause.SLOW_FUNCTION and f.ranks == (3,) and f.identity == "late|3"
    assert f.evidence["location"] == {} and f.evidence["cpu"]["3"]["verdict"] == "not_contended"  # no stack samples


def test_host_peer_without_cpu_evidence_is_not_joined():
    (f,) = blamed(diagnose_window(job({3: 17.0}), [allreduce(straggler(3))], POL))
    assert f.cause == Cause.HOST_CPU_CONTENTION and f.ranks == (3,) and f.hosts == ("node-1",)
    assert "merged" not in f.evidence


def test_contended_rank_of_another_host_is_not_joined():
    # rank 1 (node-0) waited for a CPU too, but it is not late and not on node-1
    (f,) = blamed(diagnose_window(job({1: 17.0, 3: 17.0}), [allreduce(straggler(3))], POL))
    assert f.ranks == (3,) and f.hosts == ("node-1",)


def test_host_peer_named_by_another_finding_is_not_joined():
    slow = comparison(SpanKind.PYTHON, "train.step", rank=2)
    slow["outliers"][0]["host"] = "node-1"
    findings = blamed(diagnose_window(job({2: 22.0, 3: 17.0}), [slow, allreduce(straggler(3))], POL))
    assert sorted((f.cause, f.ranks) for f in findings) == [(Cause.HOST_CPU_CONTENTION, (3,)),
                                                           (Cause.SLOW_FUNCTION, (2,))]


def test_ranks_of_an_unknown_host_are_not_joined():
    rws = {r: {**rw, "host": ""} for r, rw in job({2: 22.0, 3: 17.0}).items()}
    (f,) = blamed(diagnose_window(rws, [allreduce({**straggler(3), "host": ""})], POL))
    assert f.cause == Cause.HOST_CPU_CONTENTION and f.ranks == (3,)


def sampled_job(rank_frames: dict[int, list]) -> dict[int, dict]:
    """The 2x2 job with 25 Hz stack samples: every rank the same user frames unless given."""
    same = [("train.py:40 step `loss.backward()`", 100), ("train.py:52 step `dist.all_reduce(x)`", 50)]
    return {r: {**cpu_rw(r, frames=rank_frames.get(r, same)), "host": f"node-{r // 2}", "gpu": -1} for r in range(4)}


def test_a_late_entry_whose_stacks_and_cpu_match_its_peers_is_not_raised():
    """Shortest time inside in 55 % of calls, but its samples show no extra time anywhere and it
    did not wait for a CPU: scheduling skew of an oversubscribed host, nothing to show late."""
    assert blamed(diagnose_window(sampled_job({}), [allreduce(straggler(3))], POL)) == []


def test_a_late_entry_with_a_frame_of_extra_time_is_raised_with_that_frame():
    frames = [("train.py:40 step `loss.backward()`", 100), ("train.py:52 step `dist.all_reduce(x)`", 50),
              ("train.py:48 step `time.sleep(0.02)`", 30)]  # 3 samples/step x 40 ms: 120 ms/step more
    (f,) = blamed(diagnose_window(sampled_job({3: frames}), [allreduce(straggler(3))], POL))
    assert f.ranks == (3,) and f.cause == Cause.SLOW_FUNCTION
    assert f.evidence["location"]["frame"] == "train.py:48 step `time.sleep(0.02)`"


def test_a_late_entry_without_samples_to_judge_is_still_raised():
    (f,) = blamed(diagnose_window(job({}), [allreduce(straggler(3))], POL))
    assert f.ranks == (3,) and f.evidence["location"] == {} and f.identity == "late|3"


def test_a_late_entry_with_alike_stacks_that_waited_for_a_cpu_is_contention():
    rws = sampled_job({})
    rws[3]["runqueue_wait_ms_per_step"] = 17.0
    (f,) = blamed(diagnose_window(rws, [allreduce(straggler(3))], POL))
    assert f.cause == Cause.HOST_CPU_CONTENTION and 3 in f.ranks


PAIR = "comm:all_reduce:pg2-2-abc"


def pair(late: dict) -> dict:
    return {**allreduce(late), "function": PAIR, "members": [2, 3], "member_wait_ms_per_step": [0.2, 2.4]}


def world(waits: list[float]) -> dict:
    return {**allreduce(), "member_wait_ms_per_step": waits}


def test_a_late_arriver_that_waited_elsewhere_like_every_member_is_no_propagated_victim():
    """Live fault suite, checkpoint: rank 2 late into its pair group (saving a checkpoint
    before it), waiting in the world all_reduce no more than the group's other members."""
    late = straggler(2, 0.8, 2.4)
    (f,) = blamed(diagnose_window(job({}), [pair(late), world([6.0, 6.5, 6.2, 5.8])], POL))
    assert f.ranks == (2,) and f.function == PAIR and f.kind == Kind.STRAGGLER


def test_a_late_arriver_held_up_in_another_collective_is_a_propagated_victim():
    """Rank 2 late into its pair group because it waited 30 ms/step in the world all_reduce
    for ranks that came from another group late (no straggler listed there): not a culprit."""
    late = straggler(2, 0.8, 2.4)
    assert blamed(diagnose_window(job({}), [pair(late), world([1.0, 1.2, 30.0, 29.0])], POL)) == []


def test_a_late_arriver_whose_other_group_is_not_compared_yet_is_not_raised():
    """Live fault suite, host-copies: the window was evaluated on the timer before the pair
    group's comparison came; whether rank 2 waited there for someone cannot be told."""
    rws = job({})
    rws[2]["functions"] = [ALLREDUCE, PAIR]
    assert blamed(diagnose_window(rws, [allreduce(straggler(2))], POL)) == []


def test_a_late_arriver_whose_other_group_is_compared_without_a_wait_is_raised():
    rws = job({})
    rws[2]["functions"] = [ALLREDUCE, PAIR]
    quiet_pair = {**allreduce(), "function": PAIR, "members": [2, 3], "member_wait_ms_per_step": [0.2, 0.3]}
    (f,) = blamed(diagnose_window(rws, [allreduce(straggler(2)), quiet_pair], POL))
    assert f.ranks == (2,) and f.function == ALLREDUCE


def late_entry_windows(late_in: list[bool]) -> list[list[list[int]]]:
    """A 4-rank job at 250 steps a window (persist_steps met by one window) and default
    persistence; rank 3 last into the all_reduce in the windows of ``late_in``; the ranks of
    the incidents opened by each window."""
    from perftracker_ml.streams.detect import JobDiagnoser

    from .synth import T0_WINDOW, W_MS, rank_window

    pol = DetectionPolicy(window_s=5.0, window_grace_s=3.0, persist_windows=2, persist_steps=50)
    d, out = JobDiagnoser("job", pol), []
    for i, late in enumerate([False, *late_in]):  # the first window is the job's start-up
        w, now = T0_WINDOW + i, (T0_WINDOW + i + 1) * W_MS + 600
        cmp = {**allreduce(*([straggler(3)] if late else [])), "job": "job", "window_id": w,
               "member_max_seq": [100 * (i + 1)] * 4, "median_ms_per_step": 1.0}
        d.add("FunctionComparison", cmp, now)
        for r in range(4):
            rw = {**rank_window(r, window=w, steps=250, world=4, step_ms=10.0, functions=[ALLREDUCE]),
                  **cpu_rw(r, steps=250), "host": f"node-{r // 2}", "gpu": -1}
            d.add("RankWindow", rw, now)
        out.append([a["ranks"] for a in d.poll(now + 20_000)[0] if a["status"] == "OPEN"])
    return out[1:]


def test_a_late_entry_seen_in_one_window_of_many_steps_opens_nothing():
    """Live fault suite: 7 late entries naming ranks with no fault, each one window long."""
    assert late_entry_windows([True, False, False]) == [[], [], []]


def test_a_late_entry_seen_in_two_consecutive_windows_opens():
    assert late_entry_windows([True, True]) == [[], [[3]]]


def test_a_one_window_analysis_still_names_a_late_entry_at_once():
    (f,) = blamed(diagnose_window(job({}), [allreduce(straggler(3))], DetectionPolicy(persist_windows=1)))
    assert f.ranks == (3,) and f.extra_windows == 0


def test_the_culprit_is_no_victim_of_a_group_whose_only_late_arriver_it_held_up():
    """Live fault suite, host-copies (windows as measured): rank 3 late into its pair group in
    100 % of calls (19.6 ms/step caused); rank 2, held up there, last into the world
    all_reduce in 47 %. Rank 3 is the culprit, rank 2 only propagates its delay."""
    held_up = {**pair(straggler(3, 1.0, 19.6)), "member_wait_ms_per_step": [19.6, 0.1]}
    world_late = {**world([0.5, 0.6, 1.0, 0.4]), "member_wait_ms_per_step": [12.7, 12.6, 0.5, 0.4],
                  "stragglers": [straggler(2, 0.47, 8.9)]}
    (f,) = blamed(diagnose_window(job({}), [held_up, world_late], POL))
    assert f.ranks == (3,) and f.function == PAIR and f.kind == Kind.STRAGGLER



def minor(fn: str, kind: SpanKind, cost: float, rank: int = 3) -> dict:
    """A comparison whose only excess is a minor outlier of ``rank`` (4x the calls, ``cost`` ms/step)."""
    o = {"rank": rank, "host": f"node-{rank // 2}", "gpu": -1, "peer_group": "s", "peer_median_ms_per_step": 0.4,
         "value_ms_per_step": 0.4 + cost, "ratio": (0.4 + cost) / 0.4, "robust_z": 30.0, "cost_ms_per_step": cost,
         "calls_ratio": 4.0, "per_call_ratio": 1.0, "intermittent": False}
    return {"kind": int(kind), "function": fn, "outliers": [], "minor_outliers": [o], "stragglers": [],
            "members": [], "mixed_signatures": False, "groups": [], "peer_groups": 1}


def phases(cost: float) -> list[dict]:
    return [minor("kind:forward", SpanKind.FORWARD, cost), minor("Net.forward", SpanKind.FORWARD, cost),
            minor("kind:backward", SpanKind.BACKWARD, cost), minor("kind:dataloader", SpanKind.DATALOADER, cost)]


def test_a_late_arriver_explained_by_small_excesses_in_every_phase_gets_their_cause():
    """Rank 3 has 4x the calls of its peers in forward, backward and data loading, each +0.8 ms/step
    (under the 1 ms a finding needs alone), and the others wait 2.4 ms/step for it: the three
    phases' sum (the named forward, nested in its phase, is not added again)."""
    (f,) = blamed(diagnose_window(job({}), [*phases(0.8), allreduce(straggler(3, caused=2.4))], POL))
    assert f.ranks == (3,) and f.cause == Cause.DATA_IMBALANCE and abs(f.impact_ms - 2.4) < 1e-6
    assert f.kind == Kind.IMBALANCE and "location" not in f.evidence  # its excesses, not a late entry


def test_small_excesses_that_explain_too_little_of_the_wait_leave_the_late_entry():
    # 3 x 0.5 = 1.5 ms/step < 0.7 x 2.4: most of the wait is elsewhere (uninstrumented code)
    (f,) = blamed(diagnose_window(job({}), [*phases(0.5), allreduce(straggler(3, caused=2.4))], POL))
    assert f.ranks == (3,) and f.cause == Cause.SLOW_FUNCTION and f.identity == "late|3"


def test_minor_outliers_of_a_rank_that_is_not_late_are_no_finding():
    assert blamed(diagnose_window(job({}), [*phases(0.8), allreduce()], POL)) == []


def test_a_host_peer_with_a_trace_of_the_culprits_cpu_wait_is_not_joined():
    # rank 3 waited 16.8 ms/step above its peers, rank 2 only 3.8: contended too, but not alike
    (f,) = blamed(diagnose_window(job({2: 4.0, 3: 17.0}), [allreduce(straggler(3))], POL))
    assert f.ranks == (3,) and f.cause == Cause.HOST_CPU_CONTENTION and "joined_ranks" not in f.evidence


def outlier_of(fn: str, kind: SpanKind, cost: float, rank: int = 3) -> dict:
    """A comparison where ``rank`` is an outlier (a finding on its own) costing ``cost`` ms/step."""
    c = minor(fn, kind, cost, rank)
    c["outliers"], c["minor_outliers"] = c["minor_outliers"], []
    c["outliers"][0].update(calls_ratio=1.0, per_call_ratio=(0.4 + cost) / 0.4)
    return c


def test_an_outlier_that_explains_a_small_part_of_the_wait_leaves_the_late_entry_with_it_as_evidence():
    """Live fault suite, host-copies (2026-11-27): rank 1 cloned tensors in untimed code for
    20 ms a step; the clones' garbage gave it kind:gc 1.8 ms/step against 0.1 on its peers, and
    it was named gc_pause "costs the job ~22.6 ms per step". 1.7 ms/step explains less than
    0.7 of the 19.8 the others wait for it: the late entry is the finding, the GC its evidence."""
    gc = outlier_of("kind:gc", SpanKind.GC, 1.7)
    (f,) = blamed(diagnose_window(job({}), [gc, allreduce(straggler(3, 1.0, 19.8))], POL))
    assert f.cause == Cause.SLOW_FUNCTION and f.kind == Kind.STRAGGLER and f.identity == "late|3"
    assert abs(f.impact_ms - 19.8) < 1e-6
    assert f.evidence["abnormal_functions"] == ["kind:gc"] and f.evidence["explained_ms_per_step"] == 1.7


def test_an_outlier_that_explains_most_of_the_wait_stays_the_finding():
    gc = outlier_of("kind:gc", SpanKind.GC, 15.0)
    (f,) = blamed(diagnose_window(job({}), [gc, allreduce(straggler(3, 1.0, 19.8))], POL))
    assert f.cause == Cause.GC_PAUSE and f.kind == Kind.OUTLIER and abs(f.impact_ms - 19.8) < 1e-6


def test_a_late_arriver_given_more_work_is_data_imbalance_even_when_its_outliers_explain_little():
    """Live fault suite, data-imbalance (2026-11-27): rank 0 got more samples per step; its data
    loader and forward made 6.2 of the 9.4 ms/step the others waited (its extra backward is not
    instrumented). More work is slower everywhere: the imbalance is the finding, no late entry
    beside it names an "uninstrumented" line."""
    loader = outlier_of("kind:dataloader", SpanKind.DATALOADER, 3.0)
    loader["outliers"][0].update(calls_ratio=2.0, per_call_ratio=1.0)
    (f,) = blamed(diagnose_window(job({}), [loader, allreduce(straggler(3, 1.0, 9.4))], POL))
    assert f.cause == Cause.DATA_IMBALANCE and f.ranks == (3,)
    # the same excess at the same number of calls (each call slower) leaves the late entry
    slow = outlier_of("kind:dataloader", SpanKind.DATALOADER, 3.0)
    (g,) = blamed(diagnose_window(job({}), [slow, allreduce(straggler(3, 1.0, 9.4))], POL))
    assert g.kind == Kind.STRAGGLER and g.identity == "late|3"
