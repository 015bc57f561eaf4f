"""`perftracker launch -- torchrun` (4 gloo ranks) of FSDP2, tensor x FSDP2 over a 2x2 mesh,
pipeline parallel and a compiled DDP model (tests/e2e/scripts/train_parallel.py, unmodified).

Each run asserts what issue 16 asks: the per-step collectives of the style arrive (not only
the initialisation's), every collective's sequence number lines up across the members of its
group (same group and seq -> same op on every member, every member saw the same seqs), and
each rank's DeviceMesh coordinates arrive in its batches. The GPU variants (NCCL, one GPU per
rank) skip without at least 4 GPUs.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from perftracker_ml.schemas.records import group_members

from .helpers import by_rank, consume_events, launch, torchrun

pytestmark = pytest.mark.e2e

STEPS = 6
P2P_OPS = {"send", "recv", "isend", "irecv"}


def run(bootstrap: str, tmp_path: Path, mode: str, device: str = "cpu") -> tuple[dict[int, list[dict]], dict]:
    from perftracker_ml.schemas.kafka_admin import ensure_topics
    from perftracker_ml.schemas.topics import TopicNames, all_topics

    prefix = f"par{mode}{tmp_path.name[-4:]}".replace("_", "")
    ensure_topics({"bootstrap.servers": bootstrap}, all_topics(prefix))
    topics = TopicNames.for_prefix(prefix)
    job = f"job-{prefix}"
    env = {"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "PERFTRACKER_KAFKA_TOPIC_PREFIX": prefix,
           "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0", "PERFTRACKER_COLLECTOR_STACK_HZ": "0",
           "PERFTRACKER_COLLECTOR_ITERATION_REPEATS": "2",  # steps are tagged from the third
           "TRAIN_MODE": mode, "TRAIN_STEPS": str(STEPS), "TRAIN_DEVICE": device,
           "TRAIN_REPORT": str(tmp_path / "report-{rank}.json"),
           "PERFTRACKER_COLLECTOR_STATS_FILE": str(tmp_path / "stats-{rank}.json")}
    code, _ = launch(torchrun("train_parallel.py", nproc=4), job, env)
    assert code == 0
    records = by_rank(consume_events(bootstrap, topics.events, job))
    assert sorted(records) == [0, 1, 2, 3]
    reports = {r: json.loads((tmp_path / f"report-{r}.json").read_text()) for r in range(4)}
    for r in range(4):
        stats = json.loads((tmp_path / f"stats-{r}.json").read_text())
        assert stats["errors_caught"] == 0, stats
    return records, reports


def comm_events(records: list[dict]) -> list[dict]:
    """Every completed comm event of one rank: op, group id, members, seq, bytes, step."""
    out = []
    for r in records:
        c = r["comms"]
        for op, g, seq, nbytes, step, dur in zip(c["op"], c["group"], c["seq"], c["bytes"], c["step"],
                                                 c["dur_ns"], strict=True):
            if dur < 0:  # an entry marker (entered, not completed yet); its completion follows
                continue
            group = r["groups"][g]
            out.append({"op": r["names"][op], "group": group["group_id"], "ranks": tuple(group_members(group)),
                        "seq": seq, "bytes": nbytes, "step": step})
    return out


def assert_sequences_line_up(per_rank: dict[int, list[dict]]) -> None:
    """Same (group, seq) -> same op and members on every member; every member saw the same
    seqs of the group, numbered from 0 without a gap (p2p pairs: a send's seq is its recv's)."""
    seen: dict[str, dict[int, dict[int, str]]] = defaultdict(dict)  # group -> rank -> seq -> op
    members: dict[str, tuple[int, ...]] = {}
    for rank, events in per_rank.items():
        for e in events:
            assert members.setdefault(e["group"], e["ranks"]) == e["ranks"], e
            assert rank in e["ranks"], e
            ops = seen[e["group"]].setdefault(rank, {})
            assert e["seq"] not in ops, f"rank {rank} reported {e['group']} seq {e['seq']} twice"
            ops[e["seq"]] = e["op"]
    for group, by_member in seen.items():
        assert sorted(by_member) == sorted(members[group]), (group, sorted(by_member))
        seqs = [sorted(ops) for ops in by_member.values()]
        assert all(s == seqs[0] for s in seqs), group
        assert seqs[0] == list(range(len(seqs[0]))), group
        if ":p2p:" in group:
            for ops in zip(*(by_member[r].values() for r in sorted(by_member)), strict=True):
                assert set(ops) <= P2P_OPS, ops
        else:
            reference = by_member[min(by_member)]
            assert all(ops == reference for ops in by_member.values()), group


def per_step(events: list[dict], op: str, suffix: str = "") -> Counter[int]:
    """Calls of ``op`` (on groups whose id ends with ``suffix``) per step, steps >= 0 only."""
    return Counter(e["step"] for e in events if e["op"] == op and e["group"].endswith(suffix) and e["step"] >= 0)


def last_mesh_coords(records: list[dict]) -> dict[str, int]:
    return dict(records[-1].get("mesh_coords") or {})


def test_fsdp2(kafka_broker, tmp_path):
    records, _ = run(kafka_broker.bootstrap, tmp_path, "fsdp2")
    per_rank = {rank: comm_events(rs) for rank, rs in records.items()}
    assert_sequences_line_up(per_rank)
    for rank, events in per_rank.items():
        gathers, scatters = per_step(events, "all_gather_into_tensor"), per_step(events, "reduce_scatter_tensor")
        # every step after the first iterations are detected: the forward's and backward's all-gathers
        # and the gradients' reduce-scatters, on the 4-rank group
        assert len(gathers) >= STEPS - 4 and min(gathers.values()) >= 2, gathers
        assert len(scatters) >= STEPS - 4 and min(scatters.values()) >= 1, scatters
        assert all(e["bytes"] > 0 for e in events if e["op"] in ("all_gather_into_tensor", "reduce_scatter_tensor"))
        assert last_mesh_coords(records[rank]) == {"dp": rank}


def test_tensor_parallel_with_fsdp2_on_a_2x2_mesh(kafka_broker, tmp_path):
    records, _ = run(kafka_broker.bootstrap, tmp_path, "tp")
    per_rank = {rank: comm_events(rs) for rank, rs in records.items()}
    assert_sequences_line_up(per_rank)
    for rank, events in per_rank.items():
        tp_groups = {e["ranks"] for e in events if e["group"].endswith(".tp")}
        dp_groups = {e["ranks"] for e in events if e["group"].endswith(".dp")}
        assert tp_groups == {(rank - rank % 2, rank - rank % 2 + 1)}, tp_groups
        assert dp_groups == {(rank % 2, rank % 2 + 2)}, dp_groups
        # the row-wise layer's all-reduce in the forward (a functional collective of DTensor)
        assert len(per_step(events, "all_reduce", ".tp")) >= STEPS - 4, per_step(events, "all_reduce", ".tp")
        assert len(per_step(events, "all_gather_into_tensor", ".dp")) >= STEPS - 4
        assert len(per_step(events, "reduce_scatter_tensor", ".dp")) >= STEPS - 4
        assert last_mesh_coords(records[rank]) == {"dp": rank // 2, "tp": rank % 2}


def test_pipeline_parallel(kafka_broker, tmp_path):
    records, _ = run(kafka_broker.bootstrap, tmp_path, "pp")
    per_rank = {rank: comm_events(rs) for rank, rs in records.items()}
    assert_sequences_line_up(per_rank)
    for rank, events in per_rank.items():
        p2p = [e for e in events if ":p2p:" in e["group"] and e["step"] >= 0]
        peers = {e["ranks"] for e in p2p}
        expected = {(a, b) for a, b in ((rank - 1, rank), (rank, rank + 1), (rank + 1, rank), (rank, rank - 1))
                    if 0 <= a < 4 and 0 <= b < 4}
        assert peers == expected, peers  # activations forward, gradients backward, to both neighbours
        steps = Counter(e["step"] for e in p2p)
        assert len(steps) >= STEPS - 4 and min(steps.values()) >= 4, steps  # 4 micro-batches
        assert last_mesh_coords(records[rank]) == {"pp": rank}


def test_compiled_ddp_model(kafka_broker, tmp_path):
    records, reports = run(kafka_broker.bootstrap, tmp_path, "compile")
    per_rank = {rank: comm_events(rs) for rank, rs in records.items()}
    assert_sequences_line_up(per_rank)
    for rank, events in per_rank.items():
        assert reports[rank]["graph_breaks"] == 0, reports[rank]["break_reasons"]
        # DDP's bucket all-reduce (eager, through the comm hook) and the compiled loss average
        # (dist.all_reduce rewritten by Dynamo into a functional all_reduce): two per step
        all_reduces = per_step(events, "all_reduce")
        assert len(all_reduces) >= STEPS - 4 and min(all_reduces.values()) >= 2, all_reduces
        assert last_mesh_coords(records[rank]) == {}


def _gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


gpu = pytest.mark.skipif(_gpus() < 4, reason="NCCL variants need 4 GPUs (one per rank)")


@gpu
@pytest.mark.parametrize("mode", ["fsdp2", "tp", "pp", "compile"])
def test_nccl_variants(kafka_broker, tmp_path, mode):
    """The same trainings on NCCL, one GPU per rank: sequences line up, the style's per-step
    collectives arrive (CUDA-event or wait timed), the mesh coordinates too."""
    records, reports = run(kafka_broker.bootstrap, tmp_path, mode, device="cuda")
    per_rank = {rank: comm_events(rs) for rank, rs in records.items()}
    assert_sequences_line_up(per_rank)
    expected_op = {"fsdp2": "all_gather_into_tensor", "tp": "all_reduce", "pp": "isend", "compile": "all_reduce"}
    coords = {"fsdp2": lambda r: {"dp": r}, "tp": lambda r: {"dp": r // 2, "tp": r % 2},
              "pp": lambda r: {"pp": r}, "compile": lambda r: {}}
    for rank, events in per_rank.items():
        if mode == "pp" and rank == 3:
            assert per_step(events, "irecv"), "the last stage receives activations"
        else:
            assert len(per_step(events, expected_op[mode])) >= STEPS - 4, (rank, mode)
        assert last_mesh_coords(records[rank]) == coords[mode](rank)
        if mode == "compile":
            assert reports[rank]["graph_breaks"] == 0, reports[rank]["break_reasons"]


def test_mesh_coords_reach_the_store(tmp_path_factory):
    """TP x FSDP2 on the real stack (`perftracker up`: tansu, Faust worker, chDB sink): every
    rank's coordinates are stored with its windows (rank_windows.mesh_coords)."""
    import subprocess
    import sys
    import uuid

    from tests.integration.faults.harness import chdb_reader
    from tests.integration.stack.conftest import Stack, stack_env

    from .helpers import SCRIPTS

    data_dir = tmp_path_factory.mktemp("meshstore")
    stack = Stack(data_dir, stack_env(data_dir))
    stack.cli("up", timeout=180)
    job = f"mesh-{uuid.uuid4().hex[:6]}"
    try:
        env = {**stack.env, "TRAIN_MODE": "tp", "TRAIN_STEPS": str(STEPS), "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0"}
        cmd = [sys.executable, "-m", "perftracker_ml.deploy.cli", "launch", "--job", job, "--", sys.executable, "-m",
               "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(SCRIPTS / "train_parallel.py")]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        from tests.integration.waiting import wait_for

        def stored() -> list:  # the ranks' final batches close their windows at once
            from perftracker_ml.schemas.settings_loader import load_settings
            from perftracker_ml.sinks.client import query
            rows = query(load_settings(env=stack.env), "rank_health", job=job)
            return rows if len(rows) == 4 else []

        wait_for(stored, 120, 1.0, lambda: "no rank_health rows yet")
    finally:
        stack.cli("down", check=False)
    rows, = chdb_reader(data_dir / "chdb")([
        f"SELECT rank, toJSONString(argMax(mesh_coords, window_id)) FROM rank_windows FINAL WHERE job = '{job}'"
        " GROUP BY rank ORDER BY rank"])
    import json as _json
    assert [(int(r), _json.loads(m)) for r, m in rows] == [(r, {"dp": r // 2, "tp": r % 2}) for r in range(4)], rows
