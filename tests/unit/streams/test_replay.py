"""Replay on the recorded clock: the worker's decode and validation, deterministic findings."""

from __future__ import annotations

import random

from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.recording import RecordedMessage
from perftracker_ml.schemas.vocabulary import EVENT_BATCH, Status
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.replay import replay

POLICY = DetectionPolicy(window_s=2.0, window_grace_s=1.0)


def recorded(job: str = "rj", slow_rank: int = 5) -> list[RecordedMessage]:
    """A synthetic 8-rank job's batches as the events topic would hold them (timestamps: send time)."""
    codec = Codec(EVENT_BATCH)
    cfg = SyntheticJob(job, ranks=8, seconds=20, slow_rank=slow_rank, slowdown=1.5, seed=3, final=True)
    out = []
    for offset, (rank, rec) in enumerate(batches(cfg)):
        out.append(RecordedMessage("inputs", "pt.events", rank % 8, offset, rec["wall_ns"] // 1_000_000,
                                   f"{job}|{rank}".encode(), codec.encode(rec)))
    return out


def test_a_recorded_slow_rank_is_found_and_two_replays_are_identical():
    msgs = recorded()
    first, second = replay(msgs, POLICY), replay(msgs, POLICY)
    opened = [a for a in first.anomalies if a["status"] == Status.OPEN]
    assert opened and all(a["ranks"] == [5] for a in opened), opened
    assert first.canonical() == second.canonical()
    assert first.messages == len(msgs) and first.records == len(msgs) and not first.rejected
    # the job ends (every rank's final batch): its incidents are resolved within the replay's tail
    assert any(a["status"] == Status.RESOLVED for a in first.anomalies)


def test_the_order_messages_were_read_in_does_not_matter():
    msgs = recorded()
    shuffled = list(msgs)
    random.Random(1).shuffle(shuffled)
    assert replay(shuffled, POLICY).canonical() == replay(msgs, POLICY).canonical()


def test_bad_messages_are_counted_as_the_worker_dead_letters_them_and_the_rest_replayed():
    msgs = recorded()
    bad = [RecordedMessage("inputs", "pt.events", 0, 10_000, msgs[10].timestamp_ms, b"rj|0", b"\x00garbage"),
           RecordedMessage("inputs", "pt.events", 0, 10_001, msgs[11].timestamp_ms, b"rj|0", b"")]
    result = replay(msgs[:10] + bad + msgs[10:], POLICY)
    assert sum(result.rejected.values()) == 2, result.rejected
    assert result.canonical() == replay(msgs, POLICY).canonical()


def test_a_healthy_recording_raises_nothing():
    assert replay(recorded(slow_rank=-1), POLICY).anomalies == []


def test_messages_of_other_roles_are_not_inputs():
    msgs = recorded()
    other = [RecordedMessage("anomalies", "pt.anomalies", 0, i, m.timestamp_ms, None, m.value)
             for i, m in enumerate(msgs[:5])]
    assert replay(msgs + other, POLICY).canonical() == replay(msgs, POLICY).canonical()
