"""Scoring a replay against its truth: false alarms, windows to detect, the no-worse check."""

from __future__ import annotations

from benchmarks.corpus import Truth, false_alarms, score_replay, verdict, worse_than


def anomaly(incident: str, cause: str, ranks: list[int], status: str = "OPEN") -> dict:
    return {"incident_id": incident, "cause": cause, "ranks": ranks, "summary": "", "status": status,
            "evidence_json": "{}", "resolved_reason": ""}


SLOW = Truth("t", "tuning", culprits={"1": "slow_function"}, onset_ms=10_000)
HEALTHY = Truth("h", "evaluation")


def test_every_incident_on_a_healthy_job_is_a_false_alarm_job_wide_ones_included():
    rows = [anomaly("a", "regression", []), anomaly("a", "regression", [], "RESOLVED"), anomaly("b", "slow_function", [2])]
    assert false_alarms(HEALTHY.expect, rows) == 2


def test_an_incident_beside_the_right_one_is_a_false_alarm():
    rows = [anomaly("a", "slow_function", [1]), anomaly("b", "regression", [])]
    assert false_alarms(SLOW.expect, rows) == 1
    assert false_alarms(SLOW.expect, rows[:1]) == 0


def test_windows_to_detect_count_from_the_onset_to_the_replay_clock_of_the_detection():
    rows = [anomaly("a", "host_cpu_contention", [3]), anomaly("b", "slow_function", [1])]
    got = score_replay(SLOW, rows, [12_000, 21_000], window_ms=5_000)
    assert got["detected"] and got["windows_to_detect"] == 3 and got["seconds_to_detect"] == 11.0
    assert got["false_ranks"] == [3] and got["false_alarms"] == 1 and not got["culprit_correct"]


def test_a_healthy_job_is_never_detected_and_right_when_silent():
    got = score_replay(HEALTHY, [], [], window_ms=5_000)
    assert got["culprit_correct"] and got["cause_correct"] and not got["detected"] and got["false_alarms"] == 0


def test_worse_than_names_each_regression_and_ignores_improvements():
    base = verdict(score_replay(SLOW, [anomaly("b", "slow_function", [1])], [20_000], 5_000))
    assert worse_than(base, base) == []
    now = verdict(score_replay(SLOW, [anomaly("a", "regression", []), anomaly("c", "slow_function", [2])],
                               [20_000, 20_000], 5_000))
    problems = worse_than(base, now)
    assert any(p.startswith("culprit_correct was True") for p in problems)
    assert "new false ranks [2]" in problems and "false alarms 0 -> 2" in problems
    assert worse_than(now, base) == []  # better is never worse
