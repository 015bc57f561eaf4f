"""Periodic stalls: the compare stage lists single long waits (``FunctionComparison.stalls``), the
diagnoser follows them across windows and names the rank that causes most of them."""

from collections import Counter

import pytest
from perftracker_ml.schemas.records import FunctionComparison
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.late_arrival import score_collective
from perftracker_ml.streams.detect.stalls import StallHistory, periodic_stalls

POL = DetectionPolicy()
GROUP = "comm:all_reduce:pg0-4-abc"
STEPS = 300  # per 5 s window: a ~16.7 ms pace, ~10 ms median step
STEP_MS = 10.0


def patterns(stalls: dict[int, tuple[int, float]], steps: int = STEPS, seq0: int = 0, members: int = 4) -> list[dict]:
    """One call per step; ``stalls``: seq index -> (late rank, wait ms) where that rank arrives
    last and the others wait that long; otherwise rank order varies and waits are ~1 ms."""
    rows = []
    for r in range(members):
        durs = []
        for i in range(steps):
            late, wait = stalls.get(i, ((i % members), 1.0))
            durs.append(int(0.2e6 if r == late else (0.2 + wait) * 1e6))
        rows.append({"rank": r, "host": f"h{r}", "gpu": -1, "seqs": list(range(seq0, seq0 + steps)),
                     "seq_dur_ns": durs, "steps": steps, "count": steps, "bytes": 4 * steps, "signature": "s"})
    return rows


def compare(pats: list[dict]) -> FunctionComparison:
    rec = {"function": GROUP, "window_s": POL.window_s, "stragglers": [], "kind": 100}
    score_collective(rec, pats, POL, POL.min_cost_ms_per_step, Counter())  # type: ignore[arg-type]
    return rec  # type: ignore[return-value]


def test_a_single_long_wait_is_a_stall_and_short_ones_are_not():
    rec = compare(patterns({100: (2, 400.0), 200: (1, 40.0)}))
    assert [(s["rank"], s["seq"], round(s["wait_ms"])) for s in rec["stalls"]] == [(2, 100, 400)]
    assert rec["stalls"][0]["seqs_per_step"] == 1.0
    assert rec["stragglers"] == []  # one late call in 300 is no late arriver


def test_the_floor_is_several_steps_of_the_window():
    slow = compare(patterns({10: (3, 60.0)}, steps=30))  # 30 steps in 5 s: a step is ~167 ms
    assert slow["stalls"] == []
    assert [s["rank"] for s in compare(patterns({10: (3, 400.0)}, steps=30))["stalls"]] == [3]


def feed(history: StallHistory, wid: int, stalls: dict[int, tuple[int, float]]) -> list:
    rec = compare(patterns(stalls, seq0=wid * STEPS))
    history.note(wid, [rec], {r: {"steps": STEPS} for r in range(4)}, POL)  # type: ignore[dict-item]
    return periodic_stalls(history, wid, STEP_MS, set(), POL)


def test_one_rank_stalling_every_eight_seconds_is_named_with_its_period_and_cost():
    h = StallHistory.for_policy(POL)
    found = []
    for wid in range(12):  # a 500 ms stall every ~480 steps (8 s at a 16.7 ms pace): in 5 of 12 windows
        at = {(s * 480) - wid * STEPS: (2, 500.0) for s in range(1, 8) if 0 <= s * 480 - wid * STEPS < STEPS}
        found = feed(h, wid, at) or found
    (f,) = found
    assert f.ranks == (2,) and f.cause.value == "slow_function" and f.identity == "stall|2"
    assert f.evidence["period_steps"] == pytest.approx(480) and f.evidence["regular"]
    assert f.evidence["period_s"] == pytest.approx(8.0, rel=0.01)
    assert f.impact_ms == pytest.approx(500 / 480, rel=0.01)  # each stall over the steps since the one before


def test_three_stalls_are_needed_and_the_finding_clears_when_they_stop():
    h = StallHistory.for_policy(POL)
    assert feed(h, 0, {50: (1, 300.0)}) == []
    assert feed(h, 1, {50: (1, 300.0)}) == []
    assert [f.ranks for f in feed(h, 2, {50: (1, 300.0)})] == [(1,)]
    assert feed(h, 3, {}) and feed(h, 4, {})  # within two periods of the last stall
    assert feed(h, 5, {}) == []


def test_stalls_spread_over_every_rank_name_nobody():
    """Unsynchronized pauses of every rank (a garbage collection each, at its own time)."""
    h = StallHistory.for_policy(POL)
    found = [feed(h, wid, {50: (wid % 4, 300.0), 150: ((wid + 1) % 4, 300.0)}) for wid in range(12)]
    assert not any(found)


def test_the_cost_floors_hold_on_both_sides():
    h = StallHistory.for_policy(POL)
    for wid in range(6):  # 60 ms every 300 steps: 0.2 ms per step, under the 1 ms floor
        last = feed(h, wid, {100: (0, 60.0)})
    assert last == []
    h = StallHistory.for_policy(POL)
    for wid in range(6):  # 330 ms every 300 steps: 1.1 ms per step
        last = feed(h, wid, {100: (0, 330.0)})
    assert [f.ranks for f in last] == [(0,)]


def test_a_rank_another_rule_named_is_left_to_it():
    h = StallHistory.for_policy(POL)
    for wid in range(4):
        rec = compare(patterns({100: (2, 400.0)}, seq0=wid * STEPS))
        h.note(wid, [rec], {r: {"steps": STEPS} for r in range(4)}, POL)  # type: ignore[dict-item]
    assert periodic_stalls(h, 3, STEP_MS, {2}, POL) == []
    assert [f.ranks for f in periodic_stalls(h, 3, STEP_MS, set(), POL)] == [(2,)]


def test_the_history_is_bounded_by_its_horizon():
    h = StallHistory.for_policy(POL)
    for wid in range(POL.stall_horizon_windows * 3):
        h.note(wid, [compare(patterns({100: (2, 400.0)}, seq0=wid * STEPS))], {}, POL)
    assert len(h.windows) == POL.stall_horizon_windows
    assert min(w for w, _ in h.windows) == POL.stall_horizon_windows * 2


def test_a_rank_held_up_by_another_ranks_stalls_in_a_pair_group_is_no_culprit():
    """Rank 1 stalls in its pair group (0, 1); rank 0 waits there and comes late to the
    job-wide group: rank 0's stalls there are propagated, not its own."""
    h = StallHistory.for_policy(POL)
    for wid in range(6):
        pair = compare(patterns({100: (1, 400.0)}, seq0=wid * STEPS, members=2))
        pair["function"] = "comm:all_reduce:pair"
        pair["members"] = [0, 1]
        world = compare(patterns({101: (0, 380.0)}, seq0=wid * STEPS))
        h.note(wid, [world, pair], {r: {"steps": STEPS} for r in range(4)}, POL)  # type: ignore[dict-item]
    assert {s.rank for s in h.stalls()} == {1}
    assert [f.ranks for f in periodic_stalls(h, 5, STEP_MS, set(), POL)] == [(1,)]
