"""Every recorded real run of the corpus (benchmarks/recordings) replayed and held to its baseline.

Each recording is a real ``torchrun`` job under ``perftracker launch`` (benchmarks/record_corpus.py),
kept byte for byte; its truth says what a correct diagnosis names. A replay may be better than
the committed baseline (benchmarks/recordings/baseline.json, ``python -m benchmarks.replay
--write-baseline``), never worse: a verdict that was right stays right, no new false rank, no
more false alarms. The evaluation set is frozen: its truth and recordings never change.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.corpus import BASELINE, score_replay, verdict, worse_than

from .replays import BY_NAME, ENTRIES, POLICY, fresh, replayed


def test_the_corpus_has_both_sets_and_a_baseline_for_every_recording():
    assert len(ENTRIES) >= 20
    sets = {e.truth.set for e in ENTRIES}
    assert sets == {"tuning", "evaluation"}
    assert {e.truth.name for e in ENTRIES} == set(json.loads(BASELINE.read_text()))
    assert any(e.truth.healthy for e in ENTRIES if e.truth.set == "evaluation")


@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{e.truth.set}/{e.truth.name}" for e in ENTRIES])
def test_replay_is_no_worse_than_its_baseline(entry):
    result = replayed(entry.truth.name)
    assert result.messages > 0 and not result.rejected
    now = verdict(score_replay(entry.truth, result.anomalies, result.emitted_ms, POLICY.window_ms))
    base = json.loads(BASELINE.read_text())[entry.truth.name]
    problems = worse_than(base, now)
    assert not problems, f"{entry.truth.name}: {problems}; found {[(a['status'], a['cause'], a['ranks']) for a in result.anomalies]}"


@pytest.mark.parametrize("name", ["slow-optimizer", "killed", "two-nodes-slow-backward-hook"])
def test_two_replays_of_a_recording_give_byte_identical_findings(name):
    first = fresh(BY_NAME[name]).canonical()
    assert first and first == fresh(BY_NAME[name]).canonical() == replayed(name).canonical()
