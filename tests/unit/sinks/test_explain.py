"""`perftracker diagnose --explain RANK` in words (sinks/explain.py), from the incidents a replay
of a recorded job raises: a named rank, a rank a rule cleared, a rank never flagged."""

from __future__ import annotations

import pytest
from perftracker_ml.schemas.diagnosis import diagnosis_row
from perftracker_ml.schemas.recording import Recording
from perftracker_ml.sinks.explain import explain_rank
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.decisions import NOT_FLAGGED
from perftracker_ml.streams.replay import replay

from benchmarks.corpus import CORPUS_DIR


def incidents(name: str) -> list[dict]:
    """The last record of every incident of a replayed recording, as `diagnose` rows."""
    res = replay(Recording(next(CORPUS_DIR.rglob(f"{name}.ptrec"))).messages(), DetectionPolicy())
    last = {a["incident_id"]: a for a in res.anomalies}
    return [diagnosis_row(a, 0, 0) for a in last.values()]


@pytest.fixture(scope="module")
def host_copies() -> list[dict]:
    """Live fault suite, host-copies: rank 1 late into its pair group with rank 0; rank 0, held
    up there, late into the world all_reduce (a propagated victim)."""
    return incidents("host-copies")


def test_the_stored_decisions_name_the_rule_and_its_evidence(host_copies):
    (row,) = host_copies
    assert row["ranks"] == [1]
    decisions = row["evidence"]["decisions"]
    assert [(d["rank"], d["rule"], d["action"]) for d in decisions[:2]] == [(1, "stragglers", "flagged"),
                                                                           (1, "late_entries", "added")]
    assert decisions[1]["identity"] == "late|1"  # its own ranks' decisions come first
    (victim,) = [d for d in decisions if d["rank"] == 0 and d["action"] == "cleared"]
    assert victim["rule"] == "stragglers" and victim["evidence"]["waited_in"].startswith("comm:all_reduce:pg1-2")


def test_a_named_rank_is_explained_by_the_rule_that_added_it(host_copies):
    text = explain_rank("j", 1, host_copies)
    assert text.startswith("rank 1 of job j was named in 1 incident(s):")
    assert "rule late_entries named it in late|1" in text


def test_a_cleared_rank_is_explained_by_the_rule_that_cleared_it(host_copies):
    text = explain_rank("j", 0, host_copies).splitlines()
    assert text[0] == "rank 0 of job j was not named:"
    assert text[1].startswith("  - rule stragglers flagged it: last into comm:all_reduce:pg0-4")
    assert text[2].startswith("  - rule stragglers cleared it: its late arrival only passes on a wait it had in "
                              "another collective (propagated victim)")


def test_a_rank_never_flagged_says_so(host_copies):
    assert explain_rank("j", 3, host_copies) == (f"rank 3 of job j was not named: {NOT_FLAGGED} "
                                                 "(in the windows of its 1 incident(s))")
    assert explain_rank("j", 3, []) == f"rank 3 of job j was not named: {NOT_FLAGGED} (in no incident of the job)"
