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
from perftracker_ml.schemas import bundle, bundled_schemas
from perftracker_ml.schemas.codec import writer_fingerprint
from perftracker_ml.schemas.recording import Recording
from perftracker_ml.streams.replay import reencoded, replay

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


@pytest.mark.parametrize("name", ["slow-optimizer", "demo-pp-none-again", "demo-fsdp2-slow-backward"])
def test_a_recording_reencoded_as_event_batch_v8_replays_to_the_same_findings(name):
    """Recorded as EventBatch v5, v6 and v7 (list columns); re-encoded as v8 (packed columns, decoded to
    numpy arrays) the replay gives the same findings byte for byte, at the same times, and sets aside the
    same. The whole corpus: ``python -m benchmarks.replay --json --reencode v8`` (docs/benchmarks.md)."""
    entry = BY_NAME[name]
    messages = list(reencoded(Recording(entry.recording).messages(), 8))
    schemas = bundled_schemas()
    versions = {(sv.name, sv.version) for m in messages if m.role == "inputs" for item in bundle.records_in(m.value)
                if (sv := schemas.by_fingerprint(writer_fingerprint(item) or b"")) is not None}
    assert ("EventBatch", 8) in versions and not {v for n, v in versions if n == "EventBatch"} - {8}
    again, recorded = replay(messages, POLICY), replayed(name)
    assert again.canonical() == recorded.canonical() and again.emitted_ms == recorded.emitted_ms
    assert again.rejected == recorded.rejected and again.records == recorded.records > 0
