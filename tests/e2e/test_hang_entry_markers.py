"""A rank stalled in plain Python before its forward: its DDP peers report the bucket
all-reduce they entered (and wait in) as an entry marker (dur_ns < 0) while it stalls; the
stalled rank reports none. Real torchrun, 4 gloo ranks, under `perftracker launch`."""

from __future__ import annotations

import pytest

from .helpers import by_rank, consume_events, launch, torchrun

pytestmark = pytest.mark.e2e

STALL_RANK, STALL_STEP, STALL_S = 3, 10, 4.0


def comms(records: list[dict]) -> list[tuple[str, str, int, int, int]]:
    """(op, group, seq, step, dur_ns) of every comm event, markers included."""
    out = []
    for r in records:
        c = r["comms"]
        for op, g, seq, step, dur in zip(c["op"], c["group"], c["seq"], c["step"], c["dur_ns"], strict=True):
            out.append((r["names"][op], r["groups"][g]["group_id"], seq, step, dur))
    return out


@pytest.fixture(scope="module")
def run_records(kafka_broker, tmp_path_factory):
    from perftracker_ml.schemas.kafka_admin import ensure_topics
    from perftracker_ml.schemas.topics import TopicNames, all_topics

    prefix = "hang" + tmp_path_factory.mktemp("x").name[-6:].replace("_", "")
    ensure_topics({"bootstrap.servers": kafka_broker.bootstrap}, all_topics(prefix))
    job = f"job-{prefix}"
    env = {"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap, "PERFTRACKER_KAFKA_TOPIC_PREFIX": prefix,
           "TRAIN_STEPS": "20", "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0",
           "TRAIN_STALL": f"{STALL_RANK}:{STALL_STEP}:{STALL_S}"}
    code, _ = launch(torchrun("train_ddp.py", nproc=4), job, env)
    assert code == 0
    return by_rank(consume_events(kafka_broker.bootstrap, TopicNames.for_prefix(prefix).events, job))


def test_peers_report_the_all_reduce_they_wait_in_as_entered_the_stalled_rank_does_not(run_records):
    assert sorted(run_records) == [0, 1, 2, 3]
    stalled = comms(run_records[STALL_RANK])
    assert not [c for c in stalled if c[4] < 0], "the stalled rank entered no collective while stalled"
    # the all-reduce(s) of the stalled step, as the stalled rank completed them after its stall
    waited = {(op, g, seq) for op, g, seq, step, dur in stalled if step == STALL_STEP and dur >= 0}
    assert waited and {op for op, _, _ in waited} == {"all_reduce"}
    for rank in (0, 1, 2):
        rows = comms(run_records[rank])
        markers = {(op, g, seq) for op, g, seq, step, dur in rows if dur < 0}
        assert markers and markers <= waited, (rank, markers, waited)
        assert all(step == STALL_STEP for _, _, _, step, dur in rows if dur < 0)
        done = {(op, g, seq): dur for op, g, seq, _, dur in rows if dur >= 0}
        assert all(done[m] >= 0.5 * STALL_S * 1e9 for m in markers)  # then completed, after the stall
