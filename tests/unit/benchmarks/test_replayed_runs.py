"""What the removed live tests asserted, now asserted on recorded real runs of the same jobs.

Each recording is a real ``torchrun`` job under ``perftracker launch`` (benchmarks/recordings,
docs/recordings.md); the replay puts its messages through the stream topology on their own
clock. These tests replace live runs of the same jobs that the suite no longer makes:

* ``test_demo_fault_is_named_on_rank_2_alone`` and ``test_healthy_demo_raises_nothing`` —
  tests/e2e/demo/test_demo_faults.py's gc-storm, slow-collective and none cases (cpu-contention: below) (the
  slow-dataloader case still runs live, with its report);
* ``test_transformer_names_the_slow_tp_shard_with_its_mesh_coordinates`` —
  tests/e2e/demo/test_demo_transformer.py;
* ``test_a_stalled_rank_is_named_hung_and_its_waiting_peers_never_are`` —
  tests/e2e/test_hang_diagnosis.py (named within the hang floor and a window, on the recorded clock);
* ``test_cpu_contention_is_named_with_the_schedulers_evidence`` — the cpu-contention case of
  tests/e2e/demo/test_demo_faults.py;
* ``test_a_slow_rank_of_the_second_node_is_named_with_its_host`` — the data-loader case of
  tests/e2e/test_two_nodes_diagnosis.py (its CPU-contention case still runs live).
"""

from __future__ import annotations

import json

import pytest

from .replays import BY_NAME, POLICY, replayed


def incidents(name: str) -> dict[str, dict]:
    """The last state of every incident of the named recording's replay, evidence decoded."""
    return {a["incident_id"]: {**a, "evidence": json.loads(a["evidence_json"] or "{}")}
            for a in replayed(name).anomalies}



@pytest.mark.parametrize("name,cause", [("demo-mlp-gc-storm", "gc_pause"),
                                        ("demo-mlp-slow-collective", "slow_function"),
                                        ("demo-mlp-slow-dataloader", "slow_dataloader")])
def test_demo_fault_is_named_on_rank_2_alone(name: str, cause: str):
    found = list(incidents(name).values())
    culprits = [a for a in found if a["ranks"] == [2] and a["cause"] == cause]
    assert culprits, found
    assert not [a for a in found if set(a["ranks"]) - {2}], found  # its peers wait for it: never blamed
    assert culprits[0]["impact_ms_per_step"] > 1.0 and culprits[0]["evidence"]
    assert "rank 2" in culprits[0]["summary"]


@pytest.mark.parametrize("name", ["demo-mlp-none", "demo-tp-fsdp2-none", "none", "two-nodes-none"])
def test_healthy_demo_raises_nothing(name: str):
    assert incidents(name) == {}


def test_transformer_names_the_slow_tp_shard_with_its_mesh_coordinates():
    found = list(incidents("demo-tp-fsdp2-slow-dataloader").values())
    culprits = [a for a in found if a["ranks"] == [2] and a["cause"] == "slow_dataloader"]
    assert culprits, found
    assert culprits[0]["function"].endswith("DataLoader.__next__")
    assert culprits[0]["evidence"]["mesh_coords"] == {"dp": 1, "tp": 0}
    assert "rank 2 (dp=1, tp=0)" in culprits[0]["summary"]
    assert not [a for a in found if set(a["ranks"]) - {2}], found  # its TP peer (3) and DP peer (0)


HANG_FLOOR_S, SLACK_S = 30.0, 15.0  # DetectionPolicy.hang_floor_s; window close, stage hand-offs


@pytest.mark.parametrize("name,rank,waiting", [("stall-before-forward", 1, "ranks 0, 2, 3 wait in"),
                                               ("subgroup-hang", 1, "ranks 2, 3 wait in")])
def test_a_stalled_rank_is_named_hung_and_its_waiting_peers_never_are(name: str, rank: int, waiting: str):
    result, truth = replayed(name), BY_NAME[name].truth
    hangs = [(a, at) for a, at in zip(result.anomalies, result.emitted_ms, strict=True) if a["cause"] == "hang"]
    assert hangs and all(a["ranks"] == [rank] for a in result.anomalies), result.anomalies
    first, named_at = hangs[0]
    assert truth.onset_ms is not None
    # named during the stall, within the hang floor and a window of its start, on the recorded clock
    assert named_at - truth.onset_ms <= (HANG_FLOOR_S + POLICY.window_s + SLACK_S) * 1000, (named_at, truth.onset_ms)
    assert "never entered all_reduce" in first["summary"] and waiting in first["summary"]
    assert "died" not in first["summary"]
    assert "now at " in first["summary"] and truth.location in first["summary"]  # its current stack


def test_a_killed_rank_is_named_dead():
    found = list(incidents("killed").values())
    assert any(a["cause"] == "hang" and 3 in a["evidence"].get("dead_ranks", []) for a in found), found
    assert all(set(a["ranks"]) <= {3} for a in found), found
    assert "process died / stopped reporting" in found[0]["summary"]


def test_cpu_contention_is_named_with_the_schedulers_evidence():
    found = list(incidents("cpu-contention").values())
    assert [(a["cause"], a["ranks"]) for a in found] == [("host_cpu_contention", [2])], found
    cpu = found[0]["evidence"]["cpu"]["2"]
    assert cpu["verdict"] == "contended", cpu


def test_a_slow_rank_of_the_second_node_is_named_with_its_host():
    found = list(incidents("two-nodes-slow-backward-hook").values())
    culprits = [a for a in found if a["ranks"] == [3]]
    assert culprits and culprits[0]["hosts"] == ["node-1"], found
    assert all(a["ranks"] == [3] for a in found), found


def test_a_gpu_late_arrival_with_its_cpu_waiting_like_its_peers_is_named_slow_gpu():
    """Recorded on a lent H200 (benchmarks.gpu_check part b): 4 ranks share the GPU over gloo,
    rank 2 queues 15 ms of extra GPU work per forward; every CPU thread waits in backward. The
    device times of its phases, not its CPU samples, name it, and none of its peers."""
    found = list(incidents("gpu-shared-straggler").values())
    (culprit,) = found
    assert culprit["ranks"] == [2] and culprit["cause"] == "slow_gpu"
    side = culprit["evidence"]["gpu_side"]
    assert side["phase"].endswith("Net.forward") and side["device_only_excess_ms_per_step"] > 10
    assert "its GPU runs" in culprit["summary"]
