import numpy as np
from perftracker_ml.streams.detect import DetectionPolicy, FunctionComparator

from .synth import comm_pattern, pattern

POL = DetectionPolicy()


def evaluate(function, patterns, policy=POL):
    c = FunctionComparator("job", function, policy)
    for p in patterns:
        c.add(p, now_wall_ms=1000)
    if c.complete(int(patterns[0]["window_id"])):  # every expected rank in: evaluated at once
        (rec,) = c.poll(1000)
        return rec, c
    assert c.poll(1000 + policy.grace_ms) == []  # grace not over yet
    (rec,) = c.poll(1001 + policy.grace_ms)
    return rec, c


def test_slow_rank_is_an_outlier_with_evidence():
    rng = np.random.default_rng(1)
    pats = [pattern(r, "Model.forward", 100 * rng.lognormal(0, 0.02)) for r in range(16)]
    pats[5] = pattern(5, "Model.forward", 140.0)
    rec, _ = evaluate("Model.forward", pats)
    (o,) = rec["outliers"]
    assert o["rank"] == 5 and 1.3 < o["ratio"] < 1.5 and o["robust_z"] > 5 and o["cost_ms_per_step"] > 30


def test_legitimate_group_difference_is_not_an_outlier():
    pats = [pattern(r, "kind:forward", 100.0 if r < 8 else 150.0, signature="a" if r < 8 else "b")
            for r in range(16)]
    rec, _ = evaluate("kind:forward", pats)
    assert rec["outliers"] == [] and rec["peer_groups"] == 2
    assert sorted(g["median_ms_per_step"] for g in rec["groups"]) == [100.0, 150.0]


def test_configured_peer_groups_override_signatures():
    pol = DetectionPolicy(peer_groups="a=0-7;b=8-15")
    pats = [pattern(r, "f", 100.0 if r < 8 else 150.0, signature="same") for r in range(16)]
    rec, _ = evaluate("f", pats, pol)
    assert rec["outliers"] == [] and {g["key"] for g in rec["groups"]} == {"a", "b"}


def test_too_few_peers_and_bad_patterns_are_counted():
    pats = [pattern(r, "f", 10.0) for r in range(3)] + [pattern(3, "f", 10.0, steps=0),
                                                         dict(pattern(4, "f", 1.0), total_ns=float("nan")),
                                                         dict(pattern(5, "f", 1.0), total_ns=-5),
                                                         dict(pattern(6, "f", 1.0), total_ns=10**20)]
    rec, c = evaluate("f", pats)
    assert rec["outliers"] == [] and rec["ranks_scored"] == 0
    assert rec["skipped"] == {"too_few_peers": 3, "no_steps": 1, "bad_duration": 2, "absurd_duration": 1}
    assert c.skipped["bad_duration"] == 2


def test_one_slow_step_in_a_window_is_transient_not_an_outlier():
    pats = [pattern(r, "f", 100.0) for r in range(16)]
    pats[3] = pattern(3, "f", 130.0, p50_ms=100.0)  # one long step; typical call unchanged
    rec, _ = evaluate("f", pats)
    assert rec["outliers"] == [] and rec["skipped"]["transient_outlier"] == 1


def test_collective_culprit_is_the_shortest_time_inside_not_the_longest():
    members = list(range(8))
    seqs = list(range(100, 110))
    pats = []
    for r in members:
        # rank 6 arrives 30 ms late every call: its own time inside is only the 5 ms transfer
        durs = [5.0 if r == 6 else 35.0 + (r % 3) for _ in seqs]
        pats.append(comm_pattern(r, "dp0", seqs, durs, members))
    rec, _ = evaluate("comm:all_reduce:dp0", pats)
    (s,) = rec["stragglers"]
    assert s["rank"] == 6 and s["late_fraction"] == 1.0 and s["caused_ms_per_step"] > 25
    assert rec["outliers"] == []  # victims' long waits are never outliers
    assert abs(rec["transfer_ms_median"] - 5.0) < 1e-6
    waits = dict(zip(rec["members"], rec["member_wait_ms_per_step"], strict=True))
    assert waits[6] == 0 and waits[0] > 25


def test_collective_seqs_missing_at_window_edges_are_left_out():
    members = [0, 1, 2, 3]
    pats = [comm_pattern(r, "g", list(range(10 + (r == 0), 20)), [5.0 if r == 2 else 15.0] * (10 - (r == 0)),
                         members) for r in members]
    rec, _ = evaluate("comm:all_reduce:g", pats)
    assert rec["seqs_compared"] == 9 and rec["stragglers"][0]["rank"] == 2


def test_late_patterns_for_evaluated_windows_are_counted():
    pats = [pattern(r, "f", 10.0) for r in range(8)]
    rec, c = evaluate("f", pats)
    c.add(pattern(9, "f", 10.0), now_wall_ms=99999)
    assert c.skipped["late_pattern"] == 1


def test_intermittent_tail_is_flagged_as_intermittent():
    pats = [pattern(r, "f", 100.0) for r in range(16)]
    pats[3] = pattern(3, "f", 130.0, p50_ms=100.0, p90_ns=int(250e6))  # every few calls much slower
    rec, _ = evaluate("f", pats)
    (o,) = rec["outliers"]
    assert o["rank"] == 3 and o["intermittent"] is True


