"""Two torchrun "nodes" (static rendezvous, no run id), one `perftracker launch` each.

Nothing names the run for both nodes, so each launcher proposes its own id and the
ranks agree on rank 0's through the job's c10d store: every rank of both nodes must
report under one job id, each with its own node's host name (PERFTRACKER_COLLECTOR_HOST,
as the downward API sets it in Kubernetes).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from .helpers import SCRIPTS, by_rank, read_records

pytestmark = pytest.mark.e2e

STEPS = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_launchers_make_one_job_with_each_nodes_host(kafka_broker, unique: str) -> None:
    from perftracker_ml.schemas.kafka_admin import ensure_topics
    from perftracker_ml.schemas.topics import TopicNames, all_topics

    prefix = f"nodes{unique}"
    ensure_topics({"bootstrap.servers": kafka_broker.bootstrap}, all_topics(prefix))
    port = free_port()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PERFTRACKER_", "TORCHELASTIC_", "SLURM_"))}
    base.update({"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap,
                 "PERFTRACKER_KAFKA_TOPIC_PREFIX": prefix, "TRAIN_STEPS": str(STEPS),
                 "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0"})
    launcher = shutil.which("perftracker", path=os.path.dirname(sys.executable))
    assert launcher, "the perftracker command is not installed next to this Python"
    nodes = []
    for node in (0, 1):
        env = {**base, "PERFTRACKER_COLLECTOR_HOST": f"node-{node}"}
        nodes.append(subprocess.Popen(
            [launcher, "launch", "--", sys.executable, "-m", "torch.distributed.run",
             "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=2",
             "--master-addr=127.0.0.1", f"--master-port={port}", str(SCRIPTS / "train_ddp.py")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    topic = TopicNames.for_prefix(prefix).events
    records = [r for r in read_all(kafka_broker.bootstrap, topic)]
    jobs = {r["job"] for r in records}
    assert len(jobs) == 1, f"ranks reported under several job ids: {jobs}"
    ranks = by_rank(records)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, rank_records in ranks.items():
        assert {r["host"] for r in rank_records} == {f"node-{rank // 2}"}
        assert {r["world_size"] for r in rank_records} == {4}
        steps = [s for r in rank_records for s in r["iterations"]["step"]]
        assert steps == list(range(STEPS)), f"rank {rank} lost iterations while the job id was agreed"


def read_all(bootstrap: str, topic: str, quiet_s: float = 3.0, limit_s: float = 40.0) -> list[dict]:
    """Every EventBatch on ``topic`` (any job), until nothing new for ``quiet_s``."""
    import time

    out: list[dict] = []
    last = time.monotonic()
    for record in read_records(bootstrap, topic, "", limit_s, "EventBatch", f"nodes-{topic}",
                               poll_s=0.5, any_job=True):
        if record is not None:
            out.append(record)
            last = time.monotonic()
        elif time.monotonic() - last >= quiet_s:
            break
    return out
