"""A finished job ends its incidents, once, on the real stack (`perftracker up`: tansu, Faust
worker, chDB sink with a webhook to a real local HTTP receiver): 4 gloo DDP ranks under
`perftracker launch -- torchrun`, rank 3 stalls in plain Python near the end, long enough for
the hang to open an incident (hang floor lowered to 10 s); then it resumes, the job finishes
and every rank exits cleanly (its collector's final batch). Asserted: the store holds the
incident RESOLVED with reason "job finished", no incident of the job is left open, every
rank's last window is stored as ended cleanly and every step ran is stored, and the receiver
got the incident's resolution exactly once, keyed by the incident id."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.faults.harness import chdb_reader
from tests.integration.sinks.receiver import Receiver
from tests.integration.stack.conftest import Stack, stack_env
from tests.integration.waiting import wait_for

from .helpers import SCRIPTS

pytestmark = pytest.mark.e2e

RANKS, STEPS, STALL_RANK, STALL_STEP, STALL_S = 4, 80, 3, 70, 40.0


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("jobend")
    s = Stack(data_dir, stack_env(data_dir, PERFTRACKER_ALERTS_WEBHOOK_URL=receiver.url + "/hook",
                                  PERFTRACKER_DETECTION_HANG_FLOOR_S="10"))
    s.cli("up", timeout=180)
    try:
        yield s
    finally:
        s.cli("down", check=False)
        for log in sorted((data_dir / "logs").glob("*.log")):
            print(f"----- {log.name} (tail) -----\n{log.read_text(errors='replace')[-2000:]}")


def incidents(stack: Stack, job: str) -> list[dict]:
    from perftracker_ml.schemas.settings_loader import load_settings
    from perftracker_ml.sinks.client import query

    return query(load_settings(env=stack.env), "incidents", job=job, include_resolved=True)


def test_finished_job_resolves_its_open_incident_once_as_job_finished(stack: Stack, receiver: Receiver,
                                                                      tmp_path: Path):
    job = f"end-{uuid.uuid4().hex[:6]}"
    env = {**stack.env, "TRAIN_STEPS": str(STEPS), "TRAIN_HIDDEN": "64", "TRAIN_REPORT": "",
           "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0", "TRAIN_STALL_FILE": str(tmp_path / "stall"),
           "TRAIN_STALL": f"{STALL_RANK}:{STALL_STEP}:{STALL_S}"}
    cmd = [sys.executable, "-m", "perftracker_ml.deploy.cli", "launch", "--job", job, "--", sys.executable, "-m",
           "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}", str(SCRIPTS / "train_ddp.py")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    def resolved() -> list[dict]:
        rows = incidents(stack, job)
        return rows if rows and all(r["status"] == "RESOLVED" for r in rows) else []

    rows = wait_for(resolved, 180, 2.0, lambda: [(r["status"], r["cause"], r.get("resolved_reason"))
                                                for r in incidents(stack, job)])
    assert isinstance(rows, list)
    hangs = [r for r in rows if r["cause"] == "hang"]
    assert hangs, f"the stall opened no hang incident: {[(r['cause'], r['summary']) for r in rows]}"
    assert all(r["resolved_reason"] == "job finished" for r in hangs), rows
    assert {r["resolved_reason"] for r in rows} <= {"job finished", "cleared"}
    hang_id = hangs[0]["incident_id"]

    def resolutions() -> list[dict]:
        return [b for b in (r.json() for r in receiver.received) if b["dedup_key"] == hang_id
                and b["event"] == "resolve"]

    wait_for(resolutions, 60, 0.5, lambda: [(r.json()["event"], r.json()["dedup_key"]) for r in receiver.received])
    stack.cli("down")  # the sink stops: every alert it had queued is delivered or given up
    for_hang = [r.json() for r in receiver.received if r.json()["dedup_key"] == hang_id]
    assert [b["event"] for b in for_hang].count("open") == 1
    got = [b for b in for_hang if b["event"] == "resolve"]
    assert len(got) == 1, got
    assert got[0]["incident"]["incident_id"] == hang_id and got[0]["incident"]["resolved_reason"] == "job finished"
    assert all(r.headers.get("X-Perftracker-Dedup-Key") == r.json()["incident"]["incident_id"]
               for r in receiver.received)
    per_incident = [b["dedup_key"] for b in (r.json() for r in receiver.received) if b["event"] == "resolve"]
    assert len(per_incident) == len(set(per_incident)), "an incident was resolved twice"

    steps, ended = chdb_reader(stack.data_dir / "chdb")([  # the stack is down: read its store
        f"SELECT rank, count(DISTINCT step), min(step), max(step) FROM iterations FINAL WHERE job = '{job}'"
        " GROUP BY rank ORDER BY rank",
        f"SELECT rank, argMax(ended_cleanly, window_id) FROM rank_windows FINAL WHERE job = '{job}'"
        " GROUP BY rank ORDER BY rank"])
    assert [tuple(int(x) for x in r) for r in steps] == [(r, STEPS, 0, STEPS - 1) for r in range(RANKS)], steps
    assert [tuple(int(x) for x in r) for r in ended] == [(r, 1) for r in range(RANKS)], ended