def gc_window(extra_calls: int, long_call_ms: float, young_ms: float = 0.25, steps: int = 45) -> list[dict]:
    """kind:gc of 4 ranks over ``steps`` steps: ~1 young collection of ``young_ms`` per step each;
    rank 2 makes ``extra_calls`` more and one collection of ``long_call_ms`` (its full one)."""
    pats = [pattern(r, "kind:gc", young_ms * (steps + r % 2) / steps, steps=steps, calls=1, p50_ms=young_ms,
                    kind=5, count=steps + r % 2) for r in (0, 1, 3)]
    calls = steps + extra_calls
    total_ms = young_ms * (calls - 1) + long_call_ms
    pats.insert(2, pattern(2, "kind:gc", total_ms / steps, steps=steps, p50_ms=young_ms, kind=5, count=calls))
    return pats


def test_a_few_more_calls_do_not_make_one_long_call_sustained():
    # live fault suite: rank 2's one 350 ms full collection fell in this window (its peers' in
    # the one before) and it made 4 more young collections than they did (9 %): not slow by its calls
    rec, _ = evaluate("kind:gc", gc_window(extra_calls=5, long_call_ms=350.0), DetectionPolicy(min_peers=3))
    assert rec["outliers"] == [] and rec["skipped"]["transient_outlier"] == 1


def test_more_calls_that_account_for_the_excess_are_sustained():
    # the same rank collecting 60 % more often, each collection as long as its peers': slow by its calls
    rec, _ = evaluate("kind:gc", gc_window(extra_calls=27, long_call_ms=3.0, young_ms=3.0), DetectionPolicy(min_peers=3))
    (o,) = rec["outliers"]
    assert o["rank"] == 2 and not o["intermittent"] and o["calls_ratio"] > 1.5


def test_an_excess_short_of_the_cost_a_finding_needs_is_a_minor_outlier_only():
    rng = np.random.default_rng(2)
    # 300 steps of ~17 ms: the floor is 1 ms/step. 0.4 ms/step on the peers; rank 5 does 4x the
    # calls: +0.8 ms/step (3x), under the floor
    pats = [pattern(r, "kind:backward", 0.4 * rng.lognormal(0, 0.02), steps=300) for r in range(8)]
    pats[5] = pattern(5, "kind:backward", 1.2, calls=4, steps=300)
    rec, _ = evaluate("kind:backward", pats)
    assert rec["outliers"] == []
    (m,) = rec["minor_outliers"]
    assert m["rank"] == 5 and 0.7 < m["cost_ms_per_step"] < 0.9 and m["calls_ratio"] == 4.0
    pats[5] = pattern(5, "kind:backward", 2.4, calls=4, steps=300)  # +2 ms/step: a finding, not a minor one
    rec, _ = evaluate("kind:backward", pats)
    assert [o["rank"] for o in rec["outliers"]] == [5] and rec["minor_outliers"] == []


def test_a_group_split_in_two_gives_its_slow_half_as_minor_outliers_against_the_fast_half():
    # two slow ranks of four (live fault suite, two-slow-ranks): the median sits between the
    # halves and the spread spans both, so neither is an outlier; against the faster half both
    # stand out, as minor outliers (they explain a late arrival, never a finding on their own)
    pats = [pattern(r, "TrainerSGD.step", v, steps=300) for r, v in enumerate([0.26, 20.2, 20.1, 0.27])]
    rec, _ = evaluate("TrainerSGD.step", pats)
    assert rec["outliers"] == []
    assert [m["rank"] for m in rec["minor_outliers"]] == [1, 2]
    for m in rec["minor_outliers"]:
        assert abs(m["peer_median_ms_per_step"] - 0.265) < 1e-6 and 19.8 < m["cost_ms_per_step"] < 20.0
    # an ordinary noisy group (one population, 5 % spread) has no faster half to stand out from:
    # 110.7 ms against the lower half's 96.2 is within the group's noise (its one outlier, 118 ms,
    # is found by the usual rules)
    rng = np.random.default_rng(3)
    rec, _ = evaluate("f", [pattern(r, "f", 100 * rng.lognormal(0, 0.05)) for r in range(16)])
    assert rec["minor_outliers"] == [] and [o["rank"] for o in rec["outliers"]] == [9]


def test_a_group_given_as_a_range_is_expected_whole_and_judged_as_the_same_group_listed():
    """FunctionPattern v3: a collective's members as (first, step, count). The comparator expects
    exactly those ranks (a window is complete, and evaluated at once, when all of them came; one
    missing keeps it waiting) and judges it as the same group listed."""
    members = list(range(2, 64, 8))  # 8 ranks, every 8th
    seqs = list(range(100, 110))

    def pats(ranged: bool) -> list[dict]:
        out = []
        for r in members:
            p = comm_pattern(r, "dp2", seqs, [5.0 if r == 18 else 35.0 for _ in seqs], members)
            if ranged:
                p.update(group_ranks=[], group_ranks_first=2, group_ranks_step=8, group_ranks_count=8)
            out.append(p)
        return out

    c = FunctionComparator("job", "comm:all_reduce:dp2", POL)
    for p in pats(True)[:-1]:
        c.add(p, now_wall_ms=1000)
    wid = int(pats(True)[0]["window_id"])
    assert not c.complete(wid)  # 7 of the 8 members
    c.add(pats(True)[-1], now_wall_ms=1000)
    assert c.complete(wid)  # the eighth: not the job's 64 ranks
    ranged, _ = evaluate("comm:all_reduce:dp2", pats(True))
    listed, _ = evaluate("comm:all_reduce:dp2", pats(False))
    assert ranged == listed and ranged["stragglers"][0]["rank"] == 18
