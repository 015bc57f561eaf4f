"""The live fault suite's scoring: expected vs found, on both sides of each rule."""

from __future__ import annotations

from benchmarks.live_faults import DEAD, SCENARIOS, Expect, marker_lines, score, totals

LOC = "live_faults_train.py:210"


def row(cause: str, ranks: list[int], summary: str = "", **evidence: object) -> dict:
    return {"cause": cause, "ranks": ranks, "summary": summary, "evidence": evidence}


def test_the_culprit_with_its_cause_and_nobody_else_is_right() -> None:
    got = score(Expect({1: "slow_function"}), [row("slow_function", [1])])
    assert got == {"culprit_correct": True, "cause_correct": True, "location_correct": None,
                   "detected": True, "false_ranks": [], "cleared": None, "false_alarms": 0}


def test_a_victim_blamed_beside_the_culprit_is_a_false_rank() -> None:
    got = score(Expect({1: "slow_function"}), [row("slow_function", [1]), row("slow_function", [2])])
    assert not got["culprit_correct"] and got["cause_correct"] and got["false_ranks"] == [2]


def test_a_wrong_cause_on_the_culprit_is_wrong_even_when_the_right_one_follows() -> None:
    rows = [row("host_cpu_contention", [1]), row("slow_function", [1])]
    got = score(Expect({1: "slow_function"}), rows)
    assert got["culprit_correct"] and not got["cause_correct"] and got["detected"]
    assert not score(Expect({1: "slow_function"}), rows[:1])["detected"]


def test_every_culprit_must_be_named() -> None:
    expect = Expect({0: "slow_dataloader", 3: "slow_function"})
    one = score(expect, [row("slow_dataloader", [0])])
    assert not one["culprit_correct"] and not one["cause_correct"] and not one["detected"]
    both = score(expect, [row("slow_dataloader", [0]), row("slow_function", [3])])
    assert both["culprit_correct"] and both["cause_correct"] and both["detected"]


def test_location_is_checked_only_where_expected_and_only_on_culprit_rows() -> None:
    expect = Expect({1: "slow_function"}, location="host-copies")
    right = row("slow_function", [1], f"spends 18 ms/step in /x/{LOC} after_step")
    assert score(expect, [right], LOC)["location_correct"] is True
    assert score(expect, [row("slow_function", [1], "in code before the call")], LOC)["location_correct"] is False
    assert score(expect, [row("slow_function", [1], location={"frame": f"/x/{LOC} f"})], LOC)["location_correct"]
    elsewhere = row("slow_function", [2], f"in /x/{LOC}")
    assert score(expect, [row("slow_function", [1]), elsewhere], LOC)["location_correct"] is False


def test_a_dead_rank_must_be_named_dead_not_only_hung() -> None:
    expect = Expect({3: DEAD})
    assert score(expect, [row("hang", [3], dead_ranks=[3])])["cause_correct"]
    assert not score(expect, [row("hang", [3], dead_ranks=[])])["cause_correct"]


def test_job_wide_cause_needs_its_row_and_no_rank_blamed() -> None:
    expect = Expect(job_cause="regression")
    assert score(expect, [row("regression", [])]) == {
        "culprit_correct": True, "cause_correct": True, "location_correct": None, "detected": True,
        "false_ranks": [], "cleared": None, "false_alarms": 0}
    blamed = score(expect, [row("regression", []), row("slow_function", [2])])
    assert not blamed["culprit_correct"] and not blamed["cause_correct"] and blamed["false_ranks"] == [2]
    assert not score(expect, [])["detected"]


def test_nothing_expected_means_no_row_at_all() -> None:
    assert score(Expect(), []) == {"culprit_correct": True, "cause_correct": True, "location_correct": None,
                                   "detected": False, "false_ranks": [], "cleared": None, "false_alarms": 0}
    regression = score(Expect(), [row("regression", [])])
    assert regression["culprit_correct"] and not regression["cause_correct"] and not regression["detected"]
    assert score(Expect(), [row("slow_function", [2])])["false_ranks"] == [2]


def test_totals() -> None:
    results = [
        {"scenario": "a", "culprit_correct": True, "cause_correct": True, "location_correct": True,
         "seconds_to_detect": 8.0, "false_ranks": [], "expected": {"alerts": True}},
        {"scenario": "b", "culprit_correct": True, "cause_correct": False, "location_correct": None,
         "seconds_to_detect": 12.0, "false_ranks": [2], "expected": {"alerts": True}},
        {"scenario": "c", "culprit_correct": False, "cause_correct": True, "location_correct": None,
         "seconds_to_detect": None, "false_ranks": [], "expected": {"alerts": True}},
        {"scenario": "none", "culprit_correct": True, "cause_correct": True, "location_correct": None,
         "seconds_to_detect": None, "false_ranks": [], "expected": {"alerts": False}},
        {"scenario": "killed", "culprit_correct": True, "cause_correct": True, "location_correct": None,
         "seconds_to_detect": 36.0, "false_ranks": [], "expected": {"alerts": True}},
    ]
    t = totals(results)
    assert t["culprits_pct"] == 80.0 and t["causes_pct"] == 80.0 and t["locations_pct"] == 100.0
    assert t["false_ranks_total"] == 1 and t["p50_s"] == 12.0 and t["scenarios"] == 5
    assert t["p95_s"] > 30.0 and t["p95_s_without_hangs"] < 12.0  # the hang, named after hang_floor_s
    assert t["p50_s_without_hangs"] == 10.0
    assert t["missed"] == ["c"] and t["wrong"] == ["b", "c"]


def test_the_suite_has_its_scenarios_and_every_expected_location_has_a_marker() -> None:
    assert len(SCENARIOS) >= 15 and any(s.nodes == 2 for s in SCENARIOS.values())
    markers = marker_lines()
    for s in SCENARIOS.values():
        if s.expect.location:
            assert s.expect.location in markers, s.name


def test_a_fault_that_stops_must_see_its_incident_cleared_not_only_ended_with_the_job() -> None:
    expect = Expect({1: "slow_function"}, clears=True)
    opened = {**row("slow_function", [1]), "status": "OPEN", "resolved_reason": ""}
    ended = {**opened, "status": "RESOLVED", "resolved_reason": "job finished"}
    cleared = {**opened, "status": "RESOLVED", "resolved_reason": "cleared"}
    assert score(expect, [opened])["cleared"] is False
    assert score(expect, [opened, ended])["cleared"] is False
    assert score(expect, [opened, cleared])["cleared"] is True
    result = {"scenario": "fault-clears", "culprit_correct": True, "cause_correct": True, "location_correct": None,
              "cleared": False, "false_ranks": [], "seconds_to_detect": 5.0, "expected": {"alerts": True}}
    assert totals([result])["wrong"] == ["fault-clears"]
    assert totals([{**result, "cleared": True}])["wrong"] == []
